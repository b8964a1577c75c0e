"""Writing events: conditions observed (at ingest, by the central beat) reconciled with
the open events, and one-off events. Every function here writes a fixed number of
statements whatever the number of nodes or conditions (tests/events/test_detection.py).

A condition is (node, kind, code): a finding code of a node, a GPU of a node gone, a
node offline, a refusal reason. `observe` compares what was seen with the open events
of the same kinds and nodes, and:

- opens an event for a new condition, once it held for GPUFLEET_EVENT_OPEN_AFTER_S
  (before that the row is pending: `opened_at` None, shown nowhere); the event's
  `opened_at` is when the condition was first seen;
- keeps an open one, with the latest message and the worst severity it reached;
- marks one whose condition is gone as clearing (`clear_since`) and closes it, at
  `clear_since`, once it stayed gone for GPUFLEET_EVENT_CLOSE_AFTER_S; a condition back
  before then continues the same event (`count` says how many times it came).

The central beat closes what cleared while nothing more was observed (`close_cleared`)
and deletes closed events after GPUFLEET_EVENT_RETENTION_DAYS (`prune`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from gpufleet import gpu
from gpufleet.core import bulk
from gpufleet.events.models import Event, Kind, Severity


@dataclass(frozen=True)
class Condition:
    """One condition seen now; `count` is how many times it was seen (refusals)."""

    node_id: int | None
    kind: str
    code: str
    severity: str
    name: str = ""
    message: str = ""
    gpu_index: int | None = None
    pci_bus_id: str = ""
    claim_name: str = ""
    count: int = 1


# The columns an observation may change on an existing event.
_CHANGED = ["severity", "message", "message_opened", "first_seen_at", "opened_at", "last_seen_at", "clear_since",
            "closed_at", "worsened_at", "count"]

_RANK = {Severity.INFO: 0, Severity.WARN: 1, Severity.FAIL: 2}


def open_after() -> timedelta:
    return timedelta(seconds=settings.GPUFLEET_EVENT_OPEN_AFTER_S)


def close_after() -> timedelta:
    return timedelta(seconds=settings.GPUFLEET_EVENT_CLOSE_AFTER_S)


def observe(kinds: Sequence[str], node_ids: Sequence[int] | None, seen: Iterable[Condition], now: datetime,
            absent_clears: bool = True) -> None:
    """Reconcile the conditions `seen` now with the open (and pending) events of `kinds`
    on the nodes `node_ids` (None: every node and the site). With `absent_clears`, an
    event of those kinds and nodes whose condition is not among `seen` is clearing (or,
    while pending, goes). A fixed number of statements: one read, one insert, one update
    (four on PostgreSQL: bulk.update's COPY), and a delete of pending rows whose condition
    went before they opened."""
    current = Event.objects.filter(kind__in=list(kinds), closed_at__isnull=True)
    if node_ids is not None:
        if not node_ids:
            return
        current = current.filter(node_id__any=list(node_ids))
    existing = {(e.node_id, e.kind, e.code): e for e in _read(current)}
    wait, linger = open_after(), close_after()
    new, changed, gone = [], [], []
    for condition in seen:
        event = existing.pop((condition.node_id, condition.kind, condition.code), None)
        if event is None:
            new.append(_new(condition, now, opened=wait <= timedelta(0)))
        elif _continued(event, condition, now, wait, linger):
            changed.append(event)
    if absent_clears:
        for event in existing.values():
            if event.opened_at is None:
                gone.append(event.pk)
            elif _clearing(event, now, linger):
                changed.append(event)
    # In the caller's transaction (ingest's batch), else one of its own: bulk.update's
    # staging rows last until the commit.
    with transaction.atomic(savepoint=False):
        if gone:
            Event.objects.filter(pk__any=gone, opened_at__isnull=True).delete()
        if new:
            # Another writer may have opened the same condition meanwhile: its row stands.
            Event.objects.bulk_create(new, ignore_conflicts=True)
        if changed:
            # COPY and one UPDATE: Django's bulk_update builds a CASE per row and field,
            # which made detection cost more than the rest of a troubled fleet's batch.
            bulk.update(Event, changed, _CHANGED)


def _read(events: models.QuerySet) -> list[Event]:
    """The rows of `events` as instances, made from the tuples bulk.rows reads (whose
    timestamps psycopg reads in C: Django's loader, in Python, was most of what this read cost)."""
    names = [field.attname for field in Event._meta.concrete_fields]
    return [Event.from_db(events.db, names, row) for row in bulk.rows(events, names)]


def _new(condition: Condition, now: datetime, opened: bool) -> Event:
    return Event(
        kind=condition.kind, severity=condition.severity, node_id=condition.node_id, gpu_index=condition.gpu_index,
        pci_bus_id=condition.pci_bus_id[:32], code=condition.code[:100], name=condition.name[:200],
        message_opened=condition.message, message=condition.message, first_seen_at=now, last_seen_at=now,
        opened_at=now if opened else None, claim_name=condition.claim_name[:100], count=condition.count,
        # Refusals are seen only when they come: clearing at once, continued by the next.
        clear_since=now if condition.kind == Kind.REJECTED_SNAPSHOT else None,
    )


def _continued(event: Event, condition: Condition, now: datetime, wait: timedelta, linger: timedelta) -> bool:
    """Bring `event` up to its condition seen now; whether anything changed. A condition
    seen again unchanged writes nothing (most snapshots repeat the last)."""
    changed = False
    if event.opened_at is None and now - event.last_seen_at > linger + _interval():
        # Pending, and unseen for longer than a clear would last (its node was silent):
        # it must hold again for the whole wait.
        event.first_seen_at, changed = now, True
    if event.kind == Kind.REJECTED_SNAPSHOT:
        event.count, changed = event.count + condition.count, True
    elif event.clear_since is not None:
        event.clear_since, event.count, changed = None, event.count + 1, True
    if _RANK[condition.severity] > _RANK[event.severity]:
        event.severity, changed = condition.severity, True
        event.worsened_at = now if event.opened_at is not None else None
    if condition.message != event.message:
        event.message, changed = condition.message, True
    if event.opened_at is None:
        event.message_opened, changed = event.message, True
        if now - event.first_seen_at >= wait:
            event.opened_at = event.first_seen_at
    if event.kind == Kind.REJECTED_SNAPSHOT:
        # Seen only when refused: clearing at once, continued by the next refusal.
        event.clear_since = now
    if changed:
        event.last_seen_at = now
    return changed


def _clearing(event: Event, now: datetime, linger: timedelta) -> bool:
    """Mark `event`, whose condition is gone, clearing, or closed once it stayed gone
    `linger`; whether anything changed."""
    if event.clear_since is None:
        event.clear_since = now
    elif now - event.clear_since < linger:
        return False
    if now - event.clear_since >= linger:
        event.closed_at = event.clear_since
    return True


def _interval() -> timedelta:
    return timedelta(seconds=settings.GPUFLEET_COLLECT_INTERVAL)


# --- at ingest -------------------------------------------------------------------------

_GPU_CODE = re.compile(r"gpu(\d+)(?:\.|$)")
_SEVERITY = {gpu.Status.WARN: Severity.WARN, gpu.Status.FAIL: Severity.FAIL}
# The kinds a node's accepted snapshot says everything about: what it does not report is gone.
SNAPSHOT_KINDS = (Kind.FINDING, Kind.GPU_VANISHED, Kind.OFFLINE)


def record_snapshots(reports: Sequence[tuple], now: datetime) -> None:
    """The events of a batch of accepted snapshots, each report (node, its findings
    (gpu.Finding), its GPUs (gpu.Device), its vanished GPUs (fleet Device rows)): every
    warn or fail finding is a condition, per code (so per GPU), and so is every vanished
    GPU; a node reporting is not offline. Called inside the batch's transaction."""
    if not settings.GPUFLEET_EVENTS_AT_INGEST:
        return
    seen = []
    for node, findings, devices, vanished in reports:
        pci = None  # made for a node with a condition only: most have none
        for finding in findings:
            severity = _SEVERITY.get(finding.status)
            if severity is None:
                continue
            if pci is None:
                pci = {device.index: device.pci_bus_id or "" for device in devices}
            index, address = _where(finding.code, pci)
            seen.append(Condition(node.pk, Kind.FINDING, finding.code, severity, finding.name, finding.message,
                                  index, address))
        for device in vanished:
            seen.append(Condition(
                node.pk, Kind.GPU_VANISHED, device.uuid, Severity.FAIL, f"GPU {device.index} ({device.name})",
                f"GPU {device.index} {device.name} ({device.uuid}) is no longer reported; last seen "
                f"{device.last_seen:%Y-%m-%d %H:%M} UTC", device.index, device.pci_bus_id or "",
            ))
    observe(SNAPSHOT_KINDS, [node.pk for node, *_ in reports], seen, now)


def _where(code: str, pci: dict[int, str]) -> tuple[int | None, str]:
    """The GPU index and PCI address a finding code names: "gpu3", "gpu3.thermal", "lost:<PCI>"."""
    if match := _GPU_CODE.match(code):
        index = int(match.group(1))
        return index, pci.get(index, "")
    if code.startswith("lost:"):
        return None, code.removeprefix("lost:")
    return None, ""


# Refusals that say nothing bad of the node: a repeat of what was stored.
_HARMLESS_REFUSALS = {"replay"}


def record_refusals(counts: dict[tuple[str, str], int], now: datetime) -> None:
    """Snapshots refused, counted by (node name, refusal reason): an event of the named
    node per reason, open while refusals keep coming. A name no node has is left out
    (anyone can send in any name: it is counted in /metrics only). A fixed number of statements."""
    wanted = {(name, reason): count for (name, reason), count in counts.items()
              if count > 0 and name and reason != "unknown-node"}
    if not wanted:
        return
    nodes = dict(_node_model().objects.filter(name__any=sorted({name for name, _ in wanted}))
                 .values_list("name", "pk"))
    seen = [
        Condition(nodes[name], Kind.REJECTED_SNAPSHOT, reason,
                  Severity.INFO if reason in _HARMLESS_REFUSALS else Severity.WARN, "Rejected snapshots",
                  f"{count} message{'s' if count != 1 else ''} of this node refused: {reason}", count=count)
        for (name, reason), count in sorted(wanted.items()) if name in nodes
    ]
    observe([Kind.REJECTED_SNAPSHOT], sorted({c.node_id for c in seen}), seen, now, absent_clears=False)


def _node_model() -> type[models.Model]:
    # The events app sits below fleet (fleet writes events): it reaches Node through its
    # foreign key, never by import.
    return Event._meta.get_field("node").related_model


# --- by the central beat ---------------------------------------------------------------


def record_offline(offline: Iterable[tuple[int, datetime]], now: datetime | None = None) -> None:
    """Every node offline now, as (pk, last_seen): each an open event; one whose node is
    no longer offline clears (an accepted snapshot clears it too)."""
    now = now or timezone.now()
    seen = [
        Condition(pk, Kind.OFFLINE, "", Severity.FAIL, "Not reporting",
                  f"No snapshot since {last_seen:%Y-%m-%d %H:%M} UTC")
        for pk, last_seen in offline
    ]
    observe([Kind.OFFLINE], None, seen, now)


def record_ingest_silent(reason: str | None, now: datetime | None = None) -> None:
    """The site receiving no snapshots while nodes are enrolled (`reason` says so, with
    when the last one came; None: it hears its nodes): an event of the site, open while
    that lasts (gpufleet/fleet/ingest_health.py decides)."""
    now = now or timezone.now()
    seen = [] if reason is None else [Condition(None, Kind.INGEST_SILENT, "", Severity.FAIL, message=reason)]
    observe([Kind.INGEST_SILENT], None, seen, now)


def record_ended_claims(ended: Iterable[tuple[int, str, datetime]], now: datetime | None = None) -> None:
    """Every claim ended by now and still listed, as (node pk, name, ends_at): each an
    open event until the claim is released or given a later end."""
    now = now or timezone.now()
    seen = [
        Condition(pk, Kind.CLAIM_EXPIRED, name.lower(), Severity.WARN, f"Claim {name}",
                  f"Claim {name!r} ended at {ends_at:%Y-%m-%d %H:%M} UTC: its GPUs are free for other claims",
                  claim_name=name)
        for pk, name, ends_at in ended
    ]
    observe([Kind.CLAIM_EXPIRED], None, seen, now)


def record_once(kind: str, severity: str, node_id: int | None, message: str, *, name: str = "", code: str = "",
                now: datetime | None = None, claim_name: str = "", job_id: int | None = None) -> Event:
    """A one-off event (a key rotated or revoked, a claim released, a fix applied): open
    and closed at once."""
    now = now or timezone.now()
    return Event.objects.create(
        kind=kind, severity=severity, node_id=node_id, code=code[:100], name=name[:200], message_opened=message,
        message=message, first_seen_at=now, opened_at=now, last_seen_at=now, closed_at=now,
        claim_name=claim_name[:100], job_id=job_id,
    )


def claim_released(node_id: int, name: str, user=None, now: datetime | None = None,
                   reason: str = "as it had ended") -> Event:
    """A claim deleted: by `user`, or (None) by the system, for `reason`."""
    who = user.get_username() if user is not None and user.is_authenticated else f"the system, {reason}"
    return record_once(Kind.CLAIM_RELEASED, Severity.INFO, node_id, f"Claim {name!r} released by {who}",
                       name=f"Claim {name}", code=name.lower(), now=now, claim_name=name)


def claim_idle(node_id: int, name: str, message: str, now: datetime | None = None) -> Event:
    """A claim's owner told that none of its GPUs did any work for GPUFLEET_IDLE_HOURS:
    once per idle spell, in `message` (what the owner was told)."""
    return record_once(Kind.CLAIM_IDLE, Severity.WARN, node_id, message, name=f"Claim {name} idle",
                       code=name.lower(), now=now, claim_name=name)


def usage_report(month: str, title: str, text: str, now: datetime | None = None) -> Event:
    """The fleet's usage of `month` (YYYY-MM), an event of the site, for the alert rules
    that send usage-report events to their channels."""
    return record_once(Kind.USAGE_REPORT, Severity.INFO, None, text, name=title, code=month, now=now)


def ingest_dead_letter(node_name: str, error: str, letter_id: str, now: datetime | None = None) -> Event:
    """An ingest entry that failed twice, set aside as dead letter `letter_id`: an event of
    the site (the node an entry names is only what it says), naming that node and the error."""
    return record_once(Kind.INGEST_DEAD_LETTER, Severity.WARN, None,
                       f"An ingest entry of node {node_name!r} failed twice and was set aside as dead letter "
                       f"{letter_id}: {error} (`manage.py ingest --dead-letters` lists them, "
                       "`--replay-dead-letter ID` stores one again once the cause is fixed)",
                       name=f"Ingest entry of {node_name} set aside", code=letter_id, now=now)


def key_changed(node_name: str, revoked: bool, generation: int | None = None, now: datetime | None = None) -> Event:
    """A node's key rotated (to `generation`) or revoked; the node found by name (a node
    may be enrolled before its first snapshot: then the event is the site's, and its name
    says whose key it was)."""
    node_id = _node_model().objects.filter(name=node_name).values_list("pk", flat=True).first()
    what = "Node key" if node_id is not None else f"Key of {node_name}"
    if revoked:
        return record_once(Kind.KEY_REVOKED, Severity.WARN, node_id, f"The key of {node_name} was revoked: nothing it "
                           "signs is accepted any more", name=f"{what} revoked", now=now)
    return record_once(Kind.KEY_ROTATED, Severity.INFO, node_id, f"The key of {node_name} was rotated to generation "
                       f"{generation}: its agent needs the new one", name=f"{what} rotated", now=now)


def record_fix(job_id: int, now: datetime | None = None) -> Event | None:
    """A fix job that finished: applied (info), or failed (warn), with its job."""
    job_model = Event._meta.get_field("job").related_model
    job = job_model.objects.filter(pk=job_id, kind="fix").values("node_id", "fix_code", "status", "error").first()
    if job is None or job["status"] not in ("done", "failed"):
        return None
    done = job["status"] == "done"
    message = f"Fix {job['fix_code']} applied" if done else f"Fix {job['fix_code']} failed: {job['error']}"
    return record_once(Kind.FIX_APPLIED, Severity.INFO if done else Severity.WARN, job["node_id"], message,
                       name=f"Fix {job['fix_code']}", code=job["fix_code"], now=now, job_id=job_id)


_DIAGNOSTIC_SEVERITY = {"pass": Severity.INFO, "warn": Severity.WARN, "fail": Severity.FAIL, "error": Severity.WARN}
_DIAGNOSTIC_WORDS = {"pass": "passed", "warn": "passed with warnings", "fail": "failed", "error": "did not run"}


def record_diagnostic(job_id: int, node_id: int, level: int | None, verdict: str, summary: str,
                      now: datetime | None = None) -> Event:
    """A DCGM diagnostic that ended, with its job: passed (info), with warnings or not run
    (warn), failed (fail). A failed run's finding is an event of its own while it lasts."""
    return record_once(Kind.DIAGNOSTIC, _DIAGNOSTIC_SEVERITY.get(verdict, Severity.WARN), node_id,
                       f"DCGM diagnostic -r {level} {_DIAGNOSTIC_WORDS.get(verdict, verdict)}: {summary}",
                       name=f"DCGM diagnostic -r {level}", code=f"r{level}", now=now, job_id=job_id)


def close_cleared(now: datetime | None = None) -> int:
    """Close the events that stayed clear long enough while nothing observed them (their
    node went silent, refusals stopped): closed at `clear_since`. Refusals come once a
    collect interval at most, so theirs wait one interval more. One statement."""
    now = now or timezone.now()
    linger = close_after()
    due = models.Q(kind=Kind.REJECTED_SNAPSHOT, clear_since__lte=now - linger - _interval()) | (
        ~models.Q(kind=Kind.REJECTED_SNAPSHOT) & models.Q(clear_since__lte=now - linger))
    return Event.objects.filter(due, closed_at__isnull=True, opened_at__isnull=False).update(
        closed_at=models.F("clear_since"))


def prune(now: datetime | None = None) -> int:
    """Delete the events closed more than GPUFLEET_EVENT_RETENTION_DAYS ago."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.GPUFLEET_EVENT_RETENTION_DAYS)
    deleted, _ = Event.objects.filter(closed_at__lt=cutoff).delete()
    return deleted


TIMELINE_LENGTH = 20


def timeline(node_id: int, limit: int = TIMELINE_LENGTH) -> list[Event]:
    """A node's last events (opened ones), newest first, for its page."""
    return list(Event.objects.filter(node_id=node_id, opened_at__isnull=False).order_by("-opened_at", "-id")[:limit])


def open_count() -> int:
    """How many events are open now (the navigation's figure)."""
    return Event.objects.filter(closed_at__isnull=True, opened_at__isnull=False).count()
