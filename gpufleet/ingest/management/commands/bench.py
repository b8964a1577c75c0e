"""Measure ingest and page speed at fleet sizes, in a throwaway test database
(never the configured one), and print the figures the README quotes."""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, setup_test_environment

from gpufleet.ingest import simulation
from gpufleet.ingest.services import ingest_snapshot, ingest_snapshots

PAGES = [
    ("fleet overview", "/"),
    ("node table fragment", "/?page=2", {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "node-table"}),
    ("node page (8 GPUs)", "/nodes/bench-00007/"),
    ("claims list", "/claims/"),
    ("fleet report CSV", "/report.csv"),
    ("fleet report JSON", "/report.json"),
    ("API node list", "/api/nodes/"),
    # The peer: Django's own admin changelist of the same nodes, in the same run.
    ("admin node changelist", "/admin/fleet/node/"),
]


def _snapshot(node: str, gpus: int, at: datetime) -> dict:
    """A healthy node of `gpus` H200s as an agent reports it (see gpufleet.ingest.simulation),
    so the bench measures gpufleet, not subprocesses."""
    model = simulation.GpuModel("NVIDIA H200", 143771, gpus, 700)
    return simulation.snapshot(simulation.SimulatedNode(node, model, "", seed=len(node)), at)


class Command(BaseCommand):
    help = "Benchmark ingest and pages in a throwaway test database; prints figures for the README."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
        parser.add_argument("--gpus", type=int, default=8)
        parser.add_argument("--repeat", type=int, default=5, help="page requests per figure")

    def handle(self, *args, nodes, gpus, repeat, **options):
        setup_test_environment()
        settings.ALLOWED_HOSTS = ["testserver"]
        old_name = connection.settings_dict["NAME"]
        # Its own database name, so a bench never clobbers a test run's database.
        bench_name = "gpufleet_bench"
        if connection.vendor == "sqlite":
            bench_name = str(settings.DATA_DIR / "bench.sqlite3")
        connection.settings_dict["TEST"]["NAME"] = bench_name
        test_db = connection.creation.create_test_db(verbosity=0, autoclobber=True)
        try:
            engine = connection.vendor
            self.stdout.write(f"gpufleet bench on {engine} ({test_db}), {gpus} GPUs per node")
            self._statements_per_snapshot()
            client = self._client()
            done = 0
            for size in sorted(nodes):
                self._ingest(done, size, gpus)
                done = size
                self._pages(client, size, repeat)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    def _statements_per_snapshot(self) -> None:
        t0 = datetime.now(UTC) - timedelta(hours=1)
        counts = []
        for gpus in (1, 8, 64):
            name = f"stmt-{gpus}"
            ingest_snapshot(_snapshot(name, gpus, t0))
            with CaptureQueriesContext(connection) as ctx:
                ingest_snapshot(_snapshot(name, gpus, t0 + timedelta(seconds=1)))
            counts.append(f"{gpus} GPU(s): {len(ctx)}")
        self.stdout.write("SQL statements per snapshot (incl. BEGIN/COMMIT where counted): " + ", ".join(counts))

    def _ingest(self, start: int, stop: int, gpus: int) -> None:
        t0 = datetime.now(UTC) - timedelta(minutes=30)
        snapshots = [_snapshot(f"bench-{n:05d}", gpus, t0) for n in range(start, stop)]
        began = time.perf_counter()
        for snap in snapshots:
            ingest_snapshot(snap)
        first = time.perf_counter() - began
        again = [dict(s, collected_at=(t0 + timedelta(seconds=30)).isoformat()) for s in snapshots]
        began = time.perf_counter()
        for snap in again:
            ingest_snapshot(snap)
        second = time.perf_counter() - began
        batched = [dict(s, collected_at=(t0 + timedelta(seconds=60)).isoformat()) for s in snapshots]
        began = time.perf_counter()
        for i in range(0, len(batched), 100):
            ingest_snapshots(batched[i:i + 100])
        third = time.perf_counter() - began
        n = len(snapshots)
        self.stdout.write(
            f"ingest nodes {start}-{stop}: new node {n / first:,.0f} snapshots/s, "
            f"known node {n / second:,.0f} snapshots/s ({1000 * second / n:.1f} ms each), "
            f"known node in batches of 100 {n / third:,.0f} snapshots/s ({second / third:.1f}x)"
        )

    def _client(self) -> Client:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_superuser("bench", password="bench-pass-1")
        client = Client()
        client.force_login(user)
        return client

    def _pages(self, client: Client, size: int, repeat: int) -> None:
        for label, url, *extra in PAGES:
            headers = extra[0] if extra else {}
            times, queries, status, size_bytes = [], 0, 0, 0
            for _ in range(repeat):
                with CaptureQueriesContext(connection) as ctx:
                    began = time.perf_counter()
                    response = client.get(url, **headers)
                    body = b"".join(response) if response.streaming else response.content
                    times.append(time.perf_counter() - began)
                queries, status, size_bytes = len(ctx), response.status_code, len(body)
            self.stdout.write(
                f"  {size:>6} nodes  {label:<22} {1000 * statistics.median(times):7.1f} ms median  "
                f"{queries:3d} queries  HTTP {status}  {size_bytes / 1024:,.0f} KiB"
            )
