from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "gpufleet.usage"
    label = "usage"
