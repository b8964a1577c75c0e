"""Measure the figures of the fleet-scale targets, each beside a peer or a floor
measured in the same run, in a throwaway test database (never the configured one):

- ingest through the real path (snapshots appended to the Redis ingest stream and
  stored by real `manage.py ingest` consumers, as launch.ingest starts them, from
  the backlog they wait in) with one consumer, with SERVICE_CONSUMERS and with
  SCALED_CONSUMERS sharing the group, and with one consumer again for a busy fleet
  (every GPU's figures, and so its findings, new in each snapshot, where the
  others repeat the last snapshot's), in-process one at a time and in batches, beside the
  floor: the same rows, built by ingest's own row code and written with COPY and set-based
  INSERT ... ON CONFLICT, without ingest's checks (gpufleet/tools/floors.py; PostgreSQL
  only); and from the service's rate, how many
  nodes one central host keeps up with at the collect interval;
- the pages, the node page with 24 h of history, and /metrics, beside Django's own
  admin changelist of the same nodes;
- the fleet exports (CSV, JSON, Markdown) beside PostgreSQL's own COPY ... TO STDOUT WITH
  CSV of the same rows; one shard of /metrics, as Prometheus scrapes a sharded fleet
  (gpufleet/tools/bench_metrics.py); the roll-up's cost and the bytes kept per GPU and bucket
  of the history (gpufleet/tools/bench_history.py), with the list pages' content made by
  gpufleet/tools/bench_lists.py;
- the Usage page over a month of the fleet's hourly usage rows beside a plain SQL GROUP BY
  of the same rows, and the usage roll-up of an hour beside the history's
  (gpufleet/tools/bench_usage.py);
- the agent as a GPU host runs it (launch.agent_worker, against a redis-server of the
  bench's own, collecting every second with this host's commands): the resident memory of
  its process tree (the commands it runs included) and its CPU per collection, beside the
  CPU of the bare commands of a collection run alone;
- a flood of one node's entries ahead of another node's snapshot on the ingest stream, the
  delay to that snapshot beside the collect interval and beside the same entries only read
  and acknowledged (gpufleet/tools/bench_flood.py).

`--json` prints one JSON object (figures named with their unit, null where one was
skipped, with the reason under "skipped"); otherwise a table. Progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from django.conf import settings
from django.db import DatabaseError, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings, setup_test_environment
from kombu.utils.url import maybe_sanitize_url

from gpufleet import wire
from gpufleet.agent.host import diagnose_this_host
from gpufleet.core import broker, launch
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import Device, Finding, Node
from gpufleet.ingest.services import ingest_snapshot, ingest_snapshots
from gpufleet.tools import bench_flood, bench_history, bench_lists, bench_metrics, bench_usage, footprint, simulation
from gpufleet.tools.backfill import add_history
from gpufleet.tools.floors import CopyFloor, report_csv_copy
from gpufleet.tools.workers import START_TIMEOUT_S, WorkerDidNotStart, database_url, running_worker

PREFIX = "bench-"
BATCH = 100  # snapshots per ingest_snapshots call and per floor transaction
# Snapshots of each node the real path stores: enough entries that the consumers run
# for seconds, not for the few batches of one round.
REAL_PATH_ROUNDS = 4
# Pairs of rounds (events on, events off) at least: one round is under a second, and
# the difference measured is a tenth of it.
EVENT_PAIRS = 8
# The real-path ingest uses a Redis database of its own on the configured server, so
# the bench's consumers never take the site's snapshots, nor the site's consumers the bench's;
# and a stream name of its own, as the append function it loads is the server's, not a
# database's: the site's (of GPUFLEET_INGEST_STREAM) stays as the site loaded it. The
# name is this run's own, so two benches on one server (a test run's beside an
# operator's) never delete each other's stream or function.
BENCH_REDIS_DB = 15
BENCH_STREAM = f"gpufleet-bench-{os.getpid()}:ingest"
# The consumers sharing the group in the second real-path figure (one a core of the
# 2-core host the figures were first taken on).
SERVICE_CONSUMERS = 2
# And more consumers than that, as more hosts would run (docs/scaling.md): on one host,
# whether the group's rate still grows past the cores or the database holds it.
SCALED_CONSUMERS = 4
# Collections the agent's figures are taken over, after its first one (imports, a first
# look at the host) is done.
AGENT_CYCLES = 5
AGENT_FIGURES = ("agent_rss_mib", "agent_cpu_per_cycle_s", "bare_commands_cpu_per_cycle_s",
                 "ratio_agent_cpu_to_bare_commands")
# A peer the bench always measures: Django's admin changelist of the same nodes.
ADMIN = "admin_changelist"
# (key, label, url, headers); "{node}" is a node without history, "{history}" the one with 24 h.
PAGES = [
    ("overview", "fleet overview", "/", {}),
    ("node_table_fragment", "node table fragment", "/?page=2", {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "node-table"}),
    ("node_page", "node page (8 GPUs, little history)", "/nodes/{node}/", {}),
    ("node_page_24h", "node page, 24 h of history", "/nodes/{history}/?range=24h", {}),
    ("overview_search_name", "overview, search by node name", "/?q={node}", {}),
    ("overview_search_gpu", "overview, search by GPU model", "/?q=H200", {}),
    ("overview_health_ok", "overview, health ok", "/?health=ok", {}),
    ("overview_health_warn", "overview, health warn", "/?health=warn", {}),
    ("overview_health_fail", "overview, health fail", "/?health=fail", {}),
    ("overview_health_offline", "overview, health offline", "/?health=offline", {}),
    ("overview_problems", "overview, problems", "/?health=problems", {}),
    ("overview_attach_cdi", "overview, attach CDI", "/?attach=cdi", {}),
    ("overview_attach_legacy", "overview, attach nvidia runtime", "/?attach=legacy", {}),
    ("overview_driver", "overview, one driver version", "/?driver={driver}", {}),
    ("overview_offline_yes", "overview, offline only", "/?offline=yes", {}),
    ("overview_offline_no", "overview, online only", "/?offline=no", {}),
    ("claims_list", "claims list", "/claims/", {}),
    ("claims_search", "claims list, search", "/claims/?q={node}", {}),
    ("claims_use", "claims vs use", "/claims/use/", {}),
    ("free_gpus", "Free GPUs (per model, each hour of 14 days)", "/claims/availability/", {}),
    ("find_slot", "find a slot (2 GPUs for 4 h)", "/claims/slots/?count=2&duration_hours=4", {}),
    ("free_gpus_computed", "Free GPUs, computed (not kept)", "/claims/availability/", {}),
    ("find_slot_computed", "find a slot, computed (not kept)", "/claims/slots/?count=2&duration_hours=4", {}),
    ("node_calendar", "node calendar (14 days, bookings ahead)", "/claims/nodes/{node}/calendar/", {"HTTP_HX_REQUEST": "true"}),
    ("events_list", "events list", "/events/", {}),
    ("audit_log", "audit log", "/audit/", {}),
    ("api_nodes", "API node list", "/api/nodes/", {}),
    ("api_claims", "API claim list", "/api/claims/", {}),
    ("api_events", "API event list", "/api/events/", {}),
    (ADMIN, "admin node changelist (peer)", "/admin/fleet/node/", {}),
]
# Timed with GPUFLEET_AVAILABILITY_MAX_AGE_S at 0: what a view pays when the kept answer
# has gone (its max age passed, a claim saved). Shown beside the others, not among the pages' target.
COMPUTED = ("free_gpus_computed", "find_slot_computed")
# The fleet exports, each timed once between two runs of the COPY floor (at fleet size
# one takes minutes; the floor's speed drifts over that long).
EXPORTS = [("report_csv", "fleet report CSV", "/report.csv"), ("report_json", "fleet report JSON", "/report.json"),
           ("report_md", "fleet report Markdown", "/report.md")]


def _snapshot(node: str, gpus: int, at: datetime, tick: int = 0) -> dict:
    """A healthy node of `gpus` H200s as an agent reports it (see gpufleet.tools.simulation),
    so the bench measures gpufleet, not subprocesses; `tick` varies its figures."""
    model = simulation.GpuModel("NVIDIA H200", 143771, gpus, 700)
    return simulation.snapshot(simulation.SimulatedNode(node, model, "", seed=len(node)), at, tick)


def _at(snapshots: list[dict], at: datetime) -> list[dict]:
    return [dict(s, collected_at=at.isoformat()) for s in snapshots]


def _timed(rounds: list[list[dict]], at: datetime) -> list[list[dict]]:
    """Each round's snapshots taken a second after the last round's, the first at `at`."""
    return [_at(each, at + timedelta(seconds=r)) for r, each in enumerate(rounds)]


def _busy_rounds(snapshots: list[dict]) -> list[list[dict]]:
    """REAL_PATH_ROUNDS of `snapshots` as a busy fleet reports them: every GPU's figures
    new in each round, and so its memory finding ("… GiB in use (…%)"), which ingest
    then writes again; each round's snapshots are re-timed by `_at`."""
    gpus = len(snapshots[0]["devices"])
    return [[_snapshot(s["node"], gpus, datetime.fromisoformat(s["collected_at"]), tick=r + 1) for s in snapshots]
            for r in range(REAL_PATH_ROUNDS)]


