"""Monthly usage reports. Early on the first of each month, once the month before is rolled
into hourly rows (so its unknown hours are counted), the central beat makes:

- for each owner, their month by claim, sent to them by email;
- for the admins, the fleet's month: totals, unknown hours and every owner's and team's figures,
  as a usage-report event of the site, which alert rules that select that kind send to their
  channels (gpufleet/alerts: the usage lives below the alerts and does not send to them).

Each report is a MonthlyReport row, unique per month and recipient, with the text it
carries: the fleet's row is made with its event once, the owners' rows with it, and an
owner's email is tried on each tick until the server takes it, MAX_TRIES times at most.
However often the beat runs, a month is reported once."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from gpufleet.events import services as events
from gpufleet.usage import notify, record
from gpufleet.usage.models import MonthlyReport
from gpufleet.usage.period import Period, month_before
from gpufleet.usage.report import Report, Row, report

log = logging.getLogger(__name__)

MAX_TRIES = 3
# Rows listed by name in one report; the rest are counted.
LISTED = 50
# A month whose last hour is not rolled this long after it ended (a fleet with no nodes
# then writes no hourly rows) is reported as it stands.
ROLL_WAIT = timedelta(days=1)


def run(now: datetime | None = None) -> int:
    """One beat tick: make last month's reports if not made yet, then send the owners'
    emails not sent yet. How many emails were sent."""
    now = now or timezone.now()
    period = month_before(now)
    month = period.start.date()
    if not MonthlyReport.objects.filter(month=month, kind=MonthlyReport.Kind.FLEET).exists():
        if not _rolled(period, now):
            return 0
        make(period, now)
    return send_pending(month)


def _rolled(period: Period, now: datetime) -> bool:
    until = record.rolled_until()
    return (until is not None and until >= period.end) or now >= period.end + ROLL_WAIT


def make(period: Period, now: datetime) -> bool:
    """Make the month's reports: the fleet's (and its event) and each owner's, unsent.
    False when another run made them first. Three report queries whatever the owners."""
    by_owner = report(period.start, period.end, "owner")
    by_team = report(period.start, period.end, "team")
    claims: defaultdict[str, list[Row]] = defaultdict(list)
    for row in report(period.start, period.end, "claim").rows:
        if row.key["owner"]:
            claims[row.key["owner"]].append(row)
    owners = [row for row in by_owner.rows if row.key["owner"]]
    users = {user.get_username(): user for user in
             get_user_model().objects.filter(username__in=[row.key["owner"] for row in owners])}
    month = period.start.date()
    title, text = fleet_text(period, by_owner, by_team)
    mails = []
    for row in owners:
        owner = row.key["owner"]
        subject, body = owner_text(period, owner, row, claims[owner])
        mails.append(MonthlyReport(month=month, kind=MonthlyReport.Kind.OWNER, recipient=owner,
                                   email=notify.address(users.get(owner)), subject=subject, body=body,
                                   created_at=now))
    with transaction.atomic():
        try:
            with transaction.atomic():
                MonthlyReport.objects.create(month=month, kind=MonthlyReport.Kind.FLEET, subject=title, body=text,
                                             created_at=now, sent_at=now if by_owner.rows else None)
        except IntegrityError:
            return False
        if by_owner.rows:  # a month nobody used says nothing to anyone
            events.usage_report(f"{month:%Y-%m}", title, text, now=now)
        MonthlyReport.objects.bulk_create(mails)
    return True


def send_pending(month) -> int:
    """Send the month's owner reports not sent yet, each claimed by a conditional UPDATE
    first (a second beat takes another one); how many the server took."""
    if not settings.EMAIL_HOST:
        return 0
    sent = 0
    pending = MonthlyReport.objects.filter(month=month, kind=MonthlyReport.Kind.OWNER, sent_at__isnull=True,
                                           tries__lt=MAX_TRIES).exclude(email="")
    for item in pending.order_by("pk"):
        if not MonthlyReport.objects.filter(pk=item.pk, sent_at__isnull=True, tries=item.tries).update(
                tries=F("tries") + 1):
            continue
        error = notify.send(item.email, item.subject, item.body)
        if error:
            log.warning("monthly usage report %s to %s not sent (try %d of %d): %s", month, item.recipient,
                        item.tries + 1, MAX_TRIES, error)
            MonthlyReport.objects.filter(pk=item.pk).update(error=error)
            continue
        MonthlyReport.objects.filter(pk=item.pk).update(sent_at=timezone.now(), error="")
        sent += 1
    return sent


# --- the text ----------------------------------------------------------------------------


def _span(period: Period) -> str:
    return f"{period.start:%B %Y} ({period.first_day} to {period.last_day}, UTC)"


def _cost(value: float | None) -> str:
    return f"{value:,.2f} {settings.GPUFLEET_CURRENCY}".strip() if value is not None else ""


def _line(row: Row) -> str:
    """A row's figures after its name: reserved / used / idle, efficiency, energy, cost."""
    parts = [f"{notify.hours(row.reserved)} / {notify.hours(row.used)} / {notify.hours(row.idle_reserved)}"]
    if row.efficiency is not None:
        parts.append(f"efficiency {row.efficiency:.0%}")
    if row.energy_kwh is not None:
        parts.append(f"{row.energy_kwh:,.1f} kWh")
    if row.cost is not None:
        parts.append(_cost(row.cost))
    return ", ".join(parts)


