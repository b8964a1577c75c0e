"""`manage.py ingest`: one consumer of the agents' ingest stream (gpufleet/ingest/stream.py).
Run as many as the load needs, on one host or several: they share the group."""

from __future__ import annotations

import logging
import signal

from django.conf import settings
from django.core.management.base import BaseCommand

from gpufleet.core import broker
from gpufleet.ingest import stream

log = logging.getLogger("gpufleet.ingest.stream")


class Command(BaseCommand):
    help = "Store what agents send: consume the ingest stream until SIGTERM or SIGINT (the batch in hand finishes)."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None,
                            help="entries per batch (default GPUFLEET_INGEST_BATCH)")

    def handle(self, *args, batch=None, **options):
        consumer = stream.Consumer(broker.connect(settings.CELERY_BROKER_URL), batch=batch)
        signal.signal(signal.SIGTERM, consumer.stop)
        signal.signal(signal.SIGINT, consumer.stop)
        stream.tune_garbage_collector()
        # Tests and `up` wait for this line.
        log.info("ingest consumer %s on stream %s, group %s: ready.", consumer.name, consumer.stream, consumer.group)
        consumer.run()
        log.info("ingest consumer %s stopped", consumer.name)
