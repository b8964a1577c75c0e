from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "gpufleet.events"
    label = "events"
