"""GPU time added up: who held and who used the fleet's GPUs, by node, claim, owner,
team, GPU model, container image and claim label, in GPU-seconds and watt-hours.

Ingest adds each snapshot's lines (gpufleet/gpu/accounting.py) into the five-minute
row of their key; the central beat rolls finished hours into hourly rows, which
reports read. Rows keep names, not foreign keys: a deleted claim, user or node keeps
its past hours under the names it had."""

from __future__ import annotations

from datetime import timedelta

from django.db import models


class UsageRow(models.Model):
    resolution: timedelta

    bucket = models.DateTimeField(help_text="Start of the bucket.")
    node_id = models.BigIntegerField()
    node = models.CharField(max_length=200)
    claim_id = models.BigIntegerField(null=True, blank=True, help_text="The claim holding the GPUs; none: unreserved.")
    claim = models.CharField(max_length=100, blank=True)
    owner = models.CharField(max_length=150, blank=True, help_text="The claim's owner's user name when counted.")
    team = models.CharField(max_length=100, blank=True, help_text="The claim's team's name when counted.")
    model = models.CharField(max_length=500, blank=True, help_text="GPU model.")
    image = models.CharField(max_length=200, blank=True, help_text="Container image (empty: none or outside any).")
    label = models.CharField(max_length=200, blank=True, help_text="The container's gpufleet.claim label.")
    # A digest of the key columns above but node and bucket: the upsert's conflict target.
    key = models.CharField(max_length=32)
    seen_s = models.FloatField(default=0.0, help_text="GPU-seconds snapshots covered.")
    used_s = models.FloatField(default=0.0, help_text="Of those, GPU-seconds busy.")
    power_s = models.FloatField(default=0.0, help_text="Of those seen, GPU-seconds with a power reading.")
    energy_wh = models.FloatField(default=0.0, help_text="Energy drawn over power_s.")
    unknown_s = models.FloatField(default=0.0, help_text="GPU-seconds no snapshot covered (the node silent).")

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.node} {self.claim or 'unreserved'} from {self.bucket:%Y-%m-%d %H:%M}"


class UsageFiveMinutes(UsageRow):
    """Written by ingest, kept GPUFLEET_USAGE_5M_HOURS: the hours not rolled yet."""

    resolution = timedelta(minutes=5)

    class Meta:
        verbose_name = "GPU usage (5 minutes)"
        verbose_name_plural = "GPU usage (5 minutes)"
        constraints = [models.UniqueConstraint(fields=["node_id", "bucket", "key"], name="one_usage_5m_per_key")]
        indexes = [models.Index(fields=["bucket"], name="usage_5m_bucket_idx")]


class UsageHour(UsageRow):
    """Rolled from the five-minute rows by the central beat, kept GPUFLEET_USAGE_DAYS."""

    resolution = timedelta(hours=1)

    class Meta:
        verbose_name = "GPU usage (hourly)"
        verbose_name_plural = "GPU usage (hourly)"
        constraints = [models.UniqueConstraint(fields=["node_id", "bucket", "key"], name="one_usage_1h_per_key")]
        indexes = [
            models.Index(fields=["bucket"], name="usage_1h_bucket_idx"),
            models.Index(fields=["claim_id", "bucket"], name="usage_1h_claim_idx"),
            models.Index(fields=["owner", "bucket"], name="usage_1h_owner_idx"),
            models.Index(fields=["team", "bucket"], name="usage_1h_team_idx"),
        ]


class MonthlyReport(models.Model):
    """A monthly usage report as it was made (gpufleet/usage/monthly.py): to an owner by
    email (`recipient` their user name), or the fleet's summary to the alert channels
    (`recipient` empty, sent as a usage-report event). One per month and recipient, so
    a beat that runs often sends each once; the text is kept as it was sent."""

    class Kind(models.TextChoices):
        OWNER = "owner", "Owner's report"
        FLEET = "fleet", "Fleet summary"

    month = models.DateField(help_text="The first day of the month reported.")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    recipient = models.CharField(max_length=150, blank=True, help_text="The owner's user name; empty: the fleet.")
    email = models.CharField(max_length=254, blank=True, help_text="Where it goes; empty: the owner has no address.")
    subject = models.CharField(max_length=300)
    body = models.TextField()
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True, help_text="Why the last try failed.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["month", "kind", "recipient"], name="one_report_per_month")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.month:%Y-%m} {self.recipient}".strip()
