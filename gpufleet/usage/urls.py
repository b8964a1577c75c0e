from django.urls import path, re_path

from gpufleet.usage import views

app_name = "usage"

urlpatterns = [
    path("", views.usage, name="page"),
    re_path(r"^export\.(?P<fmt>csv|json)$", views.export, name="export"),
    path("node/<int:node_id>/month", views.node_month, name="node_month"),
    path("claim/<int:claim_id>/month", views.claim_month, name="claim_month"),
]
