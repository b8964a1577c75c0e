from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "gpufleet.audit"
    label = "audit"
