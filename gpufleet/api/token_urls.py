from django.urls import path

from gpufleet.api import pages

app_name = "tokens"

urlpatterns = [
    path("", pages.tokens, name="list"),
    path("<int:pk>/revoke/", pages.revoke, name="revoke"),
]
