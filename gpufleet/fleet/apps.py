from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "gpufleet.fleet"
    label = "fleet"
