"""Changing claims. Every change is checked by the ledger against the node's
other claims inside one transaction that holds the node row locked, so two
admins saving at once cannot double-book a GPU; every change is audited.

Everything that can refuse a change raises a `ClaimError` with a stable `code`
(the ledger's machine codes plus name_taken, maintenance, validation, stale, gone, version_required,
quota_exceeded and forbidden) and a sentence for people, so the editor and the API report the same
reasons the same way. Who may book and change what is `gpufleet.claims.rights`, asked here."""

from __future__ import annotations

import unicodedata
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpufleet import gpu
from gpufleet.audit.models import record
from gpufleet.claims import quota, rights
from gpufleet.claims.models import Claim
from gpufleet.events import services as events
from gpufleet.fleet import maintenance, summary_keep
from gpufleet.fleet.models import Node
from gpufleet.gpu import quota as gpu_quota
from gpufleet.teams.models import Team


class ClaimError(Exception):
    """A claim change was refused. `code` is stable for machines; `message` is a sentence."""

    code = "claim_error"

    @property
    def message(self) -> str:
        return sentence(str(self))


class ClaimRejected(ClaimError):
    """The ledger refused the claim; `error` carries the machine code and sentence."""

    def __init__(self, error: gpu.FitError):
        super().__init__(str(error))
        self.error = error
        self.code = error.code


class NameTaken(ClaimError):
    code = "name_taken"

    def __init__(self, name: str, node_name: str):
        super().__init__(f"node {node_name} already has a claim named {name!r}")
        self.name = name


class BadName(ClaimError):
    code = "invalid"

    def __init__(self, problem: str) -> None:
        super().__init__(f"the claim name {problem}")


class BadTerms(ClaimError):
    """A bad owner, contact or window; `field` names which."""

    code = "invalid"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


class SeriesRejected(ClaimError):
    """Occurrences of a repeating booking do not fit; `conflicts` lists each with the
    ledger's refusal, and nothing of the series is saved."""

    code = "series_conflict"

    def __init__(self, conflicts: list[tuple[gpu.Claim, gpu.FitError]], total: int) -> None:
        shown = "; ".join(f"{claim.name} ({claim.window()}): {error}" for claim, error in conflicts)
        super().__init__(f"{len(conflicts)} of {total} occurrences do not fit, so none is saved: {shown}")
        self.conflicts = conflicts


class NotAllowed(ClaimError):
    """The person may not make this change (gpufleet.claims.rights)."""

    code = "forbidden"


@dataclass(frozen=True)
class Terms:
    """Who answers for a claim, its team and its window; nothing here decides whether it fits."""

    owner: object = None  # a user, or None for nobody
    contact: str = ""
    starts_at: datetime | None = None  # None: now
    ends_at: datetime | None = None  # None: no end
    team: Team | None = None  # None: the edited claim's, or the person's only team


class QuotaExceeded(ClaimError):
    """The booking would take the team over one of its quotas (gpufleet/gpu/quota.py);
    `exceeded` names the quota, what the team holds and what the booking asks."""

    code = "quota_exceeded"

    def __init__(self, exceeded: gpu_quota.Exceeded) -> None:
        super().__init__(f"{exceeded}; an admin may book over the quota, saying why")
        self.exceeded = exceeded


class OverrideRefused(ClaimError):
    """A reason to book over quota came from someone who may not give one (`quota.may_override`)."""

    code = "forbidden"
    field = "quota_override_reason"

    def __init__(self) -> None:
        super().__init__("only an admin may book over a team's quota")


class InMaintenance(ClaimError):
    """A new claim on a node closed to claims (gpufleet.fleet.maintenance.closed_to_claims):
    in maintenance (code "maintenance") or in validation until a DCGM diagnostic passes
    (code "validation")."""

    code = "maintenance"

    def __init__(self, closed: maintenance.Closed) -> None:
        super().__init__(closed.sentence)
        self.code = closed.kind


