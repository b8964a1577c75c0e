"""The period a usage report covers, from what a person or a script asks for: this
day, week or month so far (UTC), or whole days from one date to another."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

PRESETS = ("day", "week", "month")
# The longest period one report may cover: a year and a little, as long as hourly rows are kept.
LONGEST = timedelta(days=400)


class PeriodError(ValueError):
    """Why a period cannot be read, in words for the person who asked."""


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime  # exclusive
    name: str  # "month", "day", "week" or "range"

    @property
    def first_day(self) -> date:
        return self.start.date()

    @property
    def last_day(self) -> date:
        """The last day the period touches (its end is exclusive)."""
        return (self.end - timedelta(microseconds=1)).date()


def current(preset: str, now: datetime) -> Period:
    """This day, week (from Monday) or month, from its start until `now`."""
    today = datetime.combine(now.astimezone(UTC).date(), time(), UTC)
    if preset == "day":
        start = today
    elif preset == "week":
        start = today - timedelta(days=today.weekday())
    elif preset == "month":
        start = today.replace(day=1)
    else:
        raise PeriodError(f"unknown period {preset[:20]!r}: use one of {', '.join(PRESETS)}, or from and to dates")
    return Period(start, now, preset)


def month_before(now: datetime) -> Period:
    """The whole calendar month before the one `now` is in (the monthly report's)."""
    end = current("month", now).start
    return Period((end - timedelta(days=1)).replace(day=1), end, "range")


def parse(preset: str | None, first: str | None, last: str | None, now: datetime) -> Period:
    """A period from a preset name, or from `first` and `last` days given as
    YYYY-MM-DD (both included); neither: this month so far."""
    if first or last:
        try:
            start = date.fromisoformat((first or "").strip())
            end = date.fromisoformat((last or "").strip()) if last else now.astimezone(UTC).date()
        except ValueError:
            raise PeriodError("from and to are days written YYYY-MM-DD") from None
        if end < start:
            raise PeriodError("the period ends before it starts: to is before from")
        period = Period(datetime.combine(start, time(), UTC), datetime.combine(end + timedelta(days=1), time(), UTC),
                        "range")
        if period.end - period.start > LONGEST:
            raise PeriodError(f"a period is at most {LONGEST.days} days")
        return period
    return current(preset or "month", now)
