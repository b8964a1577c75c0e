"""Reading usage back: GPU-hours reserved and used, idle-reserved and used-unreserved,
unknown, energy and cost over a period, grouped by one key. The hours the beat has
rolled come from hourly rows; the rest of the period (the last hour or so) from the
five-minute rows, so a report reaches up to the last snapshot stored.

One GROUP BY over those rows, whatever the period: a month of a large fleet is read
from hourly rows, never from samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection

from gpufleet.usage import rollup
from gpufleet.usage.models import UsageFiveMinutes, UsageHour

# What a report may be grouped by: the columns that make each group's key.
GROUPS = {
    "owner": ("owner",),
    "claim": ("claim_id", "claim", "node", "owner"),
    "image": ("image",),
    "label": ("label",),
    "node": ("node_id", "node"),
    "model": ("model",),
}
# What a report may be narrowed to, by the column each filter compares.
FILTERS = {"owner": "owner", "claim_id": "claim_id", "node_id": "node_id", "image": "image", "model": "model"}
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
    rows = _grouped(start, end, keys, filters)
    found = sorted((_row(dict(zip(keys, values[:len(keys)], strict=True)), values[len(keys):]) for values in rows),
                   key=lambda r: (-(r.reserved + r.used_unreserved), -r.used, str(list(r.key.values()))))
    total = _grouped(start, end, (), filters)
    return Report(by, start, end, found, _row({}, total[0] if total else [None] * 9), filters)


def _grouped(start: datetime, end: datetime, keys: tuple[str, ...], filters: dict) -> list[tuple]:
    adapt = connection.ops.adapt_datetimefield_value
    q = connection.ops.quote_name
    rolled = rollup.rolled_until() or start
    split = min(max(rolled, start), end)
    columns = ", ".join([*dict.fromkeys([*keys, *FILTERS.values(), *_SOURCE_COLUMNS])])
    where = "".join(f" AND {FILTERS[name]} = %s" for name in filters)
    parameters = list(filters.values())
    union = (
        f"SELECT {columns} FROM {q(UsageHour._meta.db_table)} WHERE bucket >= %s AND bucket < %s{where}"
        f" UNION ALL SELECT {columns} FROM {q(UsageFiveMinutes._meta.db_table)} WHERE bucket >= %s AND bucket < %s{where}"
    )
    reserved = "CASE WHEN claim_id IS NOT NULL THEN seen_s ELSE 0 END"
    cost, cost_parameters = _cost_sql()
    select = ", ".join([*keys, f"SUM({reserved})", "SUM(used_s)", f"SUM({reserved}) - SUM(CASE WHEN claim_id IS NOT NULL THEN used_s ELSE 0 END)",
                        "SUM(CASE WHEN claim_id IS NULL THEN used_s ELSE 0 END)", "SUM(unknown_s)",
                        "SUM(seen_s) - SUM(power_s)", "SUM(power_s)", "SUM(energy_wh)", cost])
    sql = f"SELECT {select} FROM ({union}) AS u" + (f" GROUP BY {', '.join(keys)}" if keys else "")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*cost_parameters, adapt(start), adapt(split), *parameters,
                             adapt(split), adapt(end), *parameters])
        return cursor.fetchall()


_SOURCE_COLUMNS = ("claim_id", "seen_s", "used_s", "power_s", "energy_wh", "unknown_s", "model")


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
