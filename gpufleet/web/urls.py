from django.urls import path, re_path

from gpufleet.web import views

app_name = "web"

_FORMAT = r"(?P<fmt>json|csv|md)"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("summary/", views.fleet, {"partial": "fleet-summary"}, name="fleet_summary"),
    re_path(rf"^report\.{_FORMAT}$", views.fleet_report, name="fleet_report"),
    path("nodes/<str:name>/", views.node_detail, name="node_detail"),
    path("nodes/<str:name>/findings/", views.node_detail, {"partial": "findings"}, name="node_findings"),
    path("nodes/<str:name>/diagnose/", views.node_diagnose, name="node_diagnose"),
    path("nodes/<str:name>/fix/<str:code>/", views.node_fix, name="node_fix"),
    re_path(rf"^nodes/(?P<name>[^/]+)/report\.{_FORMAT}$", views.node_report, name="node_report"),
    path("jobs/<int:pk>/", views.job_status, name="job_status"),
    path("audit/", views.audit, name="audit"),
]
