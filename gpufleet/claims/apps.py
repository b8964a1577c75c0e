from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "gpufleet.claims"
    label = "claims"
