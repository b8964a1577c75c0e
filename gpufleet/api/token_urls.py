from django.urls import path

from gpufleet.api import pages

app_name = "tokens"

urlpatterns = [
    path("", pages.tokens, name="list"),
    path("<int:pk>/revoke/", pages.revoke, name="revoke"),
    path("calendar/<int:pk>/revoke/", pages.revoke_feed, name="revoke_feed"),
    path("calendar/<int:pk>/reissue/", pages.reissue_feed, name="reissue_feed"),
]
