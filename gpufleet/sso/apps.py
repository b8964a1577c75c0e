from django.apps import AppConfig


class SsoConfig(AppConfig):
    name = "gpufleet.sso"
    label = "sso"
    verbose_name = "single sign-on"

    def ready(self) -> None:
        # Its login receiver notes when each session's person is next due to be asked.
        from gpufleet.sso import recheck  # noqa: F401
