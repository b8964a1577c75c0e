"""`manage.py simulate --nodes N [--interval S] [--once]`: simulated agents that report
on the real ingest stream to the real ingest consumers, and ride out a broker outage as the
agents do; `--remove` deletes them (gpufleet/tools/simulation.py)."""

from __future__ import annotations

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

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
        try:
            simulation.simulate(nodes, interval, once=once, claims_percent=claims_percent, seed=seed, wait=wait,
                                say=self.stdout.write, warn=self.stderr.write)
        except simulation.NamesTaken as exc:
            raise CommandError(str(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # with --once only: a long run waits
            raise CommandError(f"cannot reach the broker: {exc}") from None
        except KeyboardInterrupt:
            self.stdout.write("stopped; `manage.py simulate --remove` deletes the simulated nodes")
