from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "gpufleet.api"
    label = "api"
