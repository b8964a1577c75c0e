"""The bench's usage figures (issue #31), at the issue's fleet size: the Usage page over a
month of hourly rows beside a plain SQL GROUP BY of the same rows, and what rolling an
hour of the fleet's five-minute rows adds to the central beat's roll-up, beside the
history's roll-up of the same hour. PostgreSQL only (the rows are made with
generate_series). gpufleet/tools/bench.py calls `measure_usage`, `usage_targets` and
`table_rows`.

It writes into a month long gone (it ends DAYS_BACK days before today), so nothing the
bench ingested is in the way: MONTH_HOURS hourly rows of the first MONTH_NODES nodes with GPUs, two or
three a node and hour (claims a week long on four nodes in five, by a few hundred
owners in a few dozen teams, with a few dozen images and three GPU models; the unclaimed GPUs' rows beside
them), in set-based INSERTs (setup). Then, in turns, the page (or, while the page is
not there, gpufleet.usage.report.report, which it reads) and the floor, best of
`repeat` each. Then the hour after the month as twelve five-minute buckets of the same
keys (setup), and gpufleet.usage.rollup.roll of it timed, in a transaction rolled back
afterwards; all it wrote is removed again."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import Resolver404, resolve
from django.utils import timezone

from gpufleet.fleet.models import Node
from gpufleet.tools import bench_history, bench_metrics
from gpufleet.usage import record, report, rollup
from gpufleet.usage.models import UsageFiveMinutes, UsageHour

# The targets: the page within 2 x the plain GROUP BY, the usage roll-up within
# a tenth of the history's roll-up of the same hour.
AT_MOST_TIMES_GROUP_BY = 2.0
AT_MOST_OF_HISTORY_ROLL = 0.10
DAYS_BACK = 2
MONTH_HOURS = 720
# The month's hourly rows are made for the first this many nodes: the fleet for
# the figure (a month of 60,000 nodes would be over a hundred million rows to write
# before timing anything). The roll-up figure uses every node.
MONTH_NODES = 10_000
GROUPINGS = ("owner", "image", "claim")
PAGE = "/usage/"
# The keys of the rows made: a claim lasts CLAIM_HOURS on a node; OWNERS owners in TEAMS
# teams and IMAGES images across the fleet; the GPU model by node.
CLAIM_HOURS = 168
OWNERS = 300
TEAMS = 30
IMAGES = 40
MODELS = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
WORKLOADS = ("train", "eval", "infer", "finetune", "notebook", "batch")

FIGURES = (
    "usage_hour_rows", "usage_populate_s",
    *(f"usage_{by}_{what}" for by in GROUPINGS for what in ("ms", "queries", "groups", "group_by_ms")),
    *(f"ratio_usage_{by}_to_group_by" for by in GROUPINGS),
    "usage_roll_5m_rows", "usage_roll_1h_rows", "usage_roll_1h_s", "history_roll_hour_s",
    "ratio_usage_roll_to_history_roll",
)


def measure_usage(client: Client, figures: dict, say: Callable[[str], None], repeat: int) -> str | None:
    """Adds FIGURES (and `usage_timed`, what the page figures timed) to `figures`, reading
    the history's roll-up figures there if the bench measured them; where they are not
    measured, None each, and returns why."""
    if connection.vendor != "postgresql":
        return _skip(figures, say, "the usage rows are made with PostgreSQL's generate_series")
    end = datetime.combine(timezone.now().astimezone(UTC).date(), datetime.min.time(), UTC) - timedelta(days=DAYS_BACK)
    start = end - timedelta(hours=MONTH_HOURS)
    if _rows_within(start, end + record.HOUR):
        return _skip(figures, say, f"the month from {start:%Y-%m-%d} holds usage already")
    empty = not UsageHour.objects.exists()
    try:
        say(f"writing {MONTH_HOURS} hours of usage rows for up to {MONTH_NODES:,} nodes ...")
        began = time.perf_counter()
        figures["usage_hour_rows"] = _populate_month(start, end)
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {_table(UsageHour)}")  # as autovacuum leaves a table written once
        figures["usage_populate_s"] = round(time.perf_counter() - began, 1)
        _pages(client, figures, say, start, end, max(1, repeat))
        _roll(figures, say, end)
    finally:
        _remove(start, end, empty)
    history = _history_hour_s(figures, say)
    figures["history_roll_hour_s"] = None if history is None else round(history, 2)
    figures["ratio_usage_roll_to_history_roll"] = _ratio(figures["usage_roll_1h_s"], history)
    return None


def usage_targets(figures: dict) -> dict:
    """The usage targets: True met, False missed, None not measured."""
    pages = {f"usage_page_by_{by}_within_2x_group_by": _at_most(figures.get(f"ratio_usage_{by}_to_group_by"),
                                                                   AT_MOST_TIMES_GROUP_BY)
             for by in GROUPINGS}
    return {**pages, "usage_roll_at_most_10_percent_of_history_roll":
            _at_most(figures.get("ratio_usage_roll_to_history_roll"), AT_MOST_OF_HISTORY_ROLL)}


def table_rows(figures: dict) -> list[str]:
    """The bench table's rows of the usage figures (none where they were not measured)."""
    if figures.get("usage_hour_rows") is None:
        return []
    timed = figures.get("usage_timed", "the page")
    rows = []
    for by in GROUPINGS:
        rows.append(f"| usage, a month by {by} ({timed}, {figures[f'usage_{by}_groups']:,} groups, "
                    f"{figures[f'usage_{by}_queries']} queries, {figures['usage_hour_rows']:,} hourly rows) | "
                    f"{figures[f'usage_{by}_ms']:,.1f} ms | plain SQL GROUP BY {by} of the same rows | "
                    f"{figures[f'usage_{by}_group_by_ms']:,.1f} ms | {_show(figures[f'ratio_usage_{by}_to_group_by'])} |")
    history = figures.get("history_roll_hour_s")
    rows.append(f"| usage roll-up, one hour of the fleet's five-minute rows ({figures['usage_roll_5m_rows']:,} rows) | "
                f"{figures['usage_roll_1h_s']:.2f} s | history roll-up of an hour (twelve five-minute + one hourly) | "
                f"{'skipped' if history is None else f'{history:.2f} s'} | "
                f"{_show(figures['ratio_usage_roll_to_history_roll'])} |")
    return rows


