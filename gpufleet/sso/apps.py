from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "gpufleet.sso"
    label = "sso"
    verbose_name = "single sign-on"
