"""`manage.py clearmetrics`: empty the folder where the site's processes keep their
prometheus-client counters (PROMETHEUS_MULTIPROC_DIR, gpufleet/ingest/metrics.py).

The scrape sums the files of every process that ever wrote there, so prometheus-client
wants the folder emptied between runs: otherwise each start of a process leaves files
that are read at every scrape for ever, and a metric since renamed or removed is still
served. Run once per start of the site, before any of its processes starts and never
while one runs (its counts would vanish mid-run): `up` does it before starting its
children, the deploy's gpufleet-metrics unit before the central units."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Empty the prometheus-client metrics folder; only at the site's start, before its processes run."

    def handle(self, *args, **options):
        folder = settings.GPUFLEET_METRICS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        # prometheus-client's files only: <type>_<pid>.db.
        for path in folder.glob("*.db"):
            path.unlink(missing_ok=True)
