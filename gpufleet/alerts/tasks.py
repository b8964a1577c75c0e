"""The alerts job of the central beat, on the housekeeping queue (never ingest's)."""

from __future__ import annotations

from celery import shared_task

from gpufleet.alerts import services


@shared_task(name="gpufleet.alerts.tasks.send_alerts", ignore_result=True)
def send_alerts() -> int:
    """Every GPUFLEET_ALERT_TICK_S: plan what is due and send it (services.run_once)."""
    return services.run_once().sent
