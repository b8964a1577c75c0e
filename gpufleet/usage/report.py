"""Reading usage back: GPU-hours reserved and used, idle-reserved and used-unreserved,
unknown, energy and cost over a period, grouped by one key. The whole hours the beat
has rolled come from hourly rows; the rest of the period (the last hour or so, and
the part of an hour where the period starts or ends inside one) from the five-minute
rows, so a report reaches up to the last snapshot stored. Where those are pruned
already, such a part hour is its share of the hourly row.

One GROUP BY over those rows, whatever the period: a month of a large fleet is read
from hourly rows, never from samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from gpufleet.fleet import partitions
from gpufleet.usage import record
from gpufleet.usage.models import UsageFiveMinutes, UsageHour

# What a report may be grouped by: the columns that make each group's key.
GROUPS = {
    "owner": ("owner",),
    "team": ("team",),
    "claim": ("claim_id", "claim", "node", "owner"),
    "image": ("image",),
    "label": ("label",),
    "node": ("node_id", "node"),
    "model": ("model",),
}
# What a report may be narrowed to, by the column each filter compares.
FILTERS = {"owner": "owner", "team": "team", "claim_id": "claim_id", "node_id": "node_id", "image": "image",
           "model": "model"}
_HOUR_S = 3600.0


@dataclass(frozen=True)
class Row:
    """One group's figures, in GPU-hours, kWh and the site's currency."""

    key: dict
    reserved: float
    used: float
    idle_reserved: float
    used_unreserved: float
    unknown: float
    power_unknown: float  # GPU-hours seen without a power reading
    energy_kwh: float | None  # None: no power reading at all
    cost: float | None  # None: no price set

    @property
    def efficiency(self) -> float | None:
        """Used over reserved: of the claimed GPU time, the share that did work."""
        used_reserved = self.reserved - self.idle_reserved
        return used_reserved / self.reserved if self.reserved else None

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "gpu_hours_reserved": self.reserved,
            "gpu_hours_used": self.used,
            "gpu_hours_idle_reserved": self.idle_reserved,
            "gpu_hours_used_unreserved": self.used_unreserved,
            "gpu_hours_unknown": self.unknown,
            "gpu_hours_power_unknown": self.power_unknown,
            "efficiency": self.efficiency,
            "energy_kwh": self.energy_kwh,
            "cost": self.cost,
        }


@dataclass(frozen=True)
class Report:
    by: str
    start: datetime
    end: datetime
    rows: list[Row]
    total: Row
    filters: dict = field(default_factory=dict)


def report(start: datetime, end: datetime, by: str, filters: dict | None = None) -> Report:
    """Usage from `start` until before `end`, grouped by `by` (a key of GROUPS),
    narrowed by `filters` (keys of FILTERS), largest reserved-or-used first."""
    filters = {name: value for name, value in (filters or {}).items() if value not in (None, "")}
    keys = GROUPS[by]
    rows = _grouped(_parts(start, end), keys, filters)
    found = sorted((_row(dict(zip(keys, values[:len(keys)], strict=True)), values[len(keys):]) for values in rows),
                   key=lambda r: (-(r.reserved + r.used_unreserved), -r.used, str(list(r.key.values()))))
    # Every figure is a sum, so the total is the groups' sums added: the period's rows are scanned once.
    return Report(by, start, end, found, _row({}, _summed([values[len(keys):] for values in rows])), filters)


def _summed(groups: list[tuple]) -> list:
    """Column by column, the sum of the groups' figures (None where none has one)."""
    width = len(_FIGURES)
    return [sum(known) if (known := [g[i] for g in groups if g[i] is not None]) else None for i in range(width)]


@dataclass(frozen=True)
class _Part:
    """Rows of one table with buckets from `start` until before `end`, each counted
    `weight` times (below 1: the share of an hour inside the period)."""

    hourly: bool
    start: datetime
    end: datetime
    weight: float = 1.0


