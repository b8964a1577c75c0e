from django.urls import path, re_path

from gpufleet.core.converters import NodeNameConverter
from gpufleet.fleet import views

app_name = "fleet"

_FORMAT = r"(?P<fmt>json|csv|md)"

urlpatterns = [
    path("", views.fleet, name="overview"),
    path("summary/", views.fleet, {"partial": "fleet-summary"}, name="summary"),
    re_path(rf"^report\.{_FORMAT}$", views.fleet_report, name="report"),
    path("nodes/<node:name>/", views.node_detail, name="node_detail"),
    path("nodes/<node:name>/findings/", views.node_detail, {"partial": "findings"}, name="node_findings"),
    re_path(rf"^nodes/(?P<name>{NodeNameConverter.regex})/report\.{_FORMAT}$", views.node_report, name="node_report"),
    path("nodes/<node:name>/maintenance/", views.set_maintenance, name="set_maintenance"),
    path("nodes/<node:name>/maintenance/end/", views.end_maintenance, name="end_maintenance"),
    path("nodes/<node:name>/validation/end/", views.end_validation, name="end_validation"),
    path("nodes/<node:name>/gpus/<int:index>/acknowledge-xid/", views.acknowledge_xid, name="acknowledge_xid"),
]