class StaleClaim(ClaimError):
    """The claim changed since the editor loaded it; saving would overwrite that change."""

    code = "stale"

    def __init__(self, action: str = "save") -> None:
        super().__init__(f"this claim was changed by someone else meanwhile; review and {action} again")


class ClaimGone(ClaimError):
    code = "gone"

    def __init__(self) -> None:
        super().__init__("this claim was deleted by someone else meanwhile")


# The name of the version token wherever people send it (the form field, the API's
# body field and query parameter), so every refusal names the same field.
VERSION_FIELD = "updated_at"


class VersionRequired(ClaimError):
    """An edit or delete came without the version the claim was read at, or with one
    this site never wrote. Refused: without it a change made meanwhile would be
    silently overwritten."""

    code = "version_required"

    def __init__(self, missing: bool = True, action: str = "save") -> None:
        problem = "is required" if missing else "is not readable (it must be the claim's updated_at as ISO 8601)"
        super().__init__(
            f"the claim's version ({VERSION_FIELD}) {problem}, so that a change made meanwhile is not "
            f"overwritten; review the claim as it is now and {action} again"
        )
        self.missing = missing


def sentence(text: str) -> str:
    """The ledger speaks in clauses ("needs 3 GPUs but ..."); people read sentences."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def parse_version(raw, action: str = "save") -> datetime:
    """The version token an editor or API caller sends back: the claim's `updated_at`
    as ISO 8601, time zone included (as `isoformat()` writes it). Raises VersionRequired
    when it is missing or unreadable; people's edits and deletes never go unchecked."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise VersionRequired(missing=True, action=action)
    try:
        parsed = datetime.fromisoformat(raw.strip()) if isinstance(raw, str) else None
    except ValueError:
        parsed = None
    # A time without a zone is not one we wrote, and would never equal a stored one.
    if parsed is None or parsed.tzinfo is None:
        raise VersionRequired(missing=False, action=action)
    return parsed


def check_claim(node: Node, proposed: gpu.Claim, editing: Claim | None = None) -> gpu.FitError | None:
    """Would `proposed` fit over what is left of its window (no start: from now) beside
    the node's other claims that meet it? For inline validation; `save_claim` checks
    again under lock. The past is not booked again: an edit of a claim in force is
    checked from now on."""
    now = timezone.now()
    proposed = replace(proposed, starts_at=max(proposed.starts_at or now, now))
    others = node.claims.overlapping(proposed.starts_at, proposed.ends_at).select_related("team")
    if editing is not None and editing.pk:
        others = others.exclude(pk=editing.pk)
    return node.ledger(claims=list(others)).fit(proposed)


def window(terms: Terms | None, editing: Claim | None, now: datetime) -> tuple[datetime, datetime | None]:
    """The window a save gives the claim: the terms' (no start: now, or for an edited claim
    already started, its own start); without terms, an edited claim keeps its own and a
    new one starts now with no end."""
    if terms is not None:
        if terms.starts_at is not None:
            return terms.starts_at, terms.ends_at
        started = editing is not None and editing.starts_at <= now
        return (editing.starts_at if started else now), terms.ends_at
    if editing is not None:
        return editing.starts_at, editing.ends_at
    return now, None


# Characters that make a name read differently from what it is: controls, and the
# bidirectional overrides and isolates that can make "train" display as "niart".
_BIDI_CONTROLS = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


UNREADABLE = "may not hold control or text-direction characters"


