"""`manage.py simulate --nodes N [--interval S] [--once]`: simulated agents that report
on the real ingest stream to the real ingest consumers, and ride out a broker outage as the
agents do; `--remove` deletes them."""

from __future__ import annotations

import time

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from gpufleet import wire
from gpufleet.core import broker
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node
from gpufleet.tools import simulation


class Command(BaseCommand):
    help = (
        "Drive N simulated GPU nodes (mixed models, some warning, failing or offline, some claims) through "
        "the ingest stream and its consumers, for demos and benchmarks. --remove deletes every simulated node."
    )

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=100, help="how many nodes (default 100)")
        parser.add_argument(
            "--interval", type=float, default=settings.GPUFLEET_COLLECT_INTERVAL, help="seconds between rounds"
        )
        parser.add_argument("--once", action="store_true", help="send one snapshot per node, then exit")
        parser.add_argument("--claims-percent", type=int, default=30, help="nodes that get a claim (default 30)")
        parser.add_argument("--seed", type=int, default=0, help="the same seed makes the same fleet")
        parser.add_argument("--wait", type=float, default=120, help="seconds to wait for ingest before claiming")
        parser.add_argument("--remove", action="store_true", help="delete every simulated node and stop")

    def handle(self, *args, nodes, interval, once, claims_percent, seed, wait, remove, **options):
        if remove:
            self.stdout.write(f"removed {simulation.remove()} simulated node(s)")
            return
        if nodes < 1 or interval <= 0 or not 0 <= claims_percent <= 100:
            raise CommandError("--nodes must be at least 1, --interval above 0 and --claims-percent 0 to 100")
        fleet = simulation.simulated_fleet(nodes, seed)
        taken = simulation.register(fleet, timezone.now())
        if taken:
            raise CommandError(f"{len(taken)} real node(s) have simulated names, e.g. {taken[0]!r}: not simulating")
        # Simulated agents sign as real ones do, with keys of their own.
        keys = credentials.enroll_many([n.name for n in fleet])

        def send(snapshot: dict) -> None:
            name = snapshot["node"]
            if name in keys:  # a revoked one: its agent would have no key to sign with
                broker.append(wire.encode_entry(keys[name], name, wire.SNAPSHOT,
                                                [wire.encode_snapshot(snapshot), None]))

        try:
            simulation.run(
                fleet, send, interval, once=once, say=self.stdout.write,
                after_first_round=lambda sent: self._after_first_round(fleet, sent, claims_percent, seed, wait),
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # with --once only: a long run waits
            raise CommandError(f"cannot reach the broker: {exc}") from None
        except KeyboardInterrupt:
            self.stdout.write("stopped; `manage.py simulate --remove` deletes the simulated nodes")

    def _after_first_round(self, fleet, sent: int, claims_percent: int, seed: int, wait: float) -> None:
        """Claims need stored nodes: wait for the ingest consumers to store the first round."""
        deadline = time.monotonic() + wait
        names = [n.name for n in fleet]
        while (stored := Node.objects.filter(name__in=names, collected_at__isnull=False).count()) < sent:
            if time.monotonic() > deadline:
                self.stderr.write(
                    f"only {stored} of {sent} snapshots stored after {wait:.0f} s: is `manage.py ingest` running?"
                )
                break
            time.sleep(0.5)
        made = simulation.add_claims(fleet, claims_percent, seed)
        offline = simulation.mark_offline(fleet)
        self.stdout.write(f"{stored} node(s) stored, {made} claim(s) made, {offline} node(s) silent from now on")
