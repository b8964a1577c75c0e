from django.apps import AppConfig


class TeamsConfig(AppConfig):
    name = "gpufleet.teams"
    label = "teams"
