"""Node maintenance: a node taken out of service until a time, for a reason. While
in maintenance it takes no new claim, find-a-node leaves it out, alerts send
nothing for it and the overview shows it as in maintenance instead of its health;
its events are still recorded. It ends on its own: every reader compares `until`
with now, so no task has to end it. Setting and ending it are audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.utils import timezone

from gpufleet.audit.models import Action, record
from gpufleet.fleet import summary_keep
from gpufleet.fleet.models import Maintenance, Node

REASON_MAX = Maintenance.REASON_MAX


class MaintenanceError(ValueError):
    """A maintenance change was refused; the text is a sentence for people."""


def active(now: datetime | None = None) -> Q:
    """Nodes in maintenance now, as a filter of Node."""
    return Q(maintenance__until__gt=now or timezone.now())


def in_maintenance_flag(now: datetime | None = None) -> Case:
    """An annotation of Node: True while it is in maintenance (no extra query).
    A left join of the one-to-one row, not an EXISTS: the database repeats an
    annotation's subquery for every node at each place the query reads it, and the
    overview's figures read it several times over the whole fleet."""
    return Case(When(active(now), then=Value(True)), default=Value(False), output_field=BooleanField())


def nodes_in_maintenance(now: datetime | None = None) -> QuerySet[Node]:
    """The nodes in maintenance at `now` (default: now)."""
    return Node.objects.filter(active(now))


def is_in_maintenance(node: Node, now: datetime | None = None) -> bool:
    return current(node, now) is not None


def current(node: Node, now: datetime | None = None) -> Maintenance | None:
    """The node's maintenance if it is in maintenance at `now`, else None."""
    return Maintenance.objects.filter(node=node, until__gt=now or timezone.now()).select_related("author").first()


def of_loaded(node: Node, now: datetime | None = None) -> Maintenance | None:
    """`current` without a query for a node read with select_related("maintenance")."""
    try:
        row = node.maintenance
    except Maintenance.DoesNotExist:
        return None
    return row if row.until > (now or timezone.now()) else None


def start(node: Node, until: datetime | None, reason: str, user, now: datetime | None = None) -> Maintenance:
    """Put `node` in maintenance until `until` (or change the end and reason of the
    one it is in). Raises MaintenanceError for an end not in the future or no reason."""
    now = now or timezone.now()
    reason = (reason or "").strip()
    if until is None:
        raise MaintenanceError("Say until when the node is in maintenance.")
    if timezone.is_naive(until):
        until = timezone.make_aware(until)
    if until <= now:
        raise MaintenanceError("The end of the maintenance must be in the future.")
    if not reason:
        raise MaintenanceError("Say why the node is in maintenance.")
    if len(reason) > REASON_MAX:
        raise MaintenanceError(f"The reason is longer than {REASON_MAX} characters.")
    with transaction.atomic():
        row = Maintenance.objects.select_for_update().filter(node=node).first()
        before = row.as_audit_dict() if row is not None and row.until > now else None
        if row is None:
            row = Maintenance(node=node)
        if before is None:
            # A new maintenance (or one whose end had passed): a new start and author.
            row.started_at = now
            row.author = user if user is not None and user.is_authenticated else None
        row.until, row.reason = until, reason
        row.save()
        record(user, Action.MAINTENANCE_START, node=node, target=node.name, before=before, after=row.as_audit_dict())
        summary_keep.changed()
    return row


def end(node: Node, user, now: datetime | None = None) -> None:
    """End the node's maintenance now. Raises MaintenanceError when it is in none."""
    now = now or timezone.now()
    with transaction.atomic():
        row = Maintenance.objects.select_for_update().filter(node=node, until__gt=now).first()
        if row is None:
            raise MaintenanceError(f"Node {node.name} is not in maintenance.")
        before = row.as_audit_dict()
        row.delete()
        record(user, Action.MAINTENANCE_END, node=node, target=node.name, before=before, after=None)
        summary_keep.changed()
