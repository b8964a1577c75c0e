"""Django's admin site as gpufleet opens it: to staff, as usual, and to the admin role
(`can_open_admin`), whose powers there gpufleet/core/admin.py limits. Logging in happens
on the site's one login page, where the login throttle's message is shown."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from gpufleet.core.access import can_open_admin


class FleetAdminSite(admin.AdminSite):
    site_header = "gpufleet administration"
    site_title = "gpufleet admin"

    def has_permission(self, request) -> bool:
        return can_open_admin(request.user)

    def login(self, request, extra_context=None):
        if request.user.is_authenticated:
            # Logged in, but neither staff nor admin role: our 403 page, not a second login form.
            raise PermissionDenied("only the admin role opens the admin site")
        return redirect_to_login(request.GET.get("next") or reverse("admin:index", current_app=self.name))

