"""Django's admin app with gpufleet's site (gpufleet/core/admin_site.py). Its own module,
importing nothing but the app config, because Django loads it before any model exists."""

from django.contrib.admin.apps import AdminConfig


class FleetAdminConfig(AdminConfig):
    """In INSTALLED_APPS in place of django.contrib.admin, so `admin.site` is ours."""

    default_site = "gpufleet.core.admin_site.FleetAdminSite"
