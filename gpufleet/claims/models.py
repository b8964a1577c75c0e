"""GPU reservations ("claims") on a node. Whether a claim fits is decided by the
domain ledger (`gpufleet.gpu.Ledger.fit`) only; see `gpufleet.claims.services`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Lower
from django.utils import timezone

from gpufleet import gpu
from gpufleet.fleet.models import Device

# How long before a claim starts, and before it ends, its owner is reminded (gpufleet/usage/reminders.py).
REMINDER_LEAD = timedelta(hours=1)


@dataclass(frozen=True)
class GpuName:
    """A claimed GPU as people read it: "GPU 3" with its UUID as the title, as the node
    page shows its GPUs; one the node no longer reports, by the id it was claimed with."""

    text: str
    title: str
    missing: bool = False

    def __str__(self) -> str:
        return f"{self.text} (missing)" if self.missing else self.text


class ClaimQuerySet(models.QuerySet):
    def in_force(self, at: datetime | None = None) -> ClaimQuerySet:
        """The claims holding their GPUs at `at` (default now): started, and not ended.
        The one rule of "now" for every page, count and job; `Claim.in_force` is the
        same rule for claims already read."""
        at = at or timezone.now()
        return self.filter(Q(ends_at__isnull=True) | Q(ends_at__gt=at), starts_at__lte=at)

    def overlapping(self, starts_at: datetime, ends_at: datetime | None) -> ClaimQuerySet:
        """The claims whose windows share an instant with [starts_at, ends_at)."""
        meeting = self.filter(Q(ends_at__isnull=True) | Q(ends_at__gt=starts_at))
        return meeting if ends_at is None else meeting.filter(starts_at__lt=ends_at)

    def ended(self, at: datetime | None = None) -> ClaimQuerySet:
        return self.filter(ends_at__lte=at or timezone.now())

    def booked(self, at: datetime | None = None) -> ClaimQuerySet:
        """Bookings ahead: their windows start after `at` (default now)."""
        return self.filter(starts_at__gt=at or timezone.now())

    def starting_soon(self, at: datetime | None = None) -> ClaimQuerySet:
        """The bookings that start within REMINDER_LEAD after `at` (default now)."""
        at = at or timezone.now()
        return self.filter(starts_at__gt=at, starts_at__lte=at + REMINDER_LEAD)

    def ending_soon(self, at: datetime | None = None) -> ClaimQuerySet:
        """The claims in force at `at` (default now) that end within REMINDER_LEAD after it."""
        at = at or timezone.now()
        return self.in_force(at).filter(ends_at__lte=at + REMINDER_LEAD)

    def soon(self, at: datetime | None = None) -> ClaimQuerySet:
        """What owners are reminded of: the claims starting or ending within REMINDER_LEAD."""
        return self.starting_soon(at) | self.ending_soon(at)

    def no_shows(self) -> ClaimQuerySet:
        """`Claim.no_show` in SQL: the bookings flagged idle from their start."""
        if settings.GPUFLEET_NO_SHOW_HOURS <= 0:
            return self.none()
        return self.filter(idle_since=F("starts_at"), starts_at__gt=F("created_at"))


class Claim(models.Model):
    """One workload's reservation on one node: a count of GPUs, every GPU
    (count 0 and no devices), or named devices (by index or UUID), over a window of
    time [starts_at, ends_at): a booking ahead until it starts, in force until it ends."""

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="claims")
    # The team the claim is booked for, whose quotas it counts against and whose members
    # may change it. Every claim saved by a person has one;
    # the column allows none only for rows written by the system's own tools.
    team = models.ForeignKey("teams.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="claims")
    name = models.CharField(max_length=100)
    count = models.PositiveIntegerField(default=0)
    device_ids = models.JSONField(default=list, blank=True)
    # Device ids of this claim that the node no longer reports; set at ingest.
    missing_devices = models.JSONField(default=list, blank=True)
    # Set at ingest while none of the claim's GPUs has done any work for
    # GPUFLEET_IDLE_HOURS (gpu.accounting.idle_claims): since when, never before the claim began.
    idle_since = models.DateTimeField(null=True, blank=True, editable=False)
    # When the central beat told the owner that the claim sits idle (gpufleet/usage/idle.py);
    # a warning from before the current idle_since is one of an earlier idle spell.
    idle_warned_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Who answers for the claim (its creator unless set otherwise) and how to reach them.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="owned_claims"
    )
    contact = models.CharField(max_length=200, blank=True, help_text="How to reach the owner, e.g. a chat channel.")
    # The claim holds its GPUs from starts_at until before ends_at (None: no end). An
    # ended claim holds nothing; its row stays until it is deleted (by hand, or by the
    # central beat with GPUFLEET_RELEASE_EXPIRED).
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField(null=True, blank=True)
    # The occurrences of one repeating booking share it (services.save_series); null for a single claim.
    series = models.UUIDField(null=True, blank=True, editable=False, db_index=True)
    # When the central beat reminded the owner that the claim starts, or ends, within
    # REMINDER_LEAD (gpufleet/usage/reminders.py); a save that moves the start or end clears its own.
    start_reminded_at = models.DateTimeField(null=True, blank=True, editable=False)
    end_reminded_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Why an admin booked the claim over its team's quota (empty: it keeps within them).
    quota_override_reason = models.TextField(blank=True, editable=False)

    objects = ClaimQuerySet.as_manager()

    class Meta:
        ordering = ["node", "name"]
        # "TRAIN" and "train" are one workload to the people reading the ledger.
        constraints = [models.UniqueConstraint("node", Lower("name"), name="claim_unique_name_per_node_any_case")]

    def __str__(self) -> str:
        return f"{self.name} on {self.node.name}: {self.describe()}"

    def as_gpu_claim(self) -> gpu.Claim:
        # In the site's time zone, so that the ledger's sentences name local times; with its
        # team's name where the team was read with the claim (never a query per claim).
        team = self.team.name if self.team_id and Claim.team.is_cached(self) else ""
        return gpu.Claim(name=self.name, count=self.count, device_ids=tuple(self.device_ids),
                         starts_at=_local(self.starts_at), ends_at=_local(self.ends_at), team=team)

    def in_force(self, at: datetime | None = None) -> bool:
        """ClaimQuerySet.in_force for a claim already read."""
        return self.as_gpu_claim().in_force(at or timezone.now())

    def window(self) -> str:
        return self.as_gpu_claim().window()

    @property
    def mode(self) -> str:
        if self.device_ids:
            return "devices"
        return "all" if self.count <= 0 else "count"

    def describe(self) -> str:
        if self.mode == "devices":
            if self.node_id is None:  # a claim rebuilt from an audit row: its ids alone
                return "GPUs " + ", ".join(self.device_ids)
            return ", ".join(str(name) for name in self.gpu_names())
        if self.mode == "all":
            return "all GPUs"
        return f"{self.count} GPU" + ("" if self.count == 1 else "s")

    def gpu_names(self, ledger: gpu.Ledger | None = None) -> list[GpuName]:
        """The claim's pinned GPUs, the one place that names them for people (the node's
        panel, the claims list, the emails). `ledger` (the node's) or the node's current
        devices read beforehand (`with_current_devices`) save a query."""
        if ledger is None:
            ledger = self.node.ledger(devices=self.node.current_devices(), claims=())
        missing = set(self.missing_devices)
        names = []
        for device_id in self.device_ids:
            device = ledger.resolve(device_id)
            if device is None or device_id in missing:
                names.append(GpuName(device_id, "no longer reported by the node", missing=True))
            else:
                names.append(GpuName(f"GPU {device.index}", device.uuid))
        return names

    def has_ended(self, now: datetime | None = None) -> bool:
        return self.ends_at is not None and self.ends_at <= (now or timezone.now())

    @property
    def ended(self) -> bool:
        return self.has_ended()

    @property
    def booked(self) -> bool:
        """A booking ahead: its window starts later."""
        return self.starts_at is not None and self.starts_at > timezone.now()

    @property
    def made_ahead(self) -> bool:
        """Whether the claim was made before its start: a booking, which the no-show rule
        judges (a claim made now starts when it is made)."""
        return self.created_at is not None and self.starts_at > self.created_at

    @property
    def no_show(self) -> bool:
        """A booking flagged idle from its start: none of its GPUs did work since it
        started (ingest flags it GPUFLEET_NO_SHOW_HOURS after; 0 turns the rule off)."""
        return (settings.GPUFLEET_NO_SHOW_HOURS > 0 and self.idle_since is not None
                and self.idle_since == self.starts_at and self.made_ahead)

    def as_audit_dict(self) -> dict:
        return {
            "name": self.name,
            "count": self.count,
            "device_ids": list(self.device_ids),
            "team": self.team.name if self.team_id else None,
            "owner": self.owner.get_username() if self.owner_id else None,
            "contact": self.contact,
            "starts_at": self.starts_at.isoformat() if self.starts_at else None,
            "ends_at": self.ends_at.isoformat() if self.ends_at else None,
            # Only on claims booked over quota, so that other rows read as before.
            **({"quota_override_reason": self.quota_override_reason} if self.quota_override_reason else {}),
        }


def _local(moment: datetime | None) -> datetime | None:
    return timezone.localtime(moment) if moment is not None else None


def with_current_devices(claims: Iterable[Claim], only_pinned: bool = True) -> None:
    """Read the current GPUs of the nodes of the pinned claims among `claims` (or with
    `only_pinned` False, of every claim) in one query (none when there is no such claim), so
    that naming their GPUs, or counting them by model, reads nothing per claim."""
    pinned = [claim for claim in claims if claim.device_ids or not only_pinned]
    if not pinned:
        return
    devices: dict[int, list[Device]] = {claim.node_id: [] for claim in pinned}
    for device in Device.objects.filter(node_id__any=list(devices), vanished_at__isnull=True).order_by("index"):
        devices[device.node_id].append(device)
    for claim in pinned:
        claim.node.current_devices_cache = devices[claim.node_id]
