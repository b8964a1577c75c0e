from django.urls import path

from gpufleet.api import views

app_name = "api"

urlpatterns = [
    path("nodes/", views.nodes, name="nodes"),
    path("nodes/<str:name>/", views.node, name="node"),
    path("nodes/<str:name>/devices/", views.node_devices, name="node_devices"),
    path("nodes/<str:name>/findings/", views.node_findings, name="node_findings"),
    path("nodes/<str:name>/claims/", views.node_claims, name="node_claims"),
    path("claims/", views.claims, name="claims"),
    path("claims/<int:pk>/", views.claim, name="claim"),
]
