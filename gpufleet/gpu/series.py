"""A repeating booking: an iCalendar RRULE (RFC 5545) expanded into windows of time, and
every window checked by the ledger before any is saved."""

from __future__ import annotations

from datetime import datetime

from dateutil.rrule import rrulestr

from gpufleet.gpu.ledger import Claim, FitError, Ledger, moment_text

# A series is saved as one claim per occurrence: enough for a term of daily labs,
# and a bound on the rows one request writes.
MAX_OCCURRENCES = 200


class BadRule(ValueError):
    """The repeat rule is refused; str() says why, for people."""


def occurrences(rule: str, starts_at: datetime, ends_at: datetime, horizon: datetime) -> list[tuple[datetime, datetime]]:
    """The windows of a booking from `starts_at` to `ends_at` repeated by `rule` (the first
    one included), each as long as the first. The rule must end (COUNT or UNTIL), give at
    most MAX_OCCURRENCES windows and start none after `horizon`. Times keep the zone of
    `starts_at`, so a weekly 09:00 stays 09:00 across a change of summer time."""
    text = rule.strip()
    if "\n" in text or "\r" in text:
        raise BadRule("give one RRULE line, e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12")
    text = text.removeprefix("RRULE:")
    parts = {part.split("=", 1)[0].strip().upper() for part in text.split(";")}
    try:
        expanded = rrulestr(text, dtstart=starts_at) if text else None
    except (ValueError, TypeError) as exc:
        raise BadRule(f"the repeat is not an iCalendar RRULE ({exc}), e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12") from None
    if expanded is None or "FREQ" not in parts:
        raise BadRule("the repeat is not an iCalendar RRULE, e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12")
    if not parts & {"COUNT", "UNTIL"}:
        raise BadRule("the repeat needs an end: COUNT=n or UNTIL=date, e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12")
    length = ends_at - starts_at
    windows = []
    for start in expanded:
        if len(windows) == MAX_OCCURRENCES:
            raise BadRule(f"the repeat gives more than {MAX_OCCURRENCES} occurrences; at most {MAX_OCCURRENCES}")
        if start > horizon:
            raise BadRule(f"the repeat has an occurrence later than {moment_text(horizon)}, the furthest a series may go")
        windows.append((start, start + length))
    return windows


def series_conflicts(ledger: Ledger, proposed: list[Claim]) -> list[tuple[Claim, FitError]]:
    """Every claim of `proposed` that does not fit beside the claims of `ledger` and the
    proposed ones before it, with the ledger's refusal: all are checked, so that every
    conflict is listed before anything is saved."""
    found = []
    accepted: list[Claim] = []
    for claim in proposed:
        error = Ledger(ledger.info, [*ledger.claims, *accepted]).fit(claim)
        if error is None:
            accepted.append(claim)
        else:
            found.append((claim, error))
    return found
