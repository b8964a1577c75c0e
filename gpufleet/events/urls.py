from django.urls import path, re_path

from gpufleet.events import views

app_name = "events"

urlpatterns = [
    path("events/", views.events, name="list"),
    path("events/open-count", views.open_count, name="open_count"),
    re_path(r"^events/export\.(?P<fmt>csv|json)$", views.events_export, name="export"),
]
