from django.urls import path

from gpufleet.teams import views

app_name = "teams"

# One team's page is the claims app's (gpufleet/claims/team_page.py), added beside these in
# gpufleet/urls.py under the same "teams" namespace.
urlpatterns = [
    path("", views.team_list, name="list"),
]
