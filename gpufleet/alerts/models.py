"""Who hears of which events: channels (apprise URLs), rules (which events go to which
channels), silences (quiet for some nodes a while) and deliveries (each notification,
sent or not). gpufleet/alerts/services.py decides and sends; docs/alerts.md says how."""

from __future__ import annotations

from fnmatch import fnmatchcase

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpufleet.events.models import Kind, Muted, Severity


class Format(models.TextChoices):
    """What a channel sends: apprise's message for its service (a JSON or form webhook
    gets gpufleet's fields beside it), or Alertmanager's webhook body (version 4) posted
    to its http(s) URL, for receivers made for Alertmanager."""

    APPRISE = "apprise", "apprise (the service's own message)"
    ALERTMANAGER = "alertmanager", "Alertmanager webhook (version 4)"


class Channel(models.Model):
    """Where notifications go: an apprise URL (mailto://, json://, slack://, ...), or an
    http(s) URL for the Alertmanager `format`. The URL holds secrets (passwords, webhook
    tokens): after saving it is read only to send, and pages, the API, the audit log and
    logs see `redacted` alone."""

    name = models.CharField(max_length=100, unique=True)
    url = models.TextField()
    # What may be shown of the URL: its scheme (apprise's service), never more.
    redacted = models.CharField(max_length=40)
    format = models.CharField(max_length=12, choices=Format.choices, default=Format.APPRISE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Set when a send failed, cleared by the next one that gets through.
    failing_since = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def failing(self) -> bool:
        return self.failing_since is not None


class Rule(models.Model):
    """Which events go to which channels, and when: events of `kinds` (none: every
    kind) at `min_severity` or worse, on nodes whose name matches the glob `nodes` and
    (if set) with a GPU whose name holds `gpu_model`; sent once open `wait_minutes`,
    again every `repeat_hours` while open (0: never), and when closed if
    `notify_resolved`."""

    name = models.CharField(max_length=100, unique=True)
    channels = models.ManyToManyField(Channel, blank=True, related_name="rules")
    kinds = models.JSONField(default=list, blank=True, help_text="Event kinds; none selected: every kind.")
    min_severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.FAIL)
    nodes = models.CharField(max_length=200, blank=True,
                             help_text="Node names as a glob (gpu-*, rack4-??); empty: every node.")
    gpu_model = models.CharField(max_length=100, blank=True,
                                 help_text="Only nodes with a GPU whose name holds this (H100); empty: any.")
    wait_minutes = models.PositiveIntegerField(default=5, help_text="How long an event must stay open first.")
    repeat_hours = models.PositiveIntegerField(default=0, help_text="Send again every N hours while open; 0: never.")
    notify_resolved = models.BooleanField(default=True, help_text="Send when the event closes.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def kind_labels(self) -> list[str]:
        labels = dict(Kind.choices)
        return [labels.get(kind, kind) for kind in self.kinds]

    def matches(self, kind: str, severity: str, node_name: str | None, gpu_models: str = "") -> bool:
        """Whether this rule selects an event of a node (`node_name` None: the site's
        own), whose GPU names are `gpu_models` (Node.gpu_models)."""
        if self.kinds and kind not in self.kinds:
            return False
        if Severity(severity).rank < Severity(self.min_severity).rank:
            return False
        if node_name is None:
            return not self.nodes and not self.gpu_model
        if self.nodes and not fnmatchcase(node_name, self.nodes):
            return False
        return self.gpu_model.casefold() in gpu_models.casefold()


class SilenceQuerySet(models.QuerySet):
    def active(self, now=None):
        now = now or timezone.now()
        return self.filter(starts_at__lte=now, ends_at__gt=now)


class Silence(models.Model):
    """Quiet for the nodes whose names match the glob `nodes` from `starts_at` to
    `ends_at`: their events are still recorded, but what would be sent is marked
    silenced instead. "*" silences every node and the site's own events."""

    nodes = models.CharField(max_length=200, help_text="Node names as a glob (gpu-*, rack4-??, *).")
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=300)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="+")
    author_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SilenceQuerySet.as_manager()

    class Meta:
        ordering = ["-ends_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")),
                                              name="silence_ends_after_it_starts")]

    def __str__(self) -> str:
        return f"{self.nodes} until {self.ends_at:%Y-%m-%d %H:%M}"

    def covers(self, node_name: str | None) -> bool:
        if node_name is None:
            return self.nodes == "*"
        return fnmatchcase(node_name, self.nodes)

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.starts_at <= now < self.ends_at


class Notice(models.TextChoices):
    """What a notification says of its events. A repeat is stored as "repeat-N"."""

    OPENED = "opened", "Opened"
    REPEAT = "repeat", "Still open"
    RESOLVED = "resolved", "Resolved"


class Status(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    SILENCED = "silenced", "Silenced"


class Delivery(models.Model):
    """One notification of a rule to a channel, about one or more events (those due in
    one grouping window). Sent by whichever sender claims it first (status pending ->
    sending with its `claim_token`, a conditional UPDATE); a claim older than
    GPUFLEET_ALERT_CLAIM_TIMEOUT_S is taken again (its sender died). Tried again,
    `next_try_at` further apart each time, until sent or given up (services.give_up)."""

    rule = models.ForeignKey(Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    rule_name = models.CharField(max_length=100)
    channel = models.ForeignKey(Channel, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries")
    channel_name = models.CharField(max_length=100)
    events = models.ManyToManyField("events.Event", through="DeliveryEvent", related_name="deliveries")
    notice = models.CharField(max_length=8, choices=Notice.choices)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    title = models.CharField(max_length=300, blank=True)
    body = models.TextField(blank=True)
    # Why the last try failed, with the channel's secrets taken out.
    error = models.TextField(blank=True)
    # Why it was held back (status silenced): its nodes' maintenance, or a silence (which).
    muted = models.CharField(max_length=12, choices=Muted.choices, blank=True, default=Muted.NO)
    silence = models.ForeignKey(Silence, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    tries = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    next_try_at = models.DateTimeField(default=timezone.now)
    claim_token = models.UUIDField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["next_try_at"], condition=Q(status__in=["pending", "sending"]), name="delivery_due"),
        ]

    def __str__(self) -> str:
        return f"{self.rule_name} -> {self.channel_name}: {self.notice} ({self.status})"

    @property
    def muted_as(self) -> Muted | None:
        """Why it was held back, for its chip; None when it was not (or before this was kept)."""
        return Muted(self.muted) if self.muted else None


class DeliveryEvent(models.Model):
    """An event in a delivery, under the notice it got: at most one row per event, rule,
    channel and notice ("opened", "repeat-2", "resolved"), so however many senders plan
    at once, an event is announced once per rule and channel."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="items")
    event = models.ForeignKey("events.Event", on_delete=models.CASCADE, related_name="+")
    rule = models.ForeignKey(Rule, null=True, on_delete=models.SET_NULL, related_name="+")
    channel = models.ForeignKey(Channel, null=True, on_delete=models.SET_NULL, related_name="+")
    notice = models.CharField(max_length=20)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["event", "rule", "channel", "notice"],
                                               name="one_notice_per_event_rule_channel")]
