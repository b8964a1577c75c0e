"""A repeating booking: its RRULE expanded into windows, every one checked by the ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpufleet.gpu import BadRule, Claim, Ledger, occurrences, series_conflicts
from tests.gpu.test_ledger import node

TUESDAY_9 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
TUESDAY_17 = datetime(2026, 12, 8, 17, 0, tzinfo=UTC)
FAR = TUESDAY_9 + timedelta(days=366)


def test_a_weekly_rule_gives_each_occurrence_the_first_ones_length():
    windows = occurrences("FREQ=WEEKLY;BYDAY=TU;COUNT=3", TUESDAY_9, TUESDAY_17, horizon=FAR)
    assert windows == [(TUESDAY_9 + timedelta(weeks=w), TUESDAY_17 + timedelta(weeks=w)) for w in range(3)]
    until = occurrences("RRULE:FREQ=WEEKLY;UNTIL=20261222T090000Z", TUESDAY_9, TUESDAY_17, horizon=FAR)
    assert len(until) == 3


@pytest.mark.parametrize(("rule", "problem"), [
    ("FREQ=WEEKLY;BYDAY=TU", "needs an end"),
    ("FREQ=DAILY;COUNT=201", "at most 200"),
    ("FREQ=MONTHLY;COUNT=14", "later than"),
    ("FREQ=SOMETIMES;COUNT=2", "not an iCalendar RRULE"),
    ("FREQ=DAILY;COUNT=2\nEXDATE:20261209T090000Z", "one RRULE line"),
    ("", "not an iCalendar RRULE"),
])
def test_a_rule_without_an_end_or_too_long_or_unreadable_is_refused(rule, problem):
    with pytest.raises(BadRule, match=problem):
        occurrences(rule, TUESDAY_9, TUESDAY_17, horizon=FAR)


def test_every_occurrence_is_checked_and_each_conflict_named():
    lab = Claim("lab", device_ids=("0",), starts_at=TUESDAY_9, ends_at=TUESDAY_17)
    in_the_way = Claim("train-llm", device_ids=("0",), starts_at=TUESDAY_9 + timedelta(weeks=2, hours=3),
                       ends_at=TUESDAY_9 + timedelta(weeks=2, hours=5))
    windows = occurrences("FREQ=WEEKLY;COUNT=4", TUESDAY_9, TUESDAY_17, horizon=FAR)
    proposed = [Claim(f"lab-{n}", device_ids=lab.device_ids, starts_at=s, ends_at=e) for n, (s, e) in enumerate(windows)]
    found = series_conflicts(Ledger(node(2), [in_the_way]), proposed)
    assert [(c.name, e.code) for c, e in found] == [("lab-2", "device_taken")]
    assert "train-llm from Tue 22 Dec 12:00 to Tue 22 Dec 14:00 UTC" in str(found[0][1])
    assert series_conflicts(Ledger(node(2), []), proposed) == []


def test_occurrences_are_checked_beside_each_other():
    windows = occurrences("FREQ=HOURLY;COUNT=2", TUESDAY_9, TUESDAY_17, horizon=FAR)
    proposed = [Claim(f"lab-{n}", count=2, starts_at=s, ends_at=e) for n, (s, e) in enumerate(windows)]
    assert [(c.name, e.code) for c, e in series_conflicts(Ledger(node(2), []), proposed)] == [("lab-1", "insufficient")]


def test_an_occurrence_keeps_its_time_of_day_across_a_change_of_summer_time():
    berlin = ZoneInfo("Europe/Berlin")
    first = datetime(2027, 3, 23, 9, 0, tzinfo=berlin)
    windows = occurrences("FREQ=WEEKLY;COUNT=2", first, first + timedelta(hours=8), horizon=first + timedelta(days=30))
    assert [(s.hour, e.hour, s.utcoffset()) for s, e in windows] == [
        (9, 17, timedelta(hours=1)), (9, 17, timedelta(hours=2))]
