"""Alerts: which events are due to be sent (`plan`), and sending them (`send_due`), on
the central beat's housekeeping worker (gpufleet/alerts/tasks.py) or by
`manage.py alerts --once`; never at ingest.

Planning, one run at a time (a database lock): every enabled rule with a channel is
matched against the open events (and the one-off events since the rule was made). An
event open for the rule's wait is due an "opened" notice; while it stays open, a
"repeat-N" notice every `repeat_hours`; once it closes, a "resolved" notice if the
rule asks and something about it was sent. Each notice is a DeliveryEvent row, unique
per event, rule, channel and notice, so nothing is announced twice. Due notices join a
pending delivery of the same rule, channel and notice made within the last
GPUFLEET_ALERT_GROUP_S, or start one that waits that long for more: a rack losing power
is one message. A node under an active silence gets a delivery marked silenced instead.

Sending is Healthchecks' sendalerts pattern: a sender claims one due delivery with a
conditional UPDATE (pending -> sending, with its own token), sends it, and records the
outcome only if the claim is still its own. A claim older than
GPUFLEET_ALERT_CLAIM_TIMEOUT_S (its sender died mid-send) may be taken again. A failed
send is tried again GPUFLEET_ALERT_RETRY_S later, doubling up to GPUFLEET_ALERT_RETRY_MAX_S,
while any of its events is open and until GPUFLEET_ALERT_GIVE_UP_HOURS after they all
closed. While a channel fails, only its oldest waiting delivery is tried, the newer wait
behind it and take in what comes due meanwhile: once it answers, it gets what it missed,
oldest first and grouped."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, TextField, Value, When
from django.db.models.functions import Coalesce, Concat
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from gpufleet.alerts import channels
from gpufleet.alerts.models import Channel, Delivery, DeliveryEvent, Format, Notice, Rule, Silence, Status
from gpufleet.audit.models import Action, record
from gpufleet.events.models import Event, Kind, Muted, Severity
from gpufleet.fleet.maintenance import nodes_in_maintenance
from gpufleet.fleet.models import Health
from gpufleet.fleet.summary import LIST_LIMIT, FleetFinding, Item

log = logging.getLogger(__name__)

# One-off events (opened and closed at once: a key revoked, a fix applied) are sent only
# if this recent, so a rule made today does not announce last month's.
ONE_OFF_HORIZON = timedelta(days=1)
# Events listed by name in one message; the rest are counted.
LISTED = 50
# How long one run sends before it leaves the rest to the next tick: the housekeeping worker
# runs one task at a time (a solo pool), and offline marking waits behind this one.
SEND_BUDGET_S = 20.0
# A one-off event is marked muted by the ticks within this many tick intervals of it.
_ONE_OFF_TICKS = 3
# The PostgreSQL advisory lock that lets one planner run at a time.
_PLAN_LOCK = 0x6770_616C  # "gpal"


@dataclass
class Run:
    planned: int = 0
    sent: int = 0
    failed: int = 0


def run_once(now: datetime | None = None) -> Run:
    """What the beat does every few seconds, and `manage.py alerts --once`: mark the
    events of muted nodes, plan what is due now, then send every delivery due."""
    mark_muted(now)
    run = Run(planned=plan(now))
    run.sent, run.failed = send_due()
    return run


# --- planning ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Due:
    rule: Rule
    channel_id: int
    notice: str  # Notice value of the delivery
    muted: str  # Muted value: why it is held back, if it is
    silence_id: int | None  # the silence that holds it back


def plan(now: datetime | None = None) -> int:
    """Make the deliveries of every notice due now; how many notices were due."""
    now = now or timezone.now()
    rules = [rule for rule in Rule.objects.filter(enabled=True).prefetch_related("channels") if rule.channels.all()]
    if not rules:
        return 0
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_PLAN_LOCK])
        due = _due_opened(rules, now)
        for key, items in _due_resolved(rules, now).items():
            due[key] += items
        _make_deliveries(due, now)
    return sum(len(items) for items in due.values())


def _open_or_one_off_since(since: datetime, now: datetime):
    """The events open now, and the one-off events (opened and closed at once) made
    since `since`: what planning and muting look at each tick."""
    one_off = Q(closed_at=F("opened_at"), opened_at__gte=since)
    return Event.objects.filter(Q(closed_at__isnull=True) | one_off, opened_at__isnull=False, opened_at__lte=now)


def _due_opened(rules: list[Rule], now: datetime) -> defaultdict[_Due, list[tuple[int, str]]]:
    """The open events (and recent one-off events) each rule's channels are due to hear
    of now, as opened or repeat notices, by delivery they go in: (event pk, notice). Read
    as plain rows: every tick reads every open event."""
    oldest_rule = min(rule.created_at for rule in rules)
    events = list(_open_or_one_off_since(max(oldest_rule, now - ONE_OFF_HORIZON), now)
                  .order_by().values_list("pk", "kind", "severity", "opened_at", "closed_at", "node__name",
                                          "node__gpu_models"))
    due: defaultdict[_Due, list[tuple[int, str]]] = defaultdict(list)
    if not events:
        return due
    sent = set(DeliveryEvent.objects.filter(event_id__any=[row[0] for row in events])
               .values_list("event_id", "rule_id", "channel_id", "notice"))
    quiet = muted(now)
    targets = [(rule, [channel.pk for channel in rule.channels.all()], timedelta(minutes=rule.wait_minutes))
               for rule in rules]
    for pk, kind, severity, opened_at, closed_at, name, gpu_models in events:
        held = quiet(name), quiet.silence_id(name)
        once = closed_at is not None
        for rule, channel_ids, wait in targets:
            if not rule.matches(kind, severity, name, gpu_models or ""):
                continue
            if once and opened_at < rule.created_at:
                continue
            open_for = now - opened_at - wait
            if not once and open_for < timedelta(0):
                continue
            for channel_id in channel_ids:
                if (pk, rule.pk, channel_id, Notice.OPENED) not in sent:
                    due[_Due(rule, channel_id, Notice.OPENED, *held)].append((pk, Notice.OPENED))
                elif rule.repeat_hours and not once:
                    repeat = int(open_for / timedelta(hours=rule.repeat_hours))
                    label = f"{Notice.REPEAT}-{repeat}"
                    if repeat >= 1 and (pk, rule.pk, channel_id, label) not in sent:
                        due[_Due(rule, channel_id, Notice.REPEAT, *held)].append((pk, label))
    return due


def _due_resolved(rules: list[Rule], now: datetime) -> defaultdict[_Due, list[tuple[int, str]]]:
    """Closed events that a rule asking for recoveries announced (a notice of it was
    sent) and whose recovery was not yet: due a resolved notice."""
    wanted = {rule.pk: rule for rule in rules if rule.notify_resolved}
    due: defaultdict[_Due, list[tuple[int, str]]] = defaultdict(list)
    if not wanted:
        return due
    resolved = DeliveryEvent.objects.filter(event_id=OuterRef("event_id"), rule_id=OuterRef("rule_id"),
                                            channel_id=OuterRef("channel_id"), notice=Notice.RESOLVED)
    rows = set(
        DeliveryEvent.objects.filter(rule_id__any=list(wanted), delivery__status=Status.SENT,
                                     event__closed_at__isnull=False, event__closed_at__lte=now)
        .exclude(event__closed_at=F("event__opened_at")).exclude(Exists(resolved))
        .values_list("event_id", "rule_id", "channel_id", "event__node__name")
    )
    quiet = muted(now)
    for event_id, rule_id, channel_id, name in sorted(rows):
        rule = wanted[rule_id]
        if channel_id not in {channel.pk for channel in rule.channels.all()}:
            continue
        due[_Due(rule, channel_id, Notice.RESOLVED, quiet(name), quiet.silence_id(name))].append(
            (event_id, Notice.RESOLVED))
    return due


class _Quiet:
    """What `muted` answers: called with a node's name, why it is muted; `silence_id`,
    the silence that mutes it (None when none does, or maintenance does)."""

    def __init__(self, silences: list[Silence], in_maintenance: set[str]):
        self.silences, self.in_maintenance = silences, in_maintenance

    def __call__(self, name: str | None) -> Muted:
        if name in self.in_maintenance:
            return Muted.MAINTENANCE
        return Muted.SILENCED if self.silence_id(name) else Muted.NO

    def silence_id(self, name: str | None) -> int | None:
        if name in self.in_maintenance:
            return None
        return next((silence.pk for silence in self.silences if silence.covers(name)), None)


def muted(now: datetime) -> _Quiet:
    """Whether, and why, the notices of a node (by name; None: the site) are muted now:
    Muted.MAINTENANCE while it is in maintenance, else Muted.SILENCED while a silence
    covers it (`.silence_id`: the first that ends last), else Muted.NO (empty, so false).
    The one place that says so, for planning, sending and marking events alike. Two
    statements."""
    return _Quiet(list(Silence.objects.active(now)),
                  set(nodes_in_maintenance(now).values_list("name", flat=True)))


def mark_muted(now: datetime | None = None) -> int:
    """Mark why the events of muted nodes are muted, on every tick whether or not a rule
    exists: the open events not yet marked, and the one-off events of the last ticks
    (they open and close at once). A mark stays once set: it says the event was muted
    while open. At most five statements whatever the number of events: their read,
    `muted`'s two, and one UPDATE per reason. How many were marked."""
    now = now or timezone.now()
    recent = now - timedelta(seconds=_ONE_OFF_TICKS * settings.GPUFLEET_ALERT_TICK_S)
    rows = list(_open_or_one_off_since(recent, now).filter(muted=Muted.NO).order_by().values_list("pk", "node__name"))
    if not rows:
        return 0
    why = muted(now)
    marked: defaultdict[Muted, list[int]] = defaultdict(list)
    for pk, name in rows:
        if reason := why(name):
            marked[reason].append(pk)
    for reason, pks in marked.items():
        Event.objects.filter(pk__any=pks, muted=Muted.NO).update(muted=reason)
    return sum(len(pks) for pks in marked.values())