def _troubled(snapshot: dict, step: int, position: int, failing: bool) -> dict:
    """`snapshot` with a warning whose words change each `step`, and on every fourth node
    (by `position`) a failure while `failing`."""
    findings = [*snapshot["findings"], {"code": "gpu0.thermal", "name": "GPU 0", "status": "warn",
                                        "message": f"Running hot at {80 + step % 10} °C"}]
    if position % 4 == 0 and failing:
        findings.append({"code": "gpu1.xid", "name": "GPU 1", "status": "fail", "message": "Xid 79 (fell off the bus)"})
    return dict(snapshot, findings=findings)


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def _rounded(rate):
    return None if rate is None else round(rate, 1)


def _median(rates: list):
    return None if not rates or None in rates else round(statistics.median(rates), 1)


def _mean(a, b):
    return None if a is None or b is None else (a + b) / 2


class Bench:
    """One run of the bench: figures to `stdout` (a table, or JSON `as_json`), progress to `stderr`
    (each has `write(text)`, as a management command's output wrappers do)."""

    def __init__(self, stdout, stderr):
        self.stdout, self.stderr = stdout, stderr

    def run(self, *, nodes: int, ingest: int, gpus: int, repeat: int, as_json: bool, flood: int = 100_000) -> None:
        setup_test_environment()
        settings.ALLOWED_HOSTS = ["testserver"]
        nodes, repeat = max(1, nodes), max(1, repeat)
        ingest = max(1, min(ingest, nodes))
        self.figures: dict = {"nodes": nodes, "gpus_per_node": gpus, "engine": connection.vendor,
                              "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
                              "ingest_sample": ingest, "repeat": repeat, "flood_size": flood}
        self.skipped: dict[str, str] = {}
        old_name = connection.settings_dict["NAME"]
        # A database of this run's own, so a bench never clobbers a test run's or another bench's.
        bench_name = f"gpufleet_bench_{os.getpid()}"
        if connection.vendor == "sqlite":
            bench_name = str(settings.DATA_DIR / f"{bench_name}.sqlite3")
        connection.settings_dict["TEST"]["NAME"] = bench_name
        self._say(f"creating the throwaway database {bench_name} ...")
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            self._statements_per_snapshot()
            names = [f"{PREFIX}{n:05d}" for n in range(nodes)]
            base = datetime.now(UTC) - timedelta(minutes=30)
            snapshots = [_snapshot(name, gpus, base) for name in names[:ingest]]
            self._ingest_in_process(snapshots, base)
            self._ingest_beside_the_floor(snapshots, base + timedelta(seconds=70), repeat)
            self._ingest_with_and_without_events(snapshots, repeat)
            self._fleet_one_host_keeps_up_with()
            self._grow_fleet(names, ingest)
            # What the pages are timed with, bookings ahead among it.
            self.figures["list_content"] = bench_lists.populate_lists(
                list(Node.objects.order_by("name").values_list("id", flat=True)), self._say)
            self._say(f"writing 24 h of history for {names[0]} ...")
            add_history(list(Node.objects.get(name=names[0]).current_devices()), datetime.now(UTC), hours=24)
            if connection.vendor == "postgresql":
                # Planner statistics, as autovacuum keeps them on a running site: without
                # them the bulk-made tables are planned as empty ones.
                with connection.cursor() as cursor:
                    cursor.execute("ANALYZE")
            if reason := bench_history.measure_history(self.figures, self._say):
                for key in bench_history.FIGURES:
                    self._skip(key, reason)
            client = self._client()
            self._pages(client, repeat, node=names[min(7, nodes - 1)], history=names[0])
            bench_metrics.measure_metrics_shard(client, self.figures, repeat)
            self._metrics(client)
            self._exports(client)
            if reason := bench_usage.measure_usage(client, self.figures, self._say, repeat):
                for key in bench_usage.FIGURES:
                    self._skip(key, reason)
            self._agent_footprint()
            self._flood(flood)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
        self.figures["skipped"] = self.skipped
        self.figures["targets"] = self._targets()
        if as_json:
            self.stdout.write(json.dumps(self.figures, indent=2))
        else:
            self._table()

    def _say(self, text: str) -> None:
        self.stderr.write(text)

    def _skip(self, key: str, reason: str) -> None:
        self.figures[key] = None
        self.skipped[key] = reason
        self._say(f"{key} skipped: {reason}")

    # --- Ingest ------------------------------------------------------------------

    def _statements_per_snapshot(self) -> None:
        t0 = datetime.now(UTC) - timedelta(hours=1)
        counts = {}
        for gpus in (1, 8, wire.GPUS_PER_NODE_MAX):
            name = f"stmt-{gpus}"
            ingest_snapshot(_snapshot(name, gpus, t0))
            with CaptureQueriesContext(connection) as ctx:
                ingest_snapshot(_snapshot(name, gpus, t0 + timedelta(seconds=1)))
            counts[str(gpus)] = len(ctx)
        Node.objects.filter(name__startswith="stmt-").delete()
        self.figures["sql_statements_per_snapshot"] = counts

    def _ingest_in_process(self, snapshots: list[dict], base: datetime) -> None:
        n = len(snapshots)
        self._say(f"ingesting {n} snapshots in process ...")
        began = time.perf_counter()
        for snap in snapshots:
            ingest_snapshot(snap)
        self.figures["ingest_new_node_per_s"] = round(n / (time.perf_counter() - began), 1)
        began = time.perf_counter()
        for snap in _at(snapshots, base + timedelta(seconds=30)):
            ingest_snapshot(snap)
        self.figures["ingest_one_per_s"] = round(n / (time.perf_counter() - began), 1)
        batched = _at(snapshots, base + timedelta(seconds=60))
        began = time.perf_counter()
        for i in range(0, n, BATCH):
            ingest_snapshots(batched[i:i + BATCH])
        self.figures["ingest_batch_per_s"] = round(n / (time.perf_counter() - began), 1)

    def _vacuum(self) -> None:
        """Each figure that rewrites the nodes' rows starts from the same tables: the dead
        rows the one before left vacuumed away, as autovacuum does on a running site, so
        that one measured later does not pay for one measured earlier (the second real
        path measured about a fifth slower than the same worker measured first). And from
        a quiet server: a checkpoint now, rather than one that the WAL of what came before
        (an earlier bench's fleet and history, dropped) sets off during the figure."""
        if connection.vendor != "postgresql":
            return
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE fleet_node, fleet_device, fleet_finding")
            try:
                cursor.execute("CHECKPOINT")
            except DatabaseError as exc:  # it takes a superuser or pg_checkpoint
                self._say(f"no checkpoint before the figure ({exc}); it may pay for an earlier one's writes")

    def _ingest_real_path(self, rounds: list[list[dict]], at: datetime, key: str, consumers: int) -> float | None:
        """Known nodes' snapshots, REAL_PATH_ROUNDS `rounds` of them (re-timed a second
        apart from `at`), appended to the ingest stream as the agents append them and
        stored by `consumers` real `manage.py ingest` processes, already started: from the
        append (one pipelined round trip; the entries are signed before) until every one
        is handled and each node's last one stored. Returns the rate, or None
        with the reason (under `key`) where it was skipped."""
        bench = _bench_broker(settings.CELERY_BROKER_URL)
        if bench is None:
            return self._skip(key, f"the broker {maybe_sanitize_url(settings.CELERY_BROKER_URL)} is not Redis")
        url, client = bench
        stream_key = broker.ingest_key(BENCH_STREAM)
        try:
            waiting = client.xlen(stream_key)
        except Exception as exc:  # any failure to reach Redis skips the figure, saying why
            client.close()
            return self._skip(key, f"no Redis reachable at {maybe_sanitize_url(url)} ({exc})")
        if waiting:
            client.close()
            return self._skip(key, f"the stream {BENCH_STREAM!r} in {maybe_sanitize_url(url)} already holds {waiting} "
                                   "entries that are not this run's; not consuming them")
        broker_users.prepare(client, BENCH_STREAM)  # as the consumers do when they start
        snapshots = rounds[0]
        last = at + timedelta(seconds=REAL_PATH_ROUNDS - 1)
        entries = self._entries(_timed(rounds, at))
        names = [s["node"] for s in snapshots]
        metrics_dir = tempfile.mkdtemp(prefix="gpufleet-bench-metrics-")
        env = {"CELERY_BROKER_URL": url, "DATABASE_URL": database_url(connection.settings_dict),
               "PROMETHEUS_MULTIPROC_DIR": metrics_dir, "GPUFLEET_DATA_DIR": str(settings.DATA_DIR),
               "GPUFLEET_INGEST_STREAM": BENCH_STREAM,
               # Each node's REAL_PATH_ROUNDS snapshots come within one interval.
               "GPUFLEET_INGEST_CAP_PER_INTERVAL": str(max(REAL_PATH_ROUNDS, settings.GPUFLEET_INGEST_CAP_PER_INTERVAL))}
        if not os.environ.get("GPUFLEET_SIGNING_KEY"):
            env["SECRET_KEY"] = settings.SECRET_KEY  # the consumers check signatures with the same key
        self._say(f"starting {consumers} ingest consumer(s), then appending {len(entries)} snapshots to "
                  f"{maybe_sanitize_url(url)} for them to store ...")
        try:
            stored = Node.objects.filter(name__in=names, collected_at__gte=last)
            with contextlib.ExitStack() as stack:
                # All of them ready before the first entry: one started first would otherwise
                # store much of the backlog while the next one still starts. Started side by
                # side: one after another, four consumers' starts took longer than their figure.
                with ThreadPoolExecutor(consumers) as starting:
                    started = list(starting.map(
                        lambda i: stack.enter_context(running_worker(launch.ingest(), env, f"ingest-{i}")),
                        range(consumers)))
                function = broker.append_function(BENCH_STREAM)
                began = time.perf_counter()
                with client.pipeline(transaction=False) as pipe:
                    for fields in entries:  # as broker.append appends, to the bench's stream
                        pipe.fcall(function, 0, *(fields[name] for name in broker.ENTRY_ORDER))
                    pipe.execute()
                deadline = time.monotonic() + max(60.0, len(entries) / 5)
                done = 0
                while done < len(snapshots):
                    if dead := [c for c in started if not c.alive()]:
                        return self._skip(key, f"a consumer exited:\n{dead[0].output}")
                    if time.monotonic() > deadline:
                        return self._skip(key, f"only {done} of {len(snapshots)} nodes' last snapshots stored in "
                                               f"time:\n{started[0].output}")
                    time.sleep(0.02)
                    # Every entry handled (the consumers delete what they acknowledge), not only
                    # each node's last: two consumers may store a node's newer snapshot before
                    # its older ones, which are then stale and cheaper, but still read.
                    done = stored.count() if client.xlen(stream_key) == 0 else 0
                elapsed = time.perf_counter() - began
        except WorkerDidNotStart as exc:
            return self._skip(key, str(exc))
        finally:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            # What this run appended and its consumers did not store (all of it where the
            # figure was skipped): the stream of the bench's own database was empty
            # before, so these are this run's, not anyone's snapshots. And the nodes'
            # admissions, which the next run's would otherwise count against its cap.
            admitted = list(client.scan_iter(match=f"{stream_key}:admitted:*", count=1000))
            client.delete(stream_key, broker.deleted_key(stream_key), *admitted)
            client.function_delete(broker.append_function(BENCH_STREAM))
            client.close()
        return len(entries) / elapsed

    def _fleet_one_host_keeps_up_with(self) -> None:
        """The nodes whose snapshots the ingest service stores as fast as they come, at the
        collect interval, with the faster of its SERVICE_CONSUMERS and SCALED_CONSUMERS
        consumers: where one central host like this one stops keeping up."""
        rates = [self.figures[key] for key in ("ingest_service_snapshots_per_s", "ingest_scaled_snapshots_per_s")]
        rate = None if None in rates else max(rates)
        interval = settings.GPUFLEET_COLLECT_INTERVAL
        self.figures["collect_interval_s"] = interval
        self.figures["fleet_nodes_one_host_keeps_up_with"] = None if rate is None else round(rate * interval, -2)

    def _entries(self, rounds: list[list[dict]]) -> list[dict[bytes, bytes]]:
        """The stream entry of each snapshot of each round, signed with its node's key as
        its agent signs it."""
        keys = credentials.enroll_many(sorted({s["node"] for snapshots in rounds for s in snapshots}))
        return [wire.encode_entry(keys[snap["node"]], snap["node"], wire.SNAPSHOT, [wire.encode_snapshot(snap), None])
                for snapshots in rounds for snap in snapshots]

    def _ingest_copy_floor(self, snapshots: list[dict], at: datetime) -> float | None:
        """The rows of the real path's snapshots, REAL_PATH_ROUNDS of each node as there,
        written the cheapest way: the same work, measured for as long (a single round
        took a third of a second, short enough for a moment of the machine's noise to
        move the figure by half). Returns the rate, or None with the reason."""
        key = "ingest_copy_floor_per_s"
        if connection.vendor != "postgresql":
            return self._skip(key, "the COPY floor needs PostgreSQL")
        rounds = _timed([snapshots] * REAL_PATH_ROUNDS, at)
        wanted = len(snapshots) * len(rounds)
        self._say(f"writing {wanted} snapshots' rows with COPY (the floor) ...")
        floor = CopyFloor()
        began = time.perf_counter()
        stored = 0
        for batch in rounds:
            for i in range(0, len(batch), BATCH):
                stored += floor.store(batch[i:i + BATCH])
        elapsed = time.perf_counter() - began
        if stored != wanted:
            return self._skip(key, f"the floor updated {stored} of {wanted} nodes")
        return wanted / elapsed

    def _ingest_beside_the_floor(self, snapshots: list[dict], start: datetime, repeat: int) -> None:
        """The real path with one consumer (for a fleet whose snapshots repeat the last
        one's figures, then for a busy one's), with SERVICE_CONSUMERS and with
        SCALED_CONSUMERS, `repeat` times each,
        with the COPY floor measured before, between and after them (it writes every row
        whether or not it changed, so its cost is the same for both): each real-path run is
        compared with the floor runs just before and after it, and each figure is the
        median of its runs. This machine's speed drifts by a third over minutes, and a
        floor measured once, after both real paths, put the drift into the ratio (500-node runs
        of the same code printed one-process ratios of 0.36-0.40, and 0.56 where the floor ran
        at a slow moment)."""
        f = self.figures
        same = [snapshots] * REAL_PATH_ROUNDS
        # key: (ratio key, consumers, the rounds it stores)
        paths = {"ingest_snapshots_per_s": ("ratio_ingest_to_copy_floor", 1, same),
                 "ingest_busy_snapshots_per_s": ("ratio_ingest_busy_to_copy_floor", 1, _busy_rounds(snapshots)),
                 "ingest_service_snapshots_per_s": ("ratio_ingest_service_to_copy_floor",
                                                    SERVICE_CONSUMERS, same),
                 "ingest_scaled_snapshots_per_s": ("ratio_ingest_scaled_to_copy_floor", SCALED_CONSUMERS, same)}
        f["ingest_service_consumers"], f["ingest_scaled_consumers"] = SERVICE_CONSUMERS, SCALED_CONSUMERS
        steps = [None, *(step for _ in range(repeat) for key in paths for step in (key, None))]
        rates = []
        for i, key in enumerate(steps):
            at = start + timedelta(seconds=10 * i)  # each step newer than the last, REAL_PATH_ROUNDS s apart
            self._vacuum()
            if key is None:
                rates.append(self._ingest_copy_floor(snapshots, at))
            else:
                _, consumers, rounds = paths[key]
                rates.append(self._ingest_real_path(rounds, at, key, consumers))
        floors = rates[0::2]
        f["ingest_copy_floor_runs_per_s"] = [_rounded(rate) for rate in floors]
        f["ingest_copy_floor_per_s"] = _median(floors)
        for key, (ratio_key, *_) in paths.items():
            runs = [(rates[i], _mean(rates[i - 1], rates[i + 1])) for i, step in enumerate(steps) if step == key]
            f[key.replace("_per_s", "_runs_per_s")] = [_rounded(rate) for rate, _ in runs]
            f[key] = _median([rate for rate, _ in runs])
            ratios = [_ratio(rate, floor) for rate, floor in runs]
            f[f"{ratio_key}_runs"] = ratios
            f[ratio_key] = None if None in ratios else round(statistics.median(ratios), 3)
        # The in-process figures were measured just before the first floor run.
        f["ratio_ingest_one_to_copy_floor"] = _ratio(f["ingest_one_per_s"], floors[0])
        f["ratio_ingest_batch_to_copy_floor"] = _ratio(f["ingest_batch_per_s"], floors[0])

    def _ingest_with_and_without_events(self, snapshots: list[dict], repeat: int) -> None:
        """Batches in process with event detection on and off (GPUFLEET_EVENTS_AT_INGEST),
        alternately, `repeat` times each (EVENT_PAIRS at least), over a troubled fleet: every node warns with words
        new each round (each open event rewritten), and every fourth fails in one pair of
        rounds and not the next (events opened and cleared). The figures are the medians;
        the ratio is on over off."""
        rates: dict[bool, list[float]] = {True: [], False: []}
        # Newer than everything stored before, and in the past (the ingest refuses the future).
        start = datetime.now(UTC) - timedelta(minutes=4)
        # Both of a pair see the same fleet, so each stores as many failing findings; the
        # failures flip between pairs, so each timed "on" round opens or clears events. An
        # untimed "on" round first opens the warnings' events, which only the first run meets.
        # On and off take turns at going first.
        rounds = [(True, False, True)] + [
            (flag, r % 2 == 0, False) for r in range(max(repeat, EVENT_PAIRS))
            for flag in ((True, False) if r % 2 == 0 else (False, True))
        ]
        for step, (on, failing, warm_up) in enumerate(rounds):
            at = start + timedelta(seconds=step)
            batch = [_troubled(s, step, i, failing) for i, s in enumerate(_at(snapshots, at))]
            self._vacuum()
            with override_settings(GPUFLEET_EVENTS_AT_INGEST=on):
                began = time.perf_counter()
                for i in range(0, len(batch), BATCH):
                    ingest_snapshots(batch[i:i + BATCH])
                if not warm_up:
                    rates[on].append(len(batch) / (time.perf_counter() - began))
        f = self.figures
        f["ingest_events_on_per_s"], f["ingest_events_off_per_s"] = _median(rates[True]), _median(rates[False])
        f["ratio_ingest_events_on_to_off"] = _ratio(f["ingest_events_on_per_s"], f["ingest_events_off_per_s"])

    # --- The fleet ---------------------------------------------------------------

    def _grow_fleet(self, names: list[str], ingested: int) -> None:
        """The rest of the fleet in bulk, each node a copy (name and GPU UUIDs its own)
        of one ingested node's rows, as ingest left them: fast at 10,000 nodes."""
        todo = names[ingested:]
        if not todo:
            return
        self._say(f"creating {len(todo)} more nodes in bulk ...")
        templates = list(Node.objects.filter(name__in=names[:ingested]).prefetch_related("devices", "findings"))
        for start in range(0, len(todo), 500):
            chunk = todo[start:start + 500]
            made = []
            for offset, name in enumerate(chunk):
                template = templates[(start + offset) % len(templates)]
                node = Node(**{f.attname: getattr(template, f.attname) for f in Node._meta.concrete_fields
                               if f.attname != "id"})
                node.name = name
                made.append((node, template))
            Node.objects.bulk_create([node for node, _ in made])
            if connection.vendor != "postgresql" or made[0][0].pk is None:  # ids not returned
                ids = dict(Node.objects.filter(name__in=chunk).values_list("name", "id"))
                for node, _ in made:
                    node.pk = ids[node.name]
            devices, findings = [], []
            for node, template in made:
                suffix = node.name.encode().hex()[-12:].rjust(12, "0")
                for d in template.devices.all():
                    devices.append(Device(**{f.attname: getattr(d, f.attname) for f in Device._meta.concrete_fields
                                             if f.attname not in ("id", "node_id")},
                                          node_id=node.pk))
                    devices[-1].uuid = d.uuid[:-12] + suffix
                for f in template.findings.all():
                    findings.append(Finding(node_id=node.pk, position=f.position, code=f.code, name=f.name,
                                            status=f.status, message=f.message, fix=f.fix))
            Device.objects.bulk_create(devices, batch_size=2000)
            Finding.objects.bulk_create(findings, batch_size=2000)

    def _client(self) -> Client:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_superuser("bench", password="bench-pass-1")
        client = Client()
        client.force_login(user)
        return client

    # --- Pages -------------------------------------------------------------------

    def _pages(self, client: Client, repeat: int, node: str, history: str) -> None:
        """Each page `repeat` times, the pages taking turns so a busy machine slows all alike;
        the COMPUTED ones in turns of their own after, so that their seconds do not stretch
        the others' turn past the kept answers' max ages."""
        self._say(f"timing {len(PAGES)} pages, {repeat} times each ...")
        timed: dict[str, list[float]] = {key: [] for key, *_ in PAGES}
        names = {"node": node, "history": history, "driver": Node.objects.get(name=node).driver_version}
        kept = [page for page in PAGES if page[0] not in COMPUTED]
        for turn in (kept, [page for page in PAGES if page[0] in COMPUTED]):
            for key, _, url, headers in turn:  # once untimed: templates compiled, caches warm
                with _page_settings(key):
                    _timed_get(client, url.format(**names), headers)
            for _ in range(repeat):
                for key, _, url, headers in turn:
                    with _page_settings(key):
                        ms, queries, size = _timed_get(client, url.format(**names), headers)
                    timed[key].append(ms)
                    self.figures[f"{key}_queries"] = queries
                    self.figures[f"{key}_bytes"] = size
        for key, *_ in PAGES:
            self.figures[f"{key}_ms"] = round(statistics.median(timed[key]), 1)
        admin = self.figures[f"{ADMIN}_ms"]
        for key, *_ in PAGES:
            if key != ADMIN:
                self.figures[f"ratio_{key}_to_admin"] = _ratio(self.figures[f"{key}_ms"], admin)

    def _metrics(self, client: Client) -> None:
        """The unsharded scrape of the whole fleet, once (after the shard's, which warmed
        up the code): what a site that does not shard pays; sharding is the target."""
        self._say("scraping the whole fleet's /metrics once ...")
        ms, queries, size = _timed_get(client, "/metrics", {})
        self.figures["metrics_scrape_s"] = round(ms / 1000, 3)
        self.figures["metrics_scrape_queries"] = queries
        self.figures["metrics_scrape_bytes"] = size
        self.figures["ratio_metrics_scrape_to_admin"] = _ratio(ms, self.figures[f"{ADMIN}_ms"])

    def _exports(self, client: Client) -> None:
        """Each fleet export once, read to its end, with the COPY floor (PostgreSQL's own
        COPY ... TO STDOUT WITH CSV of the same rows) run before the first, between each and
        after the last: an export's ratio is to the mean of the floor runs either side of it."""
        floors = [self._copy_floor()]
        for key, label, url in EXPORTS:
            self._say(f"reading the {label} ...")
            ms, queries, size = _timed_get(client, url, {})
            self.figures.update({f"{key}_ms": round(ms, 1), f"{key}_queries": queries, f"{key}_bytes": size})
            floors.append(self._copy_floor())
            self.figures[f"ratio_{key}_to_copy_floor"] = _ratio(ms, _mean(floors[-2], floors[-1]))
        key = "report_csv_copy_floor_ms"
        if None in floors:
            self._skip(key, "COPY ... TO STDOUT needs PostgreSQL")
        else:
            self.figures["report_csv_copy_floor_runs_ms"] = [round(run, 1) for run in floors]
            self.figures[key] = round(statistics.median(floors), 1)

    def _copy_floor(self) -> float | None:
        """ms of one COPY floor run (None on SQLite); its bytes into the figures."""
        if connection.vendor != "postgresql":
            return None
        began, size = time.perf_counter(), 0
        # psycopg's own cursor, past Django's wrapper: COPY ... TO STDOUT.
        with connection.cursor() as cursor, cursor.connection.cursor() as raw, raw.copy(report_csv_copy()) as copy:
            for data in copy:
                size += len(data)
        self.figures["report_csv_copy_floor_bytes"] = size
        return 1000 * (time.perf_counter() - began)

    # --- The agent -------------------------------------------------------------------

    def _agent_footprint(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            for key in AGENT_FIGURES:
                self._skip(key, "redis-server is not installed")
            return
        self._say(f"running the agent for {AGENT_CYCLES} collections ...")
        with tempfile.TemporaryDirectory(prefix="gf-agent-", dir="/tmp") as folder:
            try:
                rss, cpu = _run_agent(server, Path(folder))
            except (OSError, TimeoutError) as exc:
                for key in AGENT_FIGURES:
                    self._skip(key, f"the agent did not run: {exc}")
                return
        self.figures["agent_rss_mib"] = round(rss / 2**20, 1)
        self.figures["agent_cpu_per_cycle_s"] = float(f"{cpu:.3g}")
        diagnose_this_host()  # as the agent's first collection: what this host's driver knows
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(AGENT_CYCLES):
            diagnose_this_host()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        bare = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / AGENT_CYCLES
        if bare <= 0:
            for key in AGENT_FIGURES[2:]:
                self._skip(key, "no GPU command ran on this host (nvidia-smi not on PATH)")
        else:
            self.figures["bare_commands_cpu_per_cycle_s"] = float(f"{bare:.3g}")
            self.figures["ratio_agent_cpu_to_bare_commands"] = round(cpu / bare, 2)

    # --- A flood on the ingest stream ---------------------------------------------

    def _flood(self, size: int) -> None:
        bench = _bench_broker(settings.CELERY_BROKER_URL)
        if bench is None:
            reason = f"the broker {maybe_sanitize_url(settings.CELERY_BROKER_URL)} is not Redis"
        else:
            url, client = bench
            with client:
                reason = bench_flood.measure_flood(self.figures, client, size,
                                                   lambda node, at: _snapshot(node, 1, at), self._say)
            if reason:
                reason = f"{reason} at {maybe_sanitize_url(url)}"
        if reason:
            for key in bench_flood.FIGURES:
                self._skip(key, reason)

    # --- Results -----------------------------------------------------------------

    def _targets(self) -> dict:
        """The fleet-scale issue's targets: True met, False missed, None not measured."""
        f = self.figures

        def at_most(a, b, factor=1.0):
            return None if a is None or b is None else a <= factor * b

        real, ratio = f.get("ingest_snapshots_per_s"), f.get("ratio_ingest_to_copy_floor")
        pages = [key for key, *_ in PAGES if key not in (ADMIN, "node_page_24h", *COMPUTED)]
        exports = {f"{key}_within_5x_copy_csv": at_most(f[f"ratio_{key}_to_copy_floor"], 5) for key, *_ in EXPORTS}
        return {
            "real_path_ingest_at_least_500_per_s": None if real is None else real >= 500,
            "real_path_ingest_at_least_0.6_of_copy_floor": None if ratio is None else ratio >= 0.6,
            "ingest_with_events_at_least_0.9_of_without": at_most(0.9, f.get("ratio_ingest_events_on_to_off")),
            "node_page_24h_no_slower_than_admin": at_most(f["node_page_24h_ms"], f[f"{ADMIN}_ms"]),
            "pages_no_slower_than_admin": all(at_most(f[f"{key}_ms"], f[f"{ADMIN}_ms"]) for key in pages),
            **exports,
            **bench_metrics.metrics_targets(f),
            **bench_history.history_targets(f),
            **bench_usage.usage_targets(f),
            "agent_at_most_64_mib": None if f["agent_rss_mib"] is None else f["agent_rss_mib"] <= 64,
            "agent_cpu_at_most_1.2x_bare_commands": at_most(f["ratio_agent_cpu_to_bare_commands"], 1.2),
            **bench_flood.flood_targets(f),
        }

    def _table(self) -> None:
        f = self.figures
        out = self.stdout.write
        out(f"gpufleet bench: {f['nodes']} nodes x {f['gpus_per_node']} GPUs on {f['engine']}, "
            f"ingest sample {f['ingest_sample']} snapshots, median of {f['repeat']}, {f['measured_at']}")
        out("pages timed with (rows): " + ", ".join(f"{what} {count:,}" for what, count in f["list_content"].items()))
        counts = f["sql_statements_per_snapshot"]
        out(f"SQL statements per snapshot ({', '.join(counts)} GPUs): {', '.join(map(str, counts.values()))}")
        out("")
        out("| figure | value | peer / floor | peer value | ratio |")
        out("| --- | --- | --- | --- | --- |")

        def rate(value):
            return "skipped" if value is None else f"{value:,.0f} snapshots/s"

        def ms(value):
            return "skipped" if value is None else f"{value:,.1f} ms"

        service, scaled = SERVICE_CONSUMERS, SCALED_CONSUMERS
        ratios = {"ingest_snapshots_per_s": "ratio_ingest_to_copy_floor",
                  "ingest_busy_snapshots_per_s": "ratio_ingest_busy_to_copy_floor",
                  "ingest_service_snapshots_per_s": "ratio_ingest_service_to_copy_floor",
                  "ingest_scaled_snapshots_per_s": "ratio_ingest_scaled_to_copy_floor",
                  "ingest_one_per_s": "ratio_ingest_one_to_copy_floor",
                  "ingest_batch_per_s": "ratio_ingest_batch_to_copy_floor"}
        for key, label in (("ingest_snapshots_per_s", "ingest, real path (stream, 1 consumer)"),
                           ("ingest_busy_snapshots_per_s",
                            "ingest, real path, 1 consumer, busy fleet (every snapshot's findings new)"),
                           ("ingest_service_snapshots_per_s", f"ingest, real path, {service} consumers"),
                           ("ingest_scaled_snapshots_per_s", f"ingest, real path, {scaled} consumers"),
                           ("ingest_one_per_s", "ingest in process, one at a time"),
                           ("ingest_batch_per_s", f"ingest in process, batches of {BATCH}")):
            out(f"| {label} | {rate(f.get(key))} | COPY + INSERT ON CONFLICT floor | "
                f"{rate(f.get('ingest_copy_floor_per_s'))} | {_show(f[ratios[key]])} |")
        out(f"| ingest in process, batches of {BATCH}, troubled fleet, events detected | "
            f"{rate(f.get('ingest_events_on_per_s'))} | the same, events off | {rate(f.get('ingest_events_off_per_s'))} | "
            f"{_show(f.get('ratio_ingest_events_on_to_off'))} |")
        admin = f[f"{ADMIN}_ms"]
        for key, label, *_ in PAGES:
            if key == ADMIN:
                continue
            out(f"| {label} ({f[f'{key}_queries']} queries) | {ms(f[f'{key}_ms'])} | admin node changelist | "
                f"{ms(admin)} | {_show(f[f'ratio_{key}_to_admin'])} |")
        for key, label, _ in EXPORTS:
            out(f"| {label} ({f[f'{key}_bytes'] / 2**20:,.1f} MiB) | {ms(f[f'{key}_ms'])} | "
                f"COPY (SELECT ...) TO STDOUT WITH CSV, the runs either side | {ms(f.get('report_csv_copy_floor_ms'))} | "
                f"{_show(f[f'ratio_{key}_to_copy_floor'])} |")
        out(f"| /metrics, shard 0 of {f['metrics_shards']} ({f['metrics_shard_scrape_queries']} queries, "
            f"{f['metrics_shard_scrape_bytes'] / 2**20:,.1f} MiB) | {f['metrics_shard_scrape_s']:.3f} s | "
            f"Prometheus' default scrape_timeout | 10 s | {_show(f['metrics_shard_scrape_s'] / 10)} |")
        out(f"| /metrics, whole fleet unsharded ({f['metrics_scrape_queries']} queries, "
            f"{f['metrics_scrape_bytes'] / 2**20:,.1f} MiB) | {f['metrics_scrape_s']:.3f} s | admin node changelist | "
            f"{ms(admin)} | {_show(f['ratio_metrics_scrape_to_admin'])} |")
        if f.get("history_roll_5m_s") is not None:
            value = f["history_value_bytes_per_gpu_bucket"]
            for series, label in (("5m", "five-minute"), ("1h", "hourly")):
                size = f[f"history_{series}_bytes_per_gpu_bucket"]
                out(f"| history kept, {label} rollups, bytes per GPU and bucket | {size:,.1f} B | the values "
                    f"(twelve float32) | {value} B | {_show(size / value)} |")
            out(f"| history roll-up, one 5-minute bucket of every GPU / one hour | {f['history_roll_5m_s']:.2f} s / "
                f"{f['history_roll_1h_s']:.2f} s | one core, every 5 minutes / every hour | 300 s / 3,600 s | "
                f"{f['history_rollup_core_fraction']:.3f} of a core |")
            out(f"| history kept, raw samples, bytes per sample (not a target) | "
                f"{f['history_raw_bytes_per_sample']:,.1f} B | - | - | - |")
        for row in bench_usage.table_rows(f) + bench_flood.table_rows(f):
            out(row)
        out("")
        out("ingest runs in the order measured (real paths beside the floor runs before and after them; the figures "
            "above are medians, each real path's ratio the median of its runs' ratios):")
        out(f"  floor: {', '.join(rate(run) for run in f['ingest_copy_floor_runs_per_s'])}")
        for key, label in (("ingest_snapshots", "1 consumer"), ("ingest_busy_snapshots", "1 consumer, busy"),
                           ("ingest_service_snapshots", f"{service} consumers"),
                           ("ingest_scaled_snapshots", f"{scaled} consumers")):
            ratio_runs = f[f"{ratios[key + '_per_s']}_runs"]
            out(f"  {label}: {', '.join(rate(run) for run in f[key + '_runs_per_s'])} "
                f"(ratios {', '.join(_show(r) for r in ratio_runs)})")
        if f["fleet_nodes_one_host_keeps_up_with"] is not None:
            out("")
            out(f"one central host like this one keeps up with about {f['fleet_nodes_one_host_keeps_up_with']:,.0f} "
                f"nodes at the {f['collect_interval_s']:g} s collect interval (the service's rate x the interval)")
        out("")
        if f["agent_rss_mib"] is not None:
            out(f"agent: {f['agent_rss_mib']} MiB resident (its process tree, commands included), "
                f"{f['agent_cpu_per_cycle_s']} s CPU per collection; the bare commands "
                f"{f['bare_commands_cpu_per_cycle_s']} s (ratio {_show(f['ratio_agent_cpu_to_bare_commands'])})")
        for target, met in f["targets"].items():
            out(f"target {target}: {'met' if met else 'not measured' if met is None else 'NOT met'}")
        for key, reason in self.skipped.items():
            out(f"skipped {key}: {reason}")


def _run_agent(server: str, folder: Path) -> tuple[int, float]:
    """The agent's peak process-tree RSS (bytes) and CPU seconds per collection, over
    AGENT_CYCLES collections once its first is done."""
    sock, stream, node = folder / "redis.sock", "bench:agent", "bench-agent"
    redis_server = subprocess.Popen([server, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly",
                                     "no", "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    agent = None
    try:
        client = broker.connect(f"redis+socket://{sock}", timeout=5)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        broker_users.prepare(client, stream)  # the append function, as a consumer's start loads it
        env = {**os.environ, "CELERY_BROKER_URL": f"redis+socket://{sock}", "GPUFLEET_DATA_DIR": str(folder),
               "GPUFLEET_NODE_NAME": node, "GPUFLEET_AGENT_KEY": str(wire.NodeKey(1, os.urandom(32))),
               "GPUFLEET_COLLECT_INTERVAL": "1", "GPUFLEET_INGEST_STREAM": stream}
        env.pop("DATABASE_URL", None)
        agent = subprocess.Popen(launch.agent_worker(), env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)

        def collections() -> int:
            if time.monotonic() > deadline or agent.poll() is not None:
                raise TimeoutError("no snapshot from the agent")
            return client.xlen(broker.ingest_key(stream))

        while collections() < 1:
            time.sleep(0.05)
        first, cpu, peak = collections(), footprint.cpu_seconds(agent.pid), 0
        deadline = time.monotonic() + START_TIMEOUT_S
        while (done := collections()) < first + AGENT_CYCLES:
            peak = max(peak, footprint.rss_bytes(agent.pid))
            time.sleep(0.02)
        return peak, (footprint.cpu_seconds(agent.pid) - cpu) / (done - first)
    finally:
        for proc in (agent, redis_server):
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def _page_settings(key: str):
    """The kept availability answers off for the pages timed computed (COMPUTED)."""
    return override_settings(GPUFLEET_AVAILABILITY_MAX_AGE_S=0) if key in COMPUTED else contextlib.nullcontext()


def _show(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _timed_get(client: Client, url: str, headers: dict) -> tuple[float, int, int]:
    """ms, queries and body bytes of one GET (bench_metrics.timed_get, in ms)."""
    seconds, queries, size = bench_metrics.timed_get(client, url, headers)
    return 1000 * seconds, queries, size


# --- The real path: Redis and a worker process -----------------------------------


def _bench_broker(url: str):
    """(URL, Redis client) of the bench's own database on the configured Redis, or None
    when the broker is not Redis."""
    import redis

    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        current = parts.path.strip("/") or "0"
        db = BENCH_REDIS_DB if current != str(BENCH_REDIS_DB) else BENCH_REDIS_DB - 1
        bench = urlunsplit(parts._replace(path=f"/{db}"))
        return bench, redis.Redis.from_url(bench, socket_connect_timeout=1, socket_timeout=2)
    if parts.scheme == "redis+socket":
        query = dict(parse_qsl(parts.query))
        current = query.get("virtual_host", "0")
        db = BENCH_REDIS_DB if current != str(BENCH_REDIS_DB) else BENCH_REDIS_DB - 1
        # With the user and password, if any (`up`'s private Redis has no default user).
        login = parts.netloc.rpartition("@")[0]
        bench = f"redis+socket://{login + '@' if login else ''}{parts.path}?{urlencode({**query, 'virtual_host': str(db)})}"
        return bench, redis.Redis(unix_socket_path=parts.path, db=db, username=unquote(parts.username or "") or None,
                                  password=unquote(parts.password or "") or None, socket_connect_timeout=1, socket_timeout=2)
    return None
