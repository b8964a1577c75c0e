"""`manage.py ingest`: one consumer of the agents' ingest stream (gpufleet/ingest/stream.py).
Run as many as the load needs, on one host or several: they share the group."""

from __future__ import annotations

import logging
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpufleet.core import broker
from gpufleet.ingest import stream

log = logging.getLogger("gpufleet.ingest.stream")


class Command(BaseCommand):
    help = "Store what agents send: consume the ingest stream until SIGTERM or SIGINT (the batch in hand finishes)."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None,
                            help="entries per batch (default GPUFLEET_INGEST_BATCH)")
        parser.add_argument("--dead-letters", action="store_true",
                            help="list the entries that failed twice and were set aside, then exit")
        parser.add_argument("--replay-dead-letter", metavar="ID",
                            help="append dead letter ID's entry to the stream again (once its cause is fixed), then exit")

    def handle(self, *args, batch=None, dead_letters=False, replay_dead_letter=None, **options):
        client = broker.connect(settings.CELERY_BROKER_URL)
        if dead_letters:
            for letter, entry in stream.dead_letters(client):
                self.stdout.write(f"{letter}  node {entry['node']!r}  entry {entry['id']}  {entry['error']}")
            return
        if replay_dead_letter:
            node = stream.replay_dead_letter(client, replay_dead_letter)
            if node is None:
                raise CommandError(f"no dead letter {replay_dead_letter} (`manage.py ingest --dead-letters` lists them)")
            self.stdout.write(f"dead letter {replay_dead_letter} (node {node!r}) is back in the ingest stream")
            return
        consumer = stream.Consumer(client, batch=batch)
        signal.signal(signal.SIGTERM, consumer.stop)
        signal.signal(signal.SIGINT, consumer.stop)
        stream.tune_garbage_collector()
        # Tests and `up` wait for this line.
        log.info("ingest consumer %s on stream %s, group %s: ready.", consumer.name, consumer.stream, consumer.group)
        consumer.run()
        log.info("ingest consumer %s stopped", consumer.name)
