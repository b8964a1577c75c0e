"""The central site's Celery app (beat, housekeeping, and what it sends the agents);
the agents run their own (gpufleet/agent/app.py)."""

import os

from celery import Celery

from gpufleet.celery_common import INFLATED_MAX_BYTES, MessageTooLarge, bound_decompression, set_up

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpufleet.settings")

__all__ = ["INFLATED_MAX_BYTES", "MessageTooLarge", "app", "bound_decompression"]

set_up()

app = Celery("gpufleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["gpufleet.agent", "gpufleet.alerts", "gpufleet.claims", "gpufleet.events", "gpufleet.fleet", "gpufleet.jobs",
                        "gpufleet.sso", "gpufleet.usage"])