def _skip(figures: dict, say: Callable[[str], None], reason: str) -> str:
    for key in FIGURES:
        figures[key] = None
    say(f"usage figures skipped: {reason}")
    return reason


def _rows_within(start: datetime, end: datetime) -> bool:
    return any(model.objects.filter(bucket__gte=start, bucket__lt=end).exists() for model in (UsageHour, UsageFiveMinutes))


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


# Every node with GPUs at each bucket from `first` to `last`, `step` apart; each node and
# bucket two or three rows of `width` seconds a GPU: its claim's busy and idle GPUs and the
# unclaimed rest, or unclaimed a busy half and an idle half. A node's claim changes every
# CLAIM_HOURS (its hour `e` of them); the keys of each node and claim are made once (k),
# not again for each bucket.
_INSERT = """
WITH n AS MATERIALIZED (
    SELECT id, name, gpu_count AS gpus, (%(models)s::text[])[1 + id %% {model_count}] AS model,
           (extract(epoch FROM %(first)s::timestamptz)::bigint / 3600 + id * 37) / {claim_hours} AS first_e,
           (extract(epoch FROM %(last)s::timestamptz)::bigint / 3600 + id * 37) / {claim_hours} AS last_e
    FROM {nodes} WHERE gpu_count > 0 ORDER BY id LIMIT {node_limit}
), k AS MATERIALIZED (
    SELECT n.id AS node_id, c.e, v.claim_id, v.claim, v.owner, v.team, v.image, v.label, v.gpus, v.busy,
           md5(concat_ws('|', v.claim_id, v.claim, v.owner, v.team, n.model, v.image, v.label)) AS key
    FROM n
    CROSS JOIN LATERAL (
        SELECT e, (n.id * 7 + e) %% 5 < 4 AS claimed,
               CASE WHEN (n.id + e) %% 2 = 0 THEN n.gpus ELSE GREATEST(1, n.gpus / 2) END AS held,
               n.id * 100000 + e AS claim_id,
               (%(workloads)s::text[])[1 + (n.id + e) %% {workload_count}] || '-' || n.id || '-' || e AS claim,
               'bench-owner-' || lpad(((n.id * 131 + e * 17) %% {owners})::text, 4, '0') AS owner,
               'bench-team-' || lpad(((n.id * 131 + e * 17) %% {owners} %% {teams})::text, 2, '0') AS team,
               'registry.example.com/team-' || (n.id + e) %% {images} || '/train:2026.' || (n.id + e) %% {images} %% 12
                   AS image
        FROM generate_series(n.first_e, n.last_e) AS e
    ) AS c
    CROSS JOIN LATERAL (VALUES
        (c.claimed, c.claim_id, c.claim, c.owner, c.team, c.image, c.claim, c.held * 0.75, 0.9),
        (c.claimed, c.claim_id, c.claim, c.owner, c.team, '', '', c.held * 0.25, 0.0),
        (c.claimed AND c.held < n.gpus, NULL, '', '', '', '', '', (n.gpus - c.held) * 1.0, 0.05),
        (NOT c.claimed, NULL, '', '', '', 'registry.example.com/shared/notebook:3', '', n.gpus * 0.5, 0.8),
        (NOT c.claimed, NULL, '', '', '', '', '', n.gpus * 0.5, 0.0)
    ) AS v(present, claim_id, claim, owner, team, image, label, gpus, busy)
    WHERE v.present
)
INSERT INTO {table} (bucket, node_id, node, {keys}, key, {measures})
SELECT b.bucket, n.id, n.name, k.claim_id, k.claim, k.owner, k.team, n.model, k.image, k.label, k.key,
       k.gpus * %(width)s, k.gpus * %(width)s * k.busy, k.gpus * %(width)s,
       k.gpus * %(width)s * (90 + 510 * k.busy) / 3600.0, 0
FROM n
CROSS JOIN generate_series(%(first)s::timestamptz, %(last)s::timestamptz, %(step)s::interval) AS b(bucket)
JOIN k ON k.node_id = n.id AND k.e = (extract(epoch FROM b.bucket)::bigint / 3600 + n.id * 37) / {claim_hours}
"""


