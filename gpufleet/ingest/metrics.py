"""Counters of the ingest, for /metrics (gpufleet/api/metrics.py).

The ingest runs in `manage.py ingest` (often several consumers, a process each), the scrape
in the web process, so a counter kept in one process's memory would never reach the page. They
meet in prometheus-client's multiprocess mode instead: each process writes its counts
to small memory-mapped files in PROMETHEUS_MULTIPROC_DIR (set by the settings, under
GPUFLEET_DATA_DIR, before prometheus-client is imported), and the scrape sums the files
of all processes, living or gone, so the totals survive a consumer's restart. That costs no
database write and no broker round trip per snapshot, only a local file update; ingest
and web must share GPUFLEET_DATA_DIR, as they do on the central host. The files of a
run are removed at the next start of the site (`manage.py clearmetrics`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

OUTCOMES = ("accepted", "stale", "rejected")

# registry=None: these are not served from this process; the scrape reads their files.
_SNAPSHOTS = Counter(
    "gpufleet_ingest_snapshots", "Snapshots the ingest handled, by outcome.", ["outcome"], registry=None
)
# Once per batch, not per snapshot: a snapshot's own time cannot be told apart from its
# batch's (one transaction stores them all), and timing each as the batch's would make
# every quantile a batch time weighted by the batch's size.
_BATCH_SECONDS = Histogram(
    "gpufleet_ingest_batch_seconds",
    "Time to handle one batch of ingest stream entries (checks and store, in one transaction).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=None,
)
_BATCH_SIZE = Histogram(
    "gpufleet_ingest_batch_size",
    "Entries in one batch the ingest handled (at most GPUFLEET_INGEST_BATCH).",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
    registry=None,
)

# Per reason only: the label set stays a handful of series whatever the fleet's size
# or the names a flood makes up (per node, /metrics reads the Node rows instead).
_REFUSED = Counter(
    "gpufleet_ingest_refused", "Messages the ingest refused, by reason, fleet-wide.", ["reason"], registry=None
)
# Entries set aside after failing twice (gpufleet/ingest/stream.py): each one is a bug to fix.
_DEAD_LETTERS = Counter(
    "gpufleet_ingest_dead_letters", "Ingest entries that failed twice and went to the dead-letter stream.",
    registry=None,
)


def record_dead_letter() -> None:
    _DEAD_LETTERS.inc()


def record_refusals(by_reason: dict[str, int]) -> None:
    """Count refused messages by reason code (gpufleet.fleet.models.Refusal)."""
    for reason, count in by_reason.items():
        _REFUSED.labels(reason).inc(count)


def record_snapshot(outcome: str) -> None:
    """Count one snapshot the ingest handled: "accepted", "stale" or "rejected"."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown ingest outcome {outcome!r} (expected one of {', '.join(OUTCOMES)})")
    _SNAPSHOTS.labels(outcome).inc()


def record_batch(entries: int, seconds: float) -> None:
    """Count one batch the ingest handled: how many entries it held, how long it took."""
    _BATCH_SIZE.observe(entries)
    _BATCH_SECONDS.observe(max(0.0, seconds))
