from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "gpufleet.jobs"
    label = "jobs"
