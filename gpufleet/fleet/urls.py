from django.urls import path, re_path

from gpufleet.fleet import views

app_name = "fleet"

_FORMAT = r"(?P<fmt>json|csv|md)"

urlpatterns = [
    path("", views.fleet, name="overview"),
    path("summary/", views.fleet, {"partial": "fleet-summary"}, name="summary"),
    re_path(rf"^report\.{_FORMAT}$", views.fleet_report, name="report"),
    path("nodes/<str:name>/", views.node_detail, name="node_detail"),
    path("nodes/<str:name>/findings/", views.node_detail, {"partial": "findings"}, name="node_findings"),
    re_path(rf"^nodes/(?P<name>[^/]+)/report\.{_FORMAT}$", views.node_report, name="node_report"),
    path("nodes/<str:name>/gpus/<int:index>/acknowledge-xid/", views.acknowledge_xid, name="acknowledge_xid"),
]
