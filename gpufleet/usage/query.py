"""A usage report as a script asks for one, through the API (GET /api/usage/) or
`manage.py usage`: its parameters read and checked, a refusal naming the parameter at
fault in words, and the answer both give, made here once so that they cannot differ."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.conf import settings

from gpufleet.usage import period as periods
from gpufleet.usage import report as reports

DEFAULT_GROUP = "owner"
# The filters compared with whole-number columns; the others are names, compared exactly.
NUMBERS = ("claim_id", "node_id")
# The parameters a query reads, in the order the API documents them.
PARAMETERS = ("from", "to", "period", "by", *reports.FILTERS)


class QueryError(ValueError):
    """A parameter that cannot be read: `field` names it, the message says why."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Query:
    period: periods.Period
    by: str
    filters: dict


def read(params: Mapping[str, str | None], now: datetime) -> Query:
    """The query of `params` (PARAMETERS, each text or absent): the days `from` to `to`,
    or this `period` so far (day, week or month; neither: this month), grouped `by` a
    key of gpufleet.usage.report.GROUPS, narrowed by its FILTERS."""

    def given(name: str) -> str:
        return (params.get(name) or "").strip()

    by = given("by") or DEFAULT_GROUP
    if by not in reports.GROUPS:
        raise QueryError("by", f"by is one of {', '.join(reports.GROUPS)}, not {by[:20]!r}")
    preset, first, last = given("period"), given("from"), given("to")
    if preset and (first or last):
        raise QueryError("period", "give a period, or from and to days, not both")
    if last and not first:
        raise QueryError("from", "to needs from: the period's first day")
    for name, value in (("from", first), ("to", last)):
        if value:
            try:
                date.fromisoformat(value)
            except ValueError:
                raise QueryError(name, f"{name} is a day written YYYY-MM-DD, not {value[:20]!r}") from None
    try:
        asked = periods.parse(preset or None, first or None, last or None, now)
    except periods.PeriodError as exc:
        raise QueryError("period" if preset else "to", str(exc)) from None
    return Query(asked, by, _filters(given))


def _filters(given) -> dict:
    found: dict = {}
    for name in reports.FILTERS:
        value = given(name)
        if not value:
            continue
        if name in NUMBERS:
            # Up to 18 digits: every id fits PostgreSQL's bigint.
            if not (value.isascii() and value.isdigit() and len(value) <= 18):
                raise QueryError(name, f"{name} is a whole number, not {value[:20]!r}")
            found[name] = int(value)
        else:
            found[name] = value
    return found


def run(query: Query) -> dict:
    """The answer to `query`."""
    return answer(reports.report(query.period.start, query.period.end, query.by, query.filters))


def answer(found: reports.Report) -> dict:
    """A report as the API and `manage.py usage --json` give it: the first and last
    day it covers (UTC), the site's currency, each group's figures and the total."""
    return {
        "by": found.by,
        "from": found.start.date().isoformat(),
        # The period ends before `end`: its last day is the one just before.
        "to": (found.end - timedelta(microseconds=1)).date().isoformat(),
        "currency": settings.GPUFLEET_CURRENCY,
        "rows": [row.as_dict() for row in found.rows],
        "total": found.total.as_dict(),
    }