def _make_deliveries(due: dict[_Due, list[tuple[int, str]]], now: datetime) -> None:
    """Put each due notice in a delivery: a pending one of its rule, channel and notice
    whose grouping window is still open, or a new one (silenced ones: marked so)."""
    window = timedelta(seconds=settings.GPUFLEET_ALERT_GROUP_S)
    channel_names, failing = {}, set()
    for pk, name, failing_since in Channel.objects.values_list("pk", "name", "failing_since"):
        channel_names[pk] = name
        if failing_since is not None:
            failing.add(pk)
    items = []
    held = []
    for key, notices in due.items():
        if not notices:
            continue
        delivery = None
        if not key.muted:
            # Locked until these events are in it: a sender claiming it meanwhile waits,
            # then sends them too (unlocked, it could send without them). One waiting for
            # its channel to answer again takes them too, so what it missed comes grouped.
            waiting = Q() if key.channel_id in failing else Q(tries=0, next_try_at__gt=now) | Q(tries__gt=0)
            delivery = Delivery.objects.select_for_update().filter(
                waiting, rule=key.rule, channel_id=key.channel_id, notice=key.notice, status=Status.PENDING,
            ).order_by("created_at", "pk").first()
            if delivery is not None and delivery.title:
                # Written at its last try: written again with these events in it.
                Delivery.objects.filter(pk=delivery.pk).update(title="", body="")
        if delivery is None:
            delivery = Delivery.objects.create(
                rule=key.rule, rule_name=key.rule.name, channel_id=key.channel_id,
                channel_name=channel_names.get(key.channel_id, ""), notice=key.notice, created_at=now,
                status=Status.SILENCED if key.muted else Status.PENDING, next_try_at=now + window,
                muted=key.muted, silence_id=key.silence_id,
            )
            if key.muted:
                held.append(delivery)
        items += [DeliveryEvent(delivery=delivery, event_id=event_id, rule=key.rule, channel_id=key.channel_id,
                                notice=notice) for event_id, notice in notices]
    DeliveryEvent.objects.bulk_create(items)
    for delivery in held:
        _write_message(delivery, _events_of(delivery))


