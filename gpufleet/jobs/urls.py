from django.urls import path

from gpufleet.jobs import views

app_name = "jobs"

urlpatterns = [
    path("nodes/<node:name>/diagnose/", views.node_diagnose, name="diagnose"),
    path("nodes/<node:name>/fix/<str:code>/", views.node_fix, name="fix"),
    path("nodes/<node:name>/dcgm-diag/<int:level>/", views.node_dcgm_diag, name="dcgm_diag"),
    path("jobs/<int:pk>/", views.job_status, name="status"),
]
