from django.urls import path

from gpufleet.teams import views

app_name = "teams"

urlpatterns = [
    path("", views.team_list, name="list"),
    path("<str:name>/", views.team_detail, name="detail"),
]