def _events_of(delivery: Delivery) -> list[Event]:
    return list(delivery.events.select_related("node").order_by("node__name", "kind", "code"))


def _write_message(delivery: Delivery, events: list[Event]) -> None:
    """Keep what a delivery says (or, held back, would have said), once."""
    if events and not delivery.title:
        delivery.title, delivery.body = message(delivery, events)
        Delivery.objects.filter(pk=delivery.pk).update(title=delivery.title, body=delivery.body)


# --- sending -------------------------------------------------------------------------


def send_due(deadline_s: float | None = None) -> tuple[int, int]:
    """Give up what waited too long, then claim and send due deliveries one at a time until
    none is due (or `deadline_s` passed: the beat's task must end within Celery's time
    limit); (sent, failed for good)."""
    deadline = time.monotonic() + (deadline_s if deadline_s is not None else SEND_BUDGET_S)
    sent, failed = 0, give_up()
    while time.monotonic() < deadline:
        claimed = claim()
        if claimed is None:
            break
        status = deliver(*claimed)
        sent += status == Status.SENT
        failed += status == Status.FAILED
    return sent, failed


def claim(now: datetime | None = None) -> tuple[Delivery, uuid.UUID] | None:
    """Take one due delivery for this sender: a pending one whose time came, or one a
    sender claimed longer ago than GPUFLEET_ALERT_CLAIM_TIMEOUT_S (it died). The UPDATE
    takes it only if nobody else did meanwhile (the loser tries the next), and only if it
    is still due: another sender may have tried it meanwhile and put it back for later."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.GPUFLEET_ALERT_CLAIM_TIMEOUT_S)
    # A failing channel is tried with its oldest waiting delivery alone, so what it missed
    # arrives in order once it answers.
    older = Delivery.objects.filter(channel_id=OuterRef("channel_id"), status__in=[Status.PENDING, Status.SENDING]).filter(
        Q(created_at__lt=OuterRef("created_at")) | Q(created_at=OuterRef("created_at"), pk__lt=OuterRef("pk")))
    first_in_line = Q(channel__failing_since__isnull=True) | ~Exists(older)
    due = Q(status=Status.PENDING, next_try_at__lte=now) | Q(status=Status.SENDING, claimed_at__lt=stale)
    while True:
        row = (Delivery.objects.filter(due & (first_in_line | Q(status=Status.SENDING))).order_by("created_at", "pk")
               .values("pk", "status", "claim_token").first())
        if row is None:
            return None
        token = uuid.uuid4()
        # Its own columns only: PostgreSQL checks them again on the row a concurrent
        # claim left, where a join's or a subquery's answer would be the stale one.
        taken = Delivery.objects.filter(due, pk=row["pk"], status=row["status"], claim_token=row["claim_token"]).update(
            status=Status.SENDING, claim_token=token, claimed_at=now, tries=F("tries") + 1)
        if taken:
            return Delivery.objects.select_related("channel", "rule").get(pk=row["pk"]), token


def deliver(delivery: Delivery, token: uuid.UUID) -> str:
    """Send a delivery this sender claimed and record how it went (only while the claim
    is still its own); the status it ended in."""
    now = timezone.now()
    mine = Delivery.objects.filter(pk=delivery.pk, claim_token=token)
    events = _events_of(delivery)
    quiet = muted(now)
    if events and all(quiet(_node_name(e)) for e in events):
        # Muted since it was planned: by maintenance if every node is in it, else a silence.
        names = [_node_name(e) for e in events]
        silence_id = next((quiet.silence_id(name) for name in names if quiet.silence_id(name)), None)
        reason = Muted.SILENCED if silence_id else Muted.MAINTENANCE
        if mine.update(status=Status.SILENCED, muted=reason, silence_id=silence_id):
            _write_message(delivery, events)
        return Status.SILENCED
    channel = delivery.channel
    if channel is None:
        mine.update(status=Status.FAILED, error="its channel was deleted")
        return Status.FAILED
    _write_message(delivery, events)
    if channel.format == Format.ALERTMANAGER:
        outcome = channels.send_alertmanager(channel.url, alertmanager_body(delivery, events, channel.name))
    else:
        outcome = channels.send(channel.url, delivery.title, delivery.body, notify_type(delivery.notice, events),
                                fields=webhook_fields(delivery, events))
    now = timezone.now()
    if outcome.sent:
        if mine.update(status=Status.SENT, sent_at=now, error=""):
            Channel.objects.filter(pk=channel.pk).update(failing_since=None, last_error="", last_sent_at=now)
            # What waited behind it while the channel failed goes now.
            Delivery.objects.filter(channel=channel, status=Status.PENDING, next_try_at__gt=now, tries__gt=0).update(
                next_try_at=now)
        log.info("alert %d sent to channel %s (%d event(s))", delivery.pk, channel.name, len(events))
        return Status.SENT
    retry = timedelta(seconds=min(settings.GPUFLEET_ALERT_RETRY_S * 2 ** min(delivery.tries - 1, 32),
                                  settings.GPUFLEET_ALERT_RETRY_MAX_S))
    if mine.update(status=Status.PENDING, error=outcome.error, next_try_at=now + retry, claim_token=None,
                   claimed_at=None):
        Channel.objects.filter(pk=channel.pk).update(failing_since=Coalesce("failing_since", now),
                                                      last_error=outcome.error)
    log.warning("alert %d to channel %s failed (try %d, again in %s): %s", delivery.pk, channel.name,
                delivery.tries, retry, outcome.error)
    return Status.PENDING


def give_up(now: datetime | None = None) -> int:
    """Fail the waiting deliveries whose events all closed (or that were made) more than
    GPUFLEET_ALERT_GIVE_UP_HOURS ago: a recovery days late tells nobody anything. Their
    channel stays failing. How many; one statement."""
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.GPUFLEET_ALERT_GIVE_UP_HOURS)
    recent = DeliveryEvent.objects.filter(Q(event__closed_at__isnull=True) | Q(event__closed_at__gt=cutoff),
                                          delivery=OuterRef("pk"))
    said = f"given up {settings.GPUFLEET_ALERT_GIVE_UP_HOURS:g} h after its events closed"
    count = Delivery.objects.filter(status=Status.PENDING, created_at__lt=cutoff).exclude(Exists(recent)).update(
        status=Status.FAILED, claim_token=None,
        error=Case(When(error="", then=Value(f"{said}, never tried: its channel was failing")),
                   default=Concat(Value(f"{said}; last try: "), "error", output_field=TextField()),
                   output_field=TextField()))
    if count:
        log.warning("%d alert(s) given up, undelivered %s", count, said.removeprefix("given up "))
    return count


def notify_type(notice: str, events: list[Event]) -> str:
    """apprise's type of a notification: success for a recovery, else its worst event's."""
    if notice == Notice.RESOLVED:
        return "success"
    worst = max((Severity(event.severity) for event in events), key=lambda severity: severity.rank,
                default=Severity.INFO)
    return {Severity.FAIL: "failure", Severity.WARN: "warning"}.get(worst, "info")


# The version of `webhook_fields`: a receiver may check it, and it changes when they do.
WEBHOOK_VERSION = "1"


def webhook_fields(delivery: Delivery, events: list[Event]) -> dict:
    """What a JSON or form webhook gets beside apprise's title, message and type, for a
    machine to route on (docs/alerts.md): firing or resolved, the worst severity, the
    kind, the group's key (the same for an event's firing and its recovery), and each
    event with its link to the Events page."""
    kinds = sorted({event.kind for event in events})
    worst = max((Severity(event.severity) for event in events), key=lambda severity: severity.rank,
                default=Severity.INFO)
    return {
        "version": WEBHOOK_VERSION,
        "status": "resolved" if delivery.notice == Notice.RESOLVED else "firing",
        "severity": worst.value,
        "kind": kinds[0] if len(kinds) == 1 else "mixed",
        "group_key": f"rule-{delivery.rule_id}/{'+'.join(kinds)}",
        "events": [{
            "id": event.pk, "node": _node_name(event), "gpu_index": event.gpu_index, "pci_bus_id": event.pci_bus_id,
            "code": event.code, "message": event.message, "opened_at": _iso(event.opened_at),
            "closed_at": _iso(event.closed_at), "url": events_link([event], delivery.notice),
        } for event in events[:LISTED]],
        "labels": {},
        "url": events_link(events, delivery.notice) if events else "",
    }


# Alertmanager's endsAt of an alert still firing: its zero time.
_STILL_FIRING = "0001-01-01T00:00:00Z"


def alertmanager_body(delivery: Delivery, events: list[Event], receiver: str) -> dict:
    """Alertmanager's webhook body (version 4) of a delivery, for a channel in its format:
    one alert per event (the first LISTED; `truncatedAlerts` counts the rest), labelled
    with what a receiver routes on, its fingerprint the same when it fires and resolves."""
    kinds = sorted({event.kind for event in events})
    status = "resolved" if delivery.notice == Notice.RESOLVED else "firing"
    alerts = [_alert(event, status, delivery.notice) for event in events[:LISTED]]
    group_labels = {"rule": delivery.rule_name, "kind": "+".join(kinds)}
    return {
        "version": "4",
        # Written as Alertmanager writes it: the route's matchers (none), then the group's labels.
        "groupKey": "{}:{" + ", ".join(f"{key}={json.dumps(value)}" for key, value in sorted(group_labels.items())) + "}",
        "truncatedAlerts": max(0, len(events) - LISTED),
        "status": status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": _common([alert["labels"] for alert in alerts]),
        "commonAnnotations": _common([alert["annotations"] for alert in alerts]),
        "externalURL": settings.GPUFLEET_SITE_URL.rstrip("/"),
        "alerts": alerts,
    }


def _alert(event: Event, status: str, notice: str) -> dict:
    labels = {"alertname": event.name or event.get_kind_display(), "kind": event.kind, "severity": event.severity,
              "node": _node_name(event) or "", "gpu_index": "" if event.gpu_index is None else str(event.gpu_index),
              "pci_bus_id": event.pci_bus_id, "code": event.code, "event_id": str(event.pk)}
    labels = {key: value for key, value in labels.items() if value}
    ends = event.closed_at if status == "resolved" and event.closed_at else None
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": f"{_node_name(event) or 'the site'}: {event.name or event.get_kind_display()}",
                        "description": event.message},
        "startsAt": _rfc3339(event.opened_at),
        "endsAt": _rfc3339(ends) if ends else _STILL_FIRING,
        "generatorURL": events_link([event], notice),
        "fingerprint": hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16],
    }


def _common(mappings: list[dict]) -> dict:
    """The pairs every mapping has."""
    if not mappings:
        return {}
    return {key: value for key, value in mappings[0].items() if all(m.get(key) == value for m in mappings[1:])}


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso(when: datetime | None) -> str | None:
    return when.isoformat(timespec="seconds") if when is not None else None


def _node_name(event: Event) -> str | None:
    return event.node.name if event.node_id else None


# --- the message -----------------------------------------------------------------------

# A GPU finding's code names its GPU and what of it ("gpu3.xid"; "gpu3" alone: its memory).
_GPU_FINDING = re.compile(r"gpu\d+(?:\.(\w+))?$")
_XID = re.compile(r"\bXid (\d+)")


def message(delivery: Delivery, events: list[Event]) -> tuple[str, str]:
    """The title and text of a delivery, in the words of templates/alerts/notice/: what
    happened, how bad and where, one line per event (the first LISTED), and a link to the
    Events page showing them. A monthly usage report alone is its own text
    (gpufleet/usage/monthly.py writes it, with its link)."""
    if len(events) == 1 and events[0].kind == Kind.USAGE_REPORT:
        return f"gpufleet: {events[0].name}"[:300], events[0].message
    context = _notice(delivery, events)
    title = " ".join(render_to_string("alerts/notice/subject.txt", context).split())
    return title[:300], render_to_string("alerts/notice/body.txt", context)


def _notice(delivery: Delivery, events: list[Event]) -> dict:
    labels = dict(Kind.choices)
    kinds = sorted({event.kind for event in events})
    severities = defaultdict(int)
    for event in events:
        severities[Severity(event.severity).label.lower()] += 1
    worst = max((Severity(event.severity) for event in events), key=lambda severity: severity.rank)
    return {
        "notice": delivery.notice,
        "rule_name": delivery.rule_name,
        "kind": kinds[0] if len(kinds) == 1 else "",
        "kind_label": labels.get(kinds[0], kinds[0]) if len(kinds) == 1 else "",
        "kind_labels": [labels.get(kind, kind) for kind in kinds],
        "severity": worst.label.lower(),
        "counts": ", ".join(f"{count} {label}" for label, count in sorted(severities.items())),
        "on_gpus": all(event.gpu_index is not None for event in events),
        "count": len(events),
        "nodes": sorted({_node_name(event) or "the site" for event in events}),
        "event": _line(events[0]) if len(events) == 1 else None,
        "listed": [_line(event) for event in events[:LISTED]],
        "more": max(0, len(events) - LISTED),
        "link": events_link(events, delivery.notice),
    }


def _line(event: Event) -> dict:
    """What the templates say of one event."""
    gpu_finding = _GPU_FINDING.match(event.code) if event.kind == Kind.FINDING else None
    return {
        "where": _node_name(event) or "the site",
        "name": event.name,
        "title": event.name or event.get_kind_display(),
        "severity": Severity(event.severity).label.lower(),
        "opened_at": event.opened_at,
        "closed_at": event.closed_at,
        "message": event.message,
        "gpu_index": event.gpu_index,
        "aspect": (gpu_finding.group(1) or "") if gpu_finding else "",
        "xids": list(dict.fromkeys(_XID.findall(f"{event.name} {event.message}"))),
    }


def events_link(events: list[Event], notice: str) -> str:
    """The Events page filtered to these events as its filters allow: their node, kind
    and severity where they share one, open or closed, and the time they opened in."""
    params = []
    for name, values in (("node", {_node_name(e) for e in events}), ("kind", {e.kind for e in events}),
                         ("severity", {e.severity for e in events})):
        if len(values) == 1 and None not in values:
            params.append((name, values.pop()))
    params.append(("state", "closed" if notice == Notice.RESOLVED else "open"))
    opened = sorted(e.opened_at for e in events)
    params += [("since", opened[0].isoformat(timespec="seconds")), ("until", opened[-1].isoformat(timespec="seconds"))]
    return f"{settings.GPUFLEET_SITE_URL.rstrip('/')}{reverse('events:list')}?{urlencode(params)}"


# --- for pages ---------------------------------------------------------------------------


def failing_channels() -> int:
    """How many channels are failing now (a notification failed every try since the
    last one sent): the Channels page marks them."""
    return Channel.objects.filter(failing_since__isnull=False).count()


def failing_channels_finding() -> FleetFinding | None:
    """The failing channels as a fleet finding for the overview, loudest first: while
    one fails, the people it should reach hear of nothing. One query while fewer than
    LIST_LIMIT fail."""
    failing = list(Channel.objects.filter(failing_since__isnull=False).order_by("failing_since", "name")
                   .only("name", "failing_since", "last_error")[:LIST_LIMIT + 1])
    if not failing:
        return None
    count = len(failing) if len(failing) <= LIST_LIMIT else failing_channels()
    page = reverse("alerts:channels")
    items = [Item(f"{channel.name}: {channel.last_error or 'every try failed'}", url=page, when=channel.failing_since)
             for channel in failing[:LIST_LIMIT]]
    title = f"{count} alert channel{'s' if count != 1 else ''} failing: notifications do not reach anyone there"
    return FleetFinding("alert_channels", Health.FAIL, title, items, max(0, count - len(items)))


def send_test(channel: Channel) -> channels.Outcome:
    """Send a test notification to a channel now (the Channels page's button). One that
    arrives is a send like any other: the channel works, and shows when it last sent."""
    said = f"A test from gpufleet to the channel {channel.name}: if you read this, it works."
    if channel.format == Format.ALERTMANAGER:
        now = timezone.now()
        alert = {"status": "firing", "labels": {"alertname": "gpufleet test notification", "severity": "info"},
                 "annotations": {"summary": said}, "startsAt": _rfc3339(now), "endsAt": _STILL_FIRING,
                 "generatorURL": settings.GPUFLEET_SITE_URL, "fingerprint": "0" * 16}
        outcome = channels.send_alertmanager(channel.url, {
            "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": "firing", "receiver": channel.name,
            "groupLabels": {}, "commonLabels": alert["labels"], "commonAnnotations": alert["annotations"],
            "externalURL": settings.GPUFLEET_SITE_URL.rstrip("/"), "alerts": [alert]})
    else:
        outcome = channels.send(channel.url, "gpufleet: test notification", said)
    if outcome.sent:
        Channel.objects.filter(pk=channel.pk).update(failing_since=None, last_error="", last_sent_at=timezone.now())
    return outcome


# --- changes by people (pages and API), audited ----------------------------------------


def channel_state(channel: Channel) -> dict:
    """What the audit log keeps of a channel: never its URL."""
    return {"name": channel.name, "url": channel.redacted, "format": channel.format}


def save_channel(user, name: str, url: str | None, editing: Channel | None = None, format: str | None = None) -> Channel:
    """Add a channel, or change one (`url` None or empty keeps its URL, `format` None its
    format). The URL must be one its format can use (channels.problem). The audit row says
    "URL changed", never what to."""
    url = (url or "").strip()
    with transaction.atomic():
        if editing is None:
            channel = Channel.objects.create(name=name, url=url, redacted=channels.redact(url),
                                             format=format or Format.APPRISE)
            record(user, Action.CHANNEL_CREATE, target=name, after=channel_state(channel))
            return channel
        before = channel_state(editing)
        editing.name = name
        editing.format = format or editing.format
        changed = bool(url) and url != editing.url
        if changed:
            editing.url, editing.redacted = url, channels.redact(url)
            # A new URL deserves a fresh start: it may work where the old one failed.
            editing.failing_since, editing.last_error = None, ""
        editing.save()
        after = {"name": name, "url": "URL changed" if changed else editing.redacted, "format": editing.format}
        record(user, Action.CHANNEL_UPDATE, target=name, before=before, after=after)
        return editing


def delete_channel(user, channel: Channel) -> None:
    with transaction.atomic():
        record(user, Action.CHANNEL_DELETE, target=channel.name, before=channel_state(channel))
        channel.delete()


RULE_FIELDS = ("name", "kinds", "min_severity", "nodes", "gpu_model", "wait_minutes", "repeat_hours",
               "notify_resolved", "enabled")


def rule_state(rule: Rule) -> dict:
    return {**{field: getattr(rule, field) for field in RULE_FIELDS},
            "channels": sorted(channel.name for channel in rule.channels.all())}


def save_rule(user, values: dict, chosen: list[Channel], editing: Rule | None = None) -> Rule:
    """Add or change a rule: `values` holds RULE_FIELDS (those left out keep theirs)."""
    with transaction.atomic():
        rule = editing or Rule()
        before = rule_state(editing) if editing is not None else None
        for field in RULE_FIELDS:
            if field in values:
                setattr(rule, field, values[field])
        rule.save()
        rule.channels.set(chosen)
        record(user, Action.RULE_UPDATE if editing else Action.RULE_CREATE, target=rule.name, before=before,
               after=rule_state(rule))
        return rule


def delete_rule(user, rule: Rule) -> None:
    with transaction.atomic():
        record(user, Action.RULE_DELETE, target=rule.name, before=rule_state(rule))
        rule.delete()


def silence_state(silence: Silence) -> dict:
    return {"nodes": silence.nodes, "starts_at": silence.starts_at.isoformat(),
            "ends_at": silence.ends_at.isoformat(), "reason": silence.reason}


def save_silence(user, nodes: str, starts_at: datetime, ends_at: datetime, reason: str,
                 editing: Silence | None = None) -> Silence:
    with transaction.atomic():
        person = user if user is not None and user.is_authenticated else None
        silence = editing or Silence(author=person, author_name=person.get_username() if person else "")
        before = silence_state(editing) if editing is not None else None
        silence.nodes, silence.starts_at, silence.ends_at, silence.reason = nodes, starts_at, ends_at, reason
        silence.save()
        record(user, Action.SILENCE_UPDATE if editing else Action.SILENCE_CREATE, target=nodes, before=before,
               after=silence_state(silence))
        return silence


def end_silence(user, silence: Silence, now: datetime | None = None) -> Silence:
    """End a silence now (one that has not started yet ends before it starts: it goes)."""
    now = now or timezone.now()
    with transaction.atomic():
        before = silence_state(silence)
        if silence.starts_at >= now:
            record(user, Action.SILENCE_END, target=silence.nodes, before=before)
            silence.delete()
            return silence
        silence.ends_at = min(silence.ends_at, now)
        silence.save(update_fields=["ends_at"])
        record(user, Action.SILENCE_END, target=silence.nodes, before=before, after=silence_state(silence))
        return silence
