from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "gpufleet.ingest"
    label = "ingest"
