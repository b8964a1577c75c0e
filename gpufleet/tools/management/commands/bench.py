"""`manage.py bench`: the fleet-scale figures, each beside a peer or a floor, in a throwaway
test database (gpufleet/tools/bench.py says what it measures and how)."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from gpufleet import wire
from gpufleet.tools.bench import Bench


class Command(BaseCommand):
    help = "Benchmark ingest, pages and /metrics against their peers in a throwaway test database."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=1000, help="fleet size for the pages and /metrics")
        parser.add_argument("--ingest", type=int, default=500, help="snapshots per ingest figure")
        parser.add_argument("--gpus", type=int, default=8, choices=range(1, wire.GPUS_PER_NODE_MAX + 1),
                            metavar=f"1..{wire.GPUS_PER_NODE_MAX}", help="GPUs per node (at most what a node may report)")
        parser.add_argument("--repeat", type=int, default=5, help="requests per page figure (median)")
        parser.add_argument("--flood", type=int, default=100_000,
                            help="entries of one node's flood ahead of another node's snapshot on the ingest stream")
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        parser.add_argument("--host-commands", metavar="DIR",
                            help="a folder put first on PATH for the agent's figures: the host commands it runs "
                                 "(the test suite's fake host, tests/fakes/bin, on a machine without a GPU)")

    def handle(self, *args, nodes, ingest, gpus, repeat, flood, **options):
        if folder := options["host_commands"]:
            if not Path(folder).is_dir():
                raise CommandError(f"--host-commands {folder}: no such folder")
            os.environ["PATH"] = os.pathsep.join([str(Path(folder).resolve()), *os.get_exec_path()])
        Bench(self.stdout, self.stderr).run(nodes=nodes, ingest=ingest, gpus=gpus, repeat=repeat,
                                            as_json=options["json"], flood=max(1, flood))
