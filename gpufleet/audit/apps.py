from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "gpufleet.audit"
    label = "audit"

    def ready(self):
        from gpufleet.audit import receivers  # noqa: F401  (connects them)