def _insert(model, first: datetime, last: datetime, step: timedelta, width_s: float,
            node_limit: int | None = None) -> int:
    sql = _INSERT.format(table=_table(model), keys=", ".join(record.KEY_COLUMNS), node_limit=node_limit or "ALL",
                         measures=", ".join(record.MEASURE_COLUMNS), nodes=_table(Node), model_count=len(MODELS),
                         claim_hours=CLAIM_HOURS, workload_count=len(WORKLOADS), owners=OWNERS, teams=TEAMS,
                         images=IMAGES)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"width": width_s, "models": list(MODELS), "workloads": list(WORKLOADS),
                             "first": first, "last": last, "step": step})
        return cursor.rowcount


def _populate_month(start: datetime, end: datetime) -> int:
    """The month's hourly rows, a day per statement; returns how many."""
    written = 0
    day = start
    while day < end:
        last = min(day + timedelta(days=1), end) - record.HOUR
        with transaction.atomic():
            written += _insert(UsageHour, day, last, record.HOUR, record.HOUR.total_seconds(), MONTH_NODES)
        day += timedelta(days=1)
    return written


def _pages(client: Client, figures: dict, say: Callable[[str], None], start: datetime, end: datetime,
           repeat: int) -> None:
    """Each grouping's page and floor in turns, once untimed, then best of `repeat` each."""
    try:
        resolve(PAGE)
        figures["usage_timed"], report_only = f"the page {PAGE}", False
    except Resolver404:
        figures["usage_timed"], report_only = "report(), no page at /usage/ yet", True
        say(f"no page at {PAGE}: timing gpufleet.usage.report.report, which it reads, instead")
    for by in GROUPINGS:
        say(f"timing the usage of a month by {by} beside a GROUP BY, {repeat} times each ...")
        page, floor = [], []
        for run in range(repeat + 1):
            seconds, queries, groups = _page(client, by, start, end, report_only)
            floor_seconds, floor_groups = _group_by(by, start, end)
            if run:
                page.append(seconds)
                floor.append(floor_seconds)
        figures[f"usage_{by}_ms"] = round(1000 * min(page), 1)
        figures[f"usage_{by}_group_by_ms"] = round(1000 * min(floor), 1)
        figures[f"usage_{by}_queries"] = queries
        figures[f"usage_{by}_groups"] = floor_groups if groups is None else groups
        figures[f"ratio_usage_{by}_to_group_by"] = _ratio(min(page), min(floor))