def _listed(lines: list[str]) -> list[str]:
    shown = lines[:LISTED]
    return shown + ([f"- and {len(lines) - LISTED} more"] if len(lines) > LISTED else [])


def _usage_link(period: Period, **filters) -> str:
    query = {**filters, "from": period.first_day.isoformat(), "to": period.last_day.isoformat()}
    return notify.link(f"{reverse('usage:page')}?{urlencode(query)}")


def owner_text(period: Period, owner: str, total: Row, rows: list[Row]) -> tuple[str, str]:
    """An owner's month: their totals and each claim's figures."""
    lines = [f"GPU usage of your claims in {_span(period)}.", "",
             f"Reserved {notify.hours(total.reserved)} GPU-hours, of which {notify.hours(total.idle_reserved)} "
             f"idle" + (f" (efficiency {total.efficiency:.0%})" if total.efficiency is not None else "") + "."]
    if total.energy_kwh is not None or total.cost is not None:
        lines.append(", ".join(part for part in (
            f"Energy {total.energy_kwh:,.1f} kWh" if total.energy_kwh is not None else "",
            f"cost {_cost(total.cost)}" if total.cost is not None else "") if part) + ".")
    lines += ["", "By claim (GPU-hours reserved / used / idle):"]
    lines += _listed([f"- {row.key['claim']} on {row.key['node']}: {_line(row)}" for row in rows])
    lines += ["", f"The month on the site: {_usage_link(period, by='claim', owner=owner)}"]
    return f"gpufleet: your GPU usage in {period.start:%B %Y}", "\n".join(lines) + "\n"


def fleet_text(period: Period, by_owner: Report, by_team: Report) -> tuple[str, str]:
    """The fleet's month for the admins: totals, unknown hours, every owner's figures, and
    every team's where any claim of a team held GPUs."""
    total = by_owner.total
    unreserved = notify.hours(total.used_unreserved)
    lines = [f"GPU usage of the fleet in {_span(period)}.", "",
             f"Reserved {notify.hours(total.reserved)} GPU-hours, of which {notify.hours(total.idle_reserved)} idle"
             + (f" (efficiency {total.efficiency:.0%})" if total.efficiency is not None else "") + ".",
             f"Used {notify.hours(total.used)} GPU-hours, of which {unreserved} on GPUs no claim held.",
             f"Unknown {notify.hours(total.unknown)} GPU-hours: nodes not reporting, neither used nor idle."]
    if total.energy_kwh is not None:
        lines.append(f"Energy {total.energy_kwh:,.1f} kWh (no power reading for "
                     f"{notify.hours(total.power_unknown)} GPU-hours).")
    if total.cost is not None:
        lines.append(f"Cost {_cost(total.cost)}.")
    lines += ["", "By owner (GPU-hours reserved / used / idle):"]
    named = [f"- {row.key['owner'] or 'no owner (GPUs no claim held, claims of nobody)'}: {_line(row)}"
             for row in by_owner.rows]
    lines += _listed(named)
    if any(row.key["team"] for row in by_team.rows):
        lines += ["", "By team (GPU-hours reserved / used / idle):"]
        lines += _listed([f"- {row.key['team'] or 'no team (GPUs no claim held, claims in no team)'}: {_line(row)}"
                          for row in by_team.rows])
    lines += ["", f"The month on the site: {_usage_link(period, by='owner')}"]
    return f"Fleet GPU usage, {period.start:%B %Y}", "\n".join(lines)
