from django.urls import path

from gpufleet.audit import views

app_name = "audit"

urlpatterns = [
    path("audit/", views.audit, name="log"),
]
