from django.urls import path

from gpufleet.sso import views

app_name = "sso"

urlpatterns = [
    path("no-access/", views.no_access, name="no-access"),
    path("no-access/try-again", views.try_again, name="try-again"),
]
