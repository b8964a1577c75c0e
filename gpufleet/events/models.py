"""The fleet's memory: every change of state as an `Event` row that opens, may
worsen, and closes. Written at ingest (findings, rejected snapshots) and by the
central beat (offline nodes, vanished GPUs, claims, keys, fixes); see
gpufleet/events/services.py and docs/events.md."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Kind(models.TextChoices):
    FINDING = "finding", "Finding"
    OFFLINE = "offline", "Node offline"
    GPU_VANISHED = "gpu-vanished", "GPU vanished"
    REJECTED_SNAPSHOT = "rejected-snapshot", "Rejected snapshots"
    KEY_ROTATED = "key-rotated", "Node key rotated"
    KEY_REVOKED = "key-revoked", "Node key revoked"
    CLAIM_EXPIRED = "claim-expired", "Claim expired"
    CLAIM_RELEASED = "claim-released", "Claim released"
    CLAIM_IDLE = "claim-idle", "Claim idle"
    FIX_APPLIED = "fix-applied", "Fix applied"
    DIAGNOSTIC = "dcgm-diag", "DCGM diagnostic"
    INGEST_SILENT = "ingest-silent", "No snapshots arriving"
    USAGE_REPORT = "usage-report", "Monthly usage report"
    INGEST_DEAD_LETTER = "ingest-dead-letter", "Ingest entry set aside"


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARN = "warn", "Warning"
    FAIL = "fail", "Failing"

    @property
    def rank(self) -> int:
        return ("info", "warn", "fail").index(self.value)

    @property
    def colour(self) -> str:
        return {"info": "grey", "warn": "amber", "fail": "red"}[self.value]


class Muted(models.TextChoices):
    """Why an event was muted (its notifications held back) while it was open: its node
    was in maintenance, or a silence covered it (maintenance wins). Empty: it was not.
    The labels are the chips the pages show."""

    NO = "", "not muted"
    SILENCED = "silenced", "silenced"
    MAINTENANCE = "maintenance", "in maintenance"

    @property
    def colour(self) -> str:
        return "blue" if self is Muted.MAINTENANCE else "grey"


# Open events first, then the newest: the Events page's order, kept by an index.
OPEN_FIRST = models.Case(
    models.When(closed_at__isnull=True, then=models.Value(0)), default=models.Value(1),
    output_field=models.IntegerField(),
)


class Event(models.Model):
    """One condition of a node (or of the site, node None) from when it opened to
    when it closed. A row with `opened_at` None is pending: its condition has not yet
    held for GPUFLEET_EVENT_OPEN_AFTER_S, and no page shows it. `clear_since` is set
    while an open event's condition is absent; it closes (at `clear_since`) once that
    lasted GPUFLEET_EVENT_CLOSE_AFTER_S, and a condition back before then continues it.
    A one-off event (a key rotated, a fix applied) opens and closes at once."""

    kind = models.CharField(max_length=32, choices=Kind.choices)
    # The worst the condition reached while open; `message` is its latest words.
    severity = models.CharField(max_length=8, choices=Severity.choices)
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="events",
                             db_index=False)
    gpu_index = models.IntegerField(null=True, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    # What the condition is within its kind: the finding code ("gpu3.thermal"), the GPU's
    # UUID, the refusal reason, the claim name; one open event per (node, kind, code).
    code = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=200, blank=True, help_text="What it concerns, in words.")
    message_opened = models.TextField(blank=True)
    message = models.TextField(blank=True)
    first_seen_at = models.DateTimeField(help_text="When the condition was first seen.")
    opened_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(help_text="When the condition was last seen.")
    clear_since = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    worsened_at = models.DateTimeField(null=True, blank=True, help_text="When its severity last rose.")
    # How many times it was seen coming (refused snapshots: how many were refused).
    count = models.PositiveBigIntegerField(default=1)
    # What it concerns besides its node: the claim by name (a released claim is deleted),
    # the fix's job.
    claim_name = models.CharField(max_length=100, blank=True)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Set by the alerts' tick (gpufleet/alerts/services.py: mark_muted), once, while open:
    # the events app knows nothing of silences and maintenance.
    muted = models.CharField(max_length=12, choices=Muted.choices, blank=True, default=Muted.NO)

    class Meta:
        ordering = [OPEN_FIRST, "-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["node", "kind", "code"], condition=Q(closed_at__isnull=True),
                                    name="one_open_event_per_condition"),
            # The site's own events (node NULL): NULLs are distinct in the one above.
            models.UniqueConstraint(fields=["kind", "code"], condition=Q(closed_at__isnull=True, node__isnull=True),
                                    name="one_open_site_event_per_condition"),
        ]
        indexes = [
            models.Index(OPEN_FIRST, models.F("opened_at").desc(), name="event_open_first_newest"),
            models.Index(fields=["node", "-opened_at"], name="event_node_newest"),
            models.Index(fields=["closed_at"], condition=Q(closed_at__isnull=False), name="event_closed_at"),
        ]

    def __str__(self) -> str:
        where = self.node.name if self.node_id else "site"
        return f"{where} {self.kind} {self.code}: {self.severity}"

    @property
    def level(self) -> Severity:
        return Severity(self.severity)

    @property
    def muted_as(self) -> Muted | None:
        """Why it was muted, for its chip; None when it was not."""
        return Muted(self.muted) if self.muted else None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None and self.closed_at is None

    @property
    def duration(self):
        """How long it was open (up to now while open), or None while pending."""
        if self.opened_at is None:
            return None
        return (self.closed_at or timezone.now()) - self.opened_at