def _parts(start: datetime, end: datetime) -> list[_Part]:
    """Where each part of the period is read from: its whole rolled hours from hourly
    rows, the rest from five-minute rows, or, for a part of a rolled hour whose
    five-minute rows may be pruned, that hour's row weighted by the part's share."""
    hour = record.HOUR
    rolled = record.rolled_until() or start
    # Five-minute rows of buckets from here on are all there (prune only ever deleted older ones).
    kept = timezone.now() - timedelta(hours=settings.GPUFLEET_USAGE_5M_HOURS)
    first = partitions.floor(start, hour)
    if first < start:
        first += hour
    last = partitions.floor(end, hour)
    whole_until = max(first, min(last, rolled))

    def part_hour(since: datetime, until: datetime) -> _Part:
        """[since, until), inside one hour."""
        bucket = partitions.floor(since, hour)
        if bucket + hour <= rolled and bucket < kept:
            return _Part(True, bucket, bucket + hour, (until - since) / hour)
        return _Part(False, since, until)

    parts = []
    if start < min(first, end):
        parts.append(part_hour(start, min(first, end)))
    if first < whole_until:
        parts.append(_Part(True, first, whole_until))
    tail = max(whole_until, start)
    if tail < end:
        # Past the whole hours: the hour the period ends in, when rolled, or the hours not rolled yet.
        parts.append(part_hour(tail, end) if tail == last and last + hour <= rolled else _Part(False, tail, end))
    return parts


def _grouped(parts: list[_Part], keys: tuple[str, ...], filters: dict) -> list[tuple]:
    if not parts:
        return []
    adapt = connection.ops.adapt_datetimefield_value
    q = connection.ops.quote_name
    columns = ", ".join(dict.fromkeys([*keys, *FILTERS.values(), "claim_id", "model"]))
    where = "".join(f" AND {FILTERS[name]} = %s" for name in filters)
    selects, parameters = [], []
    for part in parts:
        table = q((UsageHour if part.hourly else UsageFiveMinutes)._meta.db_table)
        if part.weight == 1.0:
            measures = ", ".join(_MEASURES)
        else:
            measures = ", ".join(f"{c} * %s AS {c}" for c in _MEASURES)
            parameters += [part.weight] * len(_MEASURES)
        selects.append(f"SELECT {columns}, {measures} FROM {table} WHERE bucket >= %s AND bucket < %s{where}")
        parameters += [adapt(part.start), adapt(part.end), *filters.values()]
    union = " UNION ALL ".join(selects)
    reserved = "CASE WHEN claim_id IS NOT NULL THEN seen_s ELSE 0 END"
    cost, cost_parameters = _cost_sql()
    select = ", ".join([*keys, f"SUM({reserved})", "SUM(used_s)", f"SUM({reserved}) - SUM(CASE WHEN claim_id IS NOT NULL THEN used_s ELSE 0 END)",
                        "SUM(CASE WHEN claim_id IS NULL THEN used_s ELSE 0 END)", "SUM(unknown_s)",
                        "SUM(seen_s) - SUM(power_s)", "SUM(power_s)", "SUM(energy_wh)", cost])
    sql = f"SELECT {select} FROM ({union}) AS u" + (f" GROUP BY {', '.join(keys)}" if keys else "")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*cost_parameters, *parameters])
        return cursor.fetchall()


_MEASURES = ("seen_s", "used_s", "power_s", "energy_wh", "unknown_s")
# What _grouped gives per group after its key, in order (_row reads them).
_FIGURES = ("reserved", "used", "idle", "unreserved", "unknown", "power_unknown", "power", "energy_wh", "cost")


def _cost_sql() -> tuple[str, list]:
    """The SQL of a group's cost (held GPU-hours times their model's price, plus kWh
    times the energy price), with its parameters; "NULL" when no price is set."""
    prices = settings.GPUFLEET_PRICE_GPU_HOUR
    kwh = settings.GPUFLEET_PRICE_KWH
    if not prices and kwh is None:
        return "NULL", []
    held = "(CASE WHEN claim_id IS NOT NULL THEN seen_s ELSE used_s END)"
    parameters: list = []
    if prices:
        default = prices.get("*", 0.0)
        cases = " ".join("WHEN %s THEN %s" for name in prices if name != "*")
        for name, price in prices.items():
            if name != "*":
                parameters += [name, price]
        price = f"(CASE model {cases} ELSE %s END)" if cases else "%s"
        parameters.append(default)
        gpu = f"SUM({held} * {price}) / {_HOUR_S}"
    else:
        gpu = "0"
    energy = "SUM(energy_wh) / 1000.0 * %s" if kwh is not None else "0"
    if kwh is not None:
        parameters.append(kwh)
    return f"({gpu} + {energy})", parameters


def _row(key: dict, values) -> Row:
    reserved, used, idle, unreserved, unknown, power_unknown, power_s, energy_wh, cost = (
        v if v is not None else None for v in values)
    hours = [(x or 0.0) / _HOUR_S for x in (reserved, used, idle, unreserved, unknown, power_unknown)]
    return Row(key, *hours, energy_kwh=(energy_wh or 0.0) / 1000.0 if power_s else None,
               cost=float(cost) if cost is not None else None)
