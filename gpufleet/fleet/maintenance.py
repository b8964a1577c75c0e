"""Node maintenance: a node taken out of service until a time, for a reason. While
in maintenance it takes no new claim, find-a-node leaves it out, alerts send
nothing for it and the overview shows it as in maintenance instead of its health;
its events are still recorded. It ends on its own: every reader compares `until`
with now, so no task has to end it. Setting and ending it are audited.

Validation: a node may also be "in validation" (after maintenance, or when asked):
it takes no new claim until a DCGM diagnostic of at least the level asked for passes.
`closed_to_claims` is the one place that says whether a node takes new claims."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.utils import timezone

from gpufleet.audit.models import Action, record
from gpufleet.core.access import MANAGE_ALERTS, can
from gpufleet.fleet import summary_keep
from gpufleet.fleet.models import Maintenance, Node, Validation
from gpufleet.gpu import dcgm

REASON_MAX = Maintenance.REASON_MAX


class MaintenanceError(ValueError):
    """A maintenance change was refused; the text is a sentence for people."""


class MaintenanceNotYours(MaintenanceError):
    """Refused for the person's role, not for what they typed."""


def active(now: datetime | None = None) -> Q:
    """Nodes in maintenance now, as a filter of Node."""
    return Q(maintenance__until__gt=now or timezone.now())


def in_maintenance_flag(now: datetime | None = None) -> Case:
    """An annotation of Node: True while it is in maintenance (no extra query).
    A left join of the one-to-one row, not an EXISTS: the database repeats an
    annotation's subquery for every node at each place the query reads it, and the
    overview's figures read it several times over the whole fleet."""
    return Case(When(active(now), then=Value(True)), default=Value(False), output_field=BooleanField())


def in_validation_flag() -> Case:
    """An annotation of Node: True while it is in validation (a left join, as above)."""
    return Case(When(validation__isnull=False, then=Value(True)), default=Value(False), output_field=BooleanField())


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


def start(node: Node, until: datetime | None, reason: str, user, now: datetime | None = None,
          validate_level: int | None = None) -> Maintenance:
    """Put `node` in maintenance until `until` (or change the end and reason of the
    one it is in). Raises MaintenanceError for an end not in the future or no reason, and
    MaintenanceNotYours for one past GPUFLEET_MAINTENANCE_MAX_DAYS unless the admin role asks.
    With `validate_level`, the node is also in validation: after the maintenance it takes
    no new claim until a DCGM diagnostic of that level (or higher) passes."""
    now = now or timezone.now()
    reason = (reason or "").strip()
    if until is None:
        raise MaintenanceError("Say until when the node is in maintenance.")
    if timezone.is_naive(until):
        until = timezone.make_aware(until)
    if until <= now:
        raise MaintenanceError("The end of the maintenance must be in the future.")
    longest = settings.GPUFLEET_MAINTENANCE_MAX_DAYS
    # Maintenance mutes the node's alerts, as a silence does, and silences are the admin role's.
    if until - now > timedelta(days=longest) and not can(user, MANAGE_ALERTS):
        raise MaintenanceNotYours(f"A maintenance longer than {longest} days (GPUFLEET_MAINTENANCE_MAX_DAYS) is the "
                                  "admin role's: end it sooner, or ask an admin.")
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
        if validate_level is not None:
            start_validation(node, validate_level, f"after maintenance: {reason}", user, now)
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


# --- validation ---------------------------------------------------------------------------


def validation_of_loaded(node: Node) -> Validation | None:
    """The node's validation, without a query for a node read with select_related("validation")."""
    try:
        return node.validation
    except Validation.DoesNotExist:
        return None


def current_validation(node: Node) -> Validation | None:
    """The node's validation, if it is in one (with its author), else None."""
    return Validation.objects.filter(node=node).select_related("author").first()


def start_validation(node: Node, level: int, reason: str, user, now: datetime | None = None) -> Validation:
    """Put `node` in validation (or change the level and reason of the one it is in):
    no new claim until a DCGM diagnostic of `level` or higher passes after now."""
    if level not in dcgm.LEVELS:
        raise MaintenanceError(f"A validating diagnostic is of level {' or '.join(map(str, dcgm.LEVELS))}.")
    reason = (reason or "").strip()[:REASON_MAX]
    with transaction.atomic():
        row = Validation.objects.select_for_update().filter(node=node).first()
        before = row.as_audit_dict() if row is not None else None
        row = row or Validation(node=node)
        row.since, row.level, row.reason = now or timezone.now(), level, reason
        row.author = user if user is not None and user.is_authenticated else None
        row.save()
        record(user, Action.VALIDATION_START, node=node, target=node.name, before=before, after=row.as_audit_dict())
    return row


def end_validation(node: Node, user, why: str = "ended by hand") -> None:
    """End the node's validation (by hand, or `user` None: by a passing run, `why` says
    which). Raises MaintenanceError when it is in none."""
    with transaction.atomic():
        row = Validation.objects.select_for_update().filter(node=node).first()
        if row is None:
            raise MaintenanceError(f"Node {node.name} is not in validation.")
        before = row.as_audit_dict()
        row.delete()
        record(user, Action.VALIDATION_END, node=node, target=node.name, before=before, after={"why": why})


def validated_by(node_id: int, level: int, passed_at: datetime, job_id: int) -> bool:
    """A DCGM diagnostic of `level` passed on the node at `passed_at`: its validation (one
    asked before then, for that level or lower) ends, audited as the system's."""
    row = Validation.objects.filter(node_id=node_id, since__lte=passed_at, level__lte=level).select_related("node").first()
    if row is None:
        return False
    try:
        end_validation(row.node, None, why=f"DCGM diagnostic -r {level} passed (job {job_id})")
    except MaintenanceError:  # ended meanwhile
        return False
    return True


class Closed:
    """Why a node takes no new claim now: `kind` is "maintenance" or "validation"."""

    def __init__(self, kind: str, sentence: str) -> None:
        self.kind, self.sentence = kind, sentence


def closed_to_claims(node: Node, now: datetime | None = None) -> Closed | None:
    """Whether `node` takes new claims now, and if not why: in maintenance, or in
    validation until a DCGM diagnostic passes. The one place the claims ask."""
    now = now or timezone.now()
    if (away := current(node, now)) is not None:
        return Closed("maintenance", f"node {node.name} is in maintenance until {away.until:%Y-%m-%d %H:%M %Z} "
                                     f"({away.reason}) and takes no new claim; claim another node or end its "
                                     "maintenance first")
    row = Validation.objects.filter(node=node).first()
    if row is not None:
        return Closed("validation", f"node {node.name} is in validation since {row.since:%Y-%m-%d %H:%M %Z} and "
                                    f"takes no new claim until a DCGM diagnostic -r {row.level} passes; claim another "
                                    "node, or run the diagnostic from its page")
    return None
