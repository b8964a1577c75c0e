from django.urls import path, re_path

from gpufleet.claims import views

app_name = "claims"

urlpatterns = [
    path("", views.claim_list, name="list"),
    path("find/", views.find, name="find"),
    path("availability/", views.fleet_availability, name="availability"),
    path("slots/", views.find_slot, name="slots"),
    path("use/", views.claims_vs_use, name="use"),
    re_path(r"^use\.(?P<fmt>csv|json)$", views.claims_vs_use_export, name="use_export"),
    path("nodes/<node:name>/panel/", views.panel, name="panel"),
    path("nodes/<node:name>/calendar/", views.calendar, name="calendar"),
    path("nodes/<node:name>/new/", views.add, name="add"),
    path("nodes/<node:name>/validate/", views.validate_new, name="validate_new"),
    path("<int:pk>/edit/", views.edit, name="edit"),
    path("<int:pk>/validate/", views.validate, name="validate"),
    path("<int:pk>/delete/", views.delete, name="delete"),
]