def _page(client: Client, by: str, start: datetime, end: datetime, report_only: bool) -> tuple[float, int, int | None]:
    """Seconds and queries of the page (or of report() alone), and the groups report() found."""
    if report_only:
        with CaptureQueriesContext(connection) as queries:
            began = time.perf_counter()
            found = report.report(start, end, by)
            seconds = time.perf_counter() - began
        return seconds, len(queries), len(found.rows)
    last = (end - timedelta(days=1)).date()
    seconds, queries, _ = bench_metrics.timed_get(client, f"{PAGE}?by={by}&from={start.date()}&to={last}")
    return seconds, queries, None


def _group_by(by: str, start: datetime, end: datetime) -> tuple[float, int]:
    """The floor: seconds and groups of a plain GROUP BY of the same hourly rows by the
    page's key columns, summing each measure column."""
    keys = ", ".join(report.GROUPS[by])
    sums = ", ".join(f"SUM({c})" for c in record.MEASURE_COLUMNS)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        began = time.perf_counter()
        cursor.execute(f"SELECT {keys}, {sums} FROM {_table(UsageHour)} WHERE bucket >= %s AND bucket < %s"
                       f" GROUP BY {keys}", [adapt(start), adapt(end)])
        groups = len(cursor.fetchall())
        return time.perf_counter() - began, groups


def _roll(figures: dict, say: Callable[[str], None], hour: datetime) -> None:
    """The hour after the month as the fleet's five-minute rows, rolled as the beat rolls
    it (the fleet first seen before the month, as a site's nodes were, so the roll counts
    their uncovered time too), timed; all of it rolled back afterwards."""
    with transaction.atomic():
        Node.objects.filter(first_seen__gt=hour - timedelta(hours=MONTH_HOURS)).update(
            first_seen=hour - timedelta(hours=MONTH_HOURS))
        five = UsageFiveMinutes.resolution
        figures["usage_roll_5m_rows"] = _insert(UsageFiveMinutes, hour, hour + record.HOUR - five, five,
                                                five.total_seconds())
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {_table(UsageFiveMinutes)}")  # as autovacuum would before the hour is rolled
        say(f"rolling an hour of {figures['usage_roll_5m_rows']:,} five-minute usage rows ...")
        began = time.perf_counter()
        written = rollup.roll(hour + record.HOUR + rollup.GRACE)
        figures["usage_roll_1h_s"] = round(time.perf_counter() - began, 3)
        figures["usage_roll_1h_rows"] = written
        transaction.set_rollback(True)


def _history_hour_s(figures: dict, say: Callable[[str], None]) -> float | None:
    """The history roll-up's seconds for an hour of the fleet (twelve five-minute rolls and
    one hourly), from the bench's figures, or measured here where the bench did not."""
    if "history_roll_5m_s" not in figures:
        measured: dict = {}
        bench_history.measure_history(measured, say)
    else:
        measured = figures
    five, hourly = measured.get("history_roll_5m_s"), measured.get("history_roll_1h_s")
    return None if five is None or hourly is None else 12 * five + hourly


def _remove(start: datetime, end: datetime, empty: bool) -> None:
    """The month's rows deleted (the table emptied where it was empty before)."""
    with connection.cursor() as cursor:
        if empty:
            cursor.execute(f"TRUNCATE {_table(UsageHour)}")
        else:
            UsageHour.objects.filter(bucket__gte=start, bucket__lt=end).delete()


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def _at_most(ratio, bound):
    return None if ratio is None else ratio <= bound


def _show(ratio) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"
