"""The Celery app shared by the central site (ingest worker, beat) and the node agents."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpufleet.settings")

app = Celery("gpufleet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["gpufleet.agent", "gpufleet.fleet", "gpufleet.jobs", "gpufleet.ingest"])
