from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "gpufleet.alerts"
    label = "alerts"

    def ready(self) -> None:
        from gpufleet.alerts import channels

        # apprise and the HTTP libraries under it log the URLs they reach: secrets.
        channels.guard_logs()
        channels.guard_destinations()
