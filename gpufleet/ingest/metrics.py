"""Counters of the ingest, for /metrics (gpufleet/api/metrics.py).

The ingest runs in the Celery worker (often several pool processes), the scrape in the
web process, so a counter kept in one process's memory would never reach the page. They
meet in prometheus-client's multiprocess mode instead: each process writes its counts
to small memory-mapped files in PROMETHEUS_MULTIPROC_DIR (set by the settings, under
GPUFLEET_DATA_DIR, before prometheus-client is imported), and the scrape sums the files
of all processes, living or gone, so the totals survive a worker restart. That costs no
database write and no broker round trip per snapshot, only a local file update; worker
and web must share GPUFLEET_DATA_DIR, as they do on the central host."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

OUTCOMES = ("accepted", "stale", "rejected")

# registry=None: these are not served from this process; the scrape reads their files.
_SNAPSHOTS = Counter(
    "gpufleet_ingest_snapshots", "Snapshots the ingest handled, by outcome.", ["outcome"], registry=None
)
_SECONDS = Histogram(
    "gpufleet_ingest_seconds",
    "Time to handle one snapshot.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)

# Per reason only: the label set stays a handful of series whatever the fleet's size
# or the names a flood makes up (per node, /metrics reads the Node rows instead).
_REFUSED = Counter(
    "gpufleet_ingest_refused", "Messages the ingest refused, by reason, fleet-wide.", ["reason"], registry=None
)


def record_refusals(by_reason: dict[str, int]) -> None:
    """Count refused messages by reason code (gpufleet.fleet.models.Refusal)."""
    for reason, count in by_reason.items():
        _REFUSED.labels(reason).inc(count)


def record_ingest(outcome: str, seconds: float) -> None:
    """Count one snapshot the ingest handled ("accepted", "stale" or "rejected") and
    how long that took."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown ingest outcome {outcome!r} (expected one of {', '.join(OUTCOMES)})")
    _SNAPSHOTS.labels(outcome).inc()
    _SECONDS.observe(max(0.0, seconds))