def is_unreadable(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" or c in _BIDI_CONTROLS for c in text)


# How far in the past a start may be given: the minute a person took to fill the form.
START_SLACK = timedelta(minutes=1)


def check_terms(terms: Terms, editing: Claim | None = None) -> BadTerms | None:
    """A readable contact, and a window that starts no earlier than a minute ago, ends
    after it starts, is not over and is no longer than GPUFLEET_MAX_RESERVATION_DAYS (an
    edit may keep its own times, which the editor shows to the minute)."""
    if is_unreadable(terms.contact):
        return BadTerms("contact", f"the contact {UNREADABLE}")
    now = timezone.now()
    starts_at, ends_at = window(terms, editing, now)
    if starts_at < now - START_SLACK and not _kept(starts_at, editing and editing.starts_at):
        return BadTerms("starts_at", "the start is already past; leave it empty to start now")
    if ends_at is not None and ends_at <= now and not _kept(ends_at, editing and editing.ends_at):
        return BadTerms("ends_at", "the end is already past; leave it empty for a claim with no end")
    if ends_at is not None and ends_at <= starts_at:
        return BadTerms("ends_at", "the end must come after the start")
    longest = settings.GPUFLEET_MAX_RESERVATION_DAYS
    if ends_at is not None and ends_at - starts_at > timedelta(days=longest) and not _kept(ends_at, editing and editing.ends_at):
        return BadTerms("ends_at", f"the window is longer than the site's limit of {longest} days"
                                   " (GPUFLEET_MAX_RESERVATION_DAYS)")
    return None


def _kept(moment: datetime, stored: datetime | None) -> bool:
    return stored is not None and _minute(moment) == _minute(stored)


def _minute(moment: datetime | None) -> datetime | None:
    return moment.replace(second=0, microsecond=0) if moment is not None else None


def check_name(node: Node, name: str, editing: Claim | None = None) -> ClaimError | None:
    """Is `name` a readable name, free on the node ignoring case (the claim being
    edited may keep its own)?"""
    if is_unreadable(name):
        return BadName(UNREADABLE)
    others = node.claims.filter(name__iexact=name)
    if editing is not None and editing.pk:
        others = others.exclude(pk=editing.pk)
    return NameTaken(name, node.name) if others.exists() else None


def _person(user) -> bool:
    # The system's own changes (expiry, idle release, tests' set-up) come with no user.
    return user is not None and user.is_authenticated


def allowed_team(user, editing: Claim | None, terms: Terms | None):
    """The claim's team after the save, once `user` may make it (rights): the terms'
    team, else the edited claim's, else the person's only team. Raises NotAllowed, or
    BadTerms for a team to choose or an owner outside the team. The system is not asked.
    The editor asks it for inline validation; `save_claim` again under the node lock."""
    team = (terms.team if terms is not None else None) or (editing.team if editing is not None else None)
    if not _person(user):
        return team
    person = rights.of(user)
    if team is None and person.may_book_somewhere():
        team, choices = rights.default_team(person)
        if team is None:
            named = ", ".join(choices[:rights.CHOICES_SHOWN]) + (", ..." if len(choices) > rights.CHOICES_SHOWN else "")
            raise BadTerms("team", f"say which team the claim is for: {named}" if choices else
                           "there is no team to book for yet: an admin may make one first (Admin → Teams, or POST /api/teams/)")
    if terms is not None:
        owner = terms.owner
    else:
        owner = editing.owner if editing is not None else user
    reason = rights.refusal(person, user, editing, team, owner)
    if reason is not None:
        raise NotAllowed(reason)
    moved = editing is None or editing.team_id != team.pk
    given = editing is None or (owner.pk if owner is not None else None) != editing.owner_id
    if owner is not None and owner != user and (moved or given) and not rights.is_member(team, owner):
        raise BadTerms("owner", f"{owner.get_username()} is not a member of team {team.name}")
    return team


def check_release(claim: Claim, user) -> None:
    """Raises NotAllowed unless `user` may release `claim` (the system may)."""
    if _person(user) and (reason := rights.release_refusal(rights.of(user), claim)) is not None:
        raise NotAllowed(reason)


def is_stale(claim: Claim, expected_updated_at: datetime | None) -> bool:
    """Whether the claim was saved since the editor read it at `expected_updated_at`."""
    return expected_updated_at is not None and claim.updated_at != expected_updated_at


def save_claim(
    node: Node,
    proposed: gpu.Claim,
    user,
    editing: Claim | None = None,
    expected_updated_at: datetime | None = None,
    terms: Terms | None = None,
    quota_override_reason: str | None = None,
) -> Claim:
    """Create or (with `editing`) replace a claim, over the window its `terms` give
    (`window`). Without `terms` a new claim is owned by `user`, starts now and has no
    end; an edited one keeps its own. Its team: `allowed_team`. Raises NotAllowed, NameTaken,
    BadName, BadTerms, ClaimRejected, InMaintenance (a new claim on a node in
    maintenance or validation), StaleClaim (the claim changed after
    `expected_updated_at`) or ClaimGone. The editor and the API always pass
    `expected_updated_at` for an edit (see parse_version); None, no check, is for
    the system's own changes. A claim that would take its team over a quota raises
    QuotaExceeded, unless an admin gives `quota_override_reason` (OverrideRefused from
    anyone else); see `_override_reason` for what the claim keeps."""
    if terms is not None:
        bad = check_terms(terms, editing)
        if bad is not None:
            raise bad
    check_override(user, quota_override_reason)
    try:
        with transaction.atomic():
            locked_team = _lock_team(user, terms, editing)
            locked = Node.objects.select_for_update().get(pk=node.pk)
            if editing is not None:
                try:
                    editing = Claim.objects.get(pk=editing.pk, node=locked)
                except Claim.DoesNotExist:
                    raise ClaimGone() from None
                if is_stale(editing, expected_updated_at):
                    raise StaleClaim()
            team = _same_team(allowed_team(user, editing, terms), locked_team)
            if editing is None and (closed := maintenance.closed_to_claims(locked)) is not None:
                raise InMaintenance(closed)
            taken = check_name(locked, proposed.name, editing)
            if taken is not None:
                raise taken
            starts_at, ends_at = window(terms, editing, timezone.now())
            proposed = replace(proposed, starts_at=starts_at, ends_at=ends_at, team=team.name if team else "")
            error = check_claim(locked, proposed, editing)
            if error is not None:
                raise ClaimRejected(error)
            over = _over_quota(team, locked, [proposed], quota_override_reason, editing)
            before = editing.as_audit_dict() if editing is not None else None
            claim = editing or Claim(node=locked, created_by=user if user and user.is_authenticated else None)
            claim.name = proposed.name
            claim.count = proposed.count if not proposed.device_ids else 0
            claim.device_ids = list(proposed.device_ids)
            claim.missing_devices = []
            # A moved start or end is reminded again at its new time (gpufleet/usage/reminders.py).
            if claim.starts_at != starts_at:
                claim.start_reminded_at = None
            if claim.ends_at != ends_at:
                claim.end_reminded_at = None
            claim.starts_at, claim.ends_at = starts_at, ends_at
            if terms is not None:
                claim.owner, claim.contact = terms.owner, terms.contact
            elif editing is None:
                claim.owner = claim.created_by
            if team is not None:
                claim.team = team
            claim.quota_override_reason = _override_reason(over, quota_override_reason, editing)
            claim.save()
            _store_reserved(locked)
            action = "claim.update" if before is not None else "claim.create"
            record(user, action, node=locked, target=claim.name, before=before, after=claim.as_audit_dict())
    except IntegrityError:
        # Only (node, name) is unique; the check above runs under the node lock, so
        # this is a writer that bypassed the lock. Same answer as the check.
        raise NameTaken(proposed.name, node.name) from None
    return claim


def occurrence_names(name: str, starts: list[datetime]) -> list[str]:
    """Each occurrence's claim name: the series' name and its day in the site's time zone
    ("lab-2026-12-08"), with the time too when the rule repeats within a day."""
    local = [timezone.localtime(start) for start in starts]
    daily = len({start.date() for start in local}) == len(local)
    return [f"{name}-{start:%Y-%m-%d}" if daily else f"{name}-{start:%Y-%m-%d-%H%M}" for start in local]


def plan_series(node: Node, proposed: gpu.Claim, terms: Terms, rule: str) -> list[gpu.Claim]:
    """The occurrences of `proposed` over the window of `terms` (which must end) repeated by
    the iCalendar RRULE `rule`, named by `occurrence_names`, each checked by the ledger beside
    the node's claims and the occurrences before it. Raises BadTerms (field "repeat" for a
    bad rule), BadName, NameTaken or SeriesRejected, which lists every conflict. For the
    form's validation; `save_series` asks again under the node lock."""
    bad = check_terms(terms)
    if bad is not None:
        raise bad
    starts_at, ends_at = window(terms, None, timezone.now())
    if ends_at is None:
        raise BadTerms("ends_at", "a repeating booking needs an end: each occurrence lasts as long as the first")
    first = timezone.localtime(starts_at)
    horizon = first + timedelta(days=settings.GPUFLEET_MAX_SERIES_DAYS)
    try:
        windows = gpu.occurrences(rule, first, timezone.localtime(ends_at), horizon=horizon)
    except gpu.BadRule as exc:
        raise BadTerms("repeat", str(exc)) from None
    names = occurrence_names(proposed.name, [start for start, _ in windows])
    longest = Claim._meta.get_field("name").max_length
    if max(len(name) for name in names) > longest:
        raise BadName(f"with the date of each occurrence added is longer than {longest} characters")
    for name in names:
        taken = check_name(node, name)
        if taken is not None:
            raise taken
    occurrences = [replace(proposed, name=name, starts_at=start, ends_at=end) for name, (start, end) in zip(names, windows, strict=True)]
    others = node.claims.overlapping(windows[0][0], windows[-1][1]).select_related("team")
    conflicts = gpu.series_conflicts(node.ledger(claims=list(others)), occurrences)
    if conflicts:
        raise SeriesRejected(conflicts, len(occurrences))
    return occurrences


def save_series(node: Node, proposed: gpu.Claim, user, terms: Terms, rule: str,
                quota_override_reason: str | None = None) -> list[Claim]:
    """Create a repeating booking (`plan_series`) as one claim per occurrence sharing a new
    series id: all checked under the node lock and saved, audited as single claims are,
    or none. Raises what plan_series raises, InMaintenance, and as save_claim does
    QuotaExceeded (all the occurrences count together) or OverrideRefused."""
    check_override(user, quota_override_reason)
    series = uuid.uuid4()
    saved = []
    with transaction.atomic():
        locked_team = _lock_team(user, terms, None)
        locked = Node.objects.select_for_update().get(pk=node.pk)
        team = _same_team(allowed_team(user, None, terms), locked_team)
        if (closed := maintenance.closed_to_claims(locked)) is not None:
            raise InMaintenance(closed)
        creator = user if user and user.is_authenticated else None
        planned = plan_series(locked, replace(proposed, team=team.name if team else ""), terms, rule)
        over = _over_quota(team, locked, planned, quota_override_reason)
        for occurrence in planned:
            claim = Claim.objects.create(
                node=locked, team=team, created_by=creator, name=occurrence.name,
                count=proposed.count if not proposed.device_ids else 0, device_ids=list(proposed.device_ids),
                starts_at=occurrence.starts_at, ends_at=occurrence.ends_at,
                owner=terms.owner, contact=terms.contact, series=series,
                quota_override_reason=_override_reason(over, quota_override_reason, None),
            )
            record(user, "claim.create", node=locked, target=claim.name, after=claim.as_audit_dict())
            saved.append(claim)
        _store_reserved(locked)
    return saved


# --- quotas: the team's row is locked before the node's, always in that order ------


def check_override(user, reason: str | None) -> None:
    """Refuse a reason to book over quota from anyone but an admin (before anything is locked)."""
    if reason and reason.strip() and not quota.may_override(user):
        raise OverrideRefused()


def _lock_team(user, terms: Terms | None, editing: Claim | None) -> Team | None:
    """The team the claim is saved for (the terms', else the edited claim's, else the
    person's only one: as `allowed_team` picks it), its row locked so that two bookings of
    one team, on any nodes, are checked against its quotas one after the other. Locked
    before the node, always: two saves never wait on each other crosswise."""
    team = (terms.team if terms is not None else None) or (editing.team if editing is not None else None)
    if team is None and _person(user):
        team, _ = rights.default_team(rights.of(user))
    if team is None:
        return None
    try:
        return Team.objects.select_for_update().get(pk=team.pk)
    except Team.DoesNotExist:
        raise BadTerms("team", "this team was deleted meanwhile") from None


def _same_team(team: Team | None, locked: Team | None) -> Team | None:
    """The team `allowed_team` gave, which must be the one locked: it differs only when the
    edited claim was moved to another team by someone else meanwhile."""
    if team is not None and (locked is None or locked.pk != team.pk):
        raise StaleClaim()
    return locked


def _over_quota(team: Team | None, node: Node, proposed: list[gpu.Claim], reason: str | None,
                editing: Claim | None = None) -> gpu_quota.Exceeded | None:
    """The quota the claims would exceed (None: none, or no team); raises QuotaExceeded
    unless a reason to book over it was given (by an admin: see check_override)."""
    over = quota.exceeded(team, node, proposed, editing) if team is not None else None
    if over is not None and not (reason and reason.strip()):
        raise QuotaExceeded(over)
    return over


def _override_reason(over: gpu_quota.Exceeded | None, given: str | None, editing: Claim | None) -> str:
    """What the claim keeps as its reason to be over quota: the one given when it is over;
    otherwise none for a new claim, and for an edit the one given or else its own."""
    if over is not None:
        return (given or "").strip()
    if editing is None:
        return ""
    return given.strip() if given is not None else editing.quota_override_reason


def delete_claim(claim: Claim, user, expected_updated_at: datetime | None = None,
                 reason: str = "as it had ended") -> None:
    """Delete a claim. Raises StaleClaim (changed after `expected_updated_at`), ClaimGone or NotAllowed.
    `user` None is the system (the audit log shows "system"; its claim-released event
    gives `reason`). As for save_claim, people's deletes always pass `expected_updated_at`."""
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=claim.node_id)
        try:
            claim = Claim.objects.get(pk=claim.pk, node=locked)
        except Claim.DoesNotExist:
            raise ClaimGone() from None
        if is_stale(claim, expected_updated_at):
            raise StaleClaim("delete")
        check_release(claim, user)
        before = claim.as_audit_dict()
        claim.delete()
        _store_reserved(locked)
        record(user, "claim.delete", node=locked, target=before["name"], before=before)
        events.claim_released(locked.pk, before["name"], user, reason=reason)


def _store_reserved(node: Node) -> None:
    ledger = node.ledger()
    # A claim may take GPUs that were busy unclaimed, or give them back.
    node.gpus_reserved, node.gpus_busy_unclaimed = ledger.reserved, ledger.busy_unclaimed
    node.save(update_fields=["gpus_reserved", "gpus_busy_unclaimed"])
    summary_keep.changed()  # the overview's GPUs reserved and free


def release_expired(now: datetime | None = None) -> list[str]:
    """Delete every claim ended by `now`, each through `delete_claim` (node lock,
    audited as a delete by the system: no user). Returns "claim on node" for each."""
    released = []
    for claim in Claim.objects.ended(now).select_related("node"):
        try:
            delete_claim(claim, None, expected_updated_at=claim.updated_at)
        except (ClaimGone, StaleClaim):
            continue  # deleted, or just given a new end, by someone meanwhile
        released.append(f"{claim.name} on {claim.node.name}")
    return released
