"""Work asked of a node's agent ("diagnose now", "apply fix"), tracked as rows the
pages poll. The agent never touches the database: it reports progress through
the ingest queue, and these rows move queued → running → done/failed, or to
expired when the node does not answer in time."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from gpufleet.gpu import dcgm


class JobKind(models.TextChoices):
    DIAGNOSE = "diagnose", "Diagnose now"
    FIX = "fix", "Apply fix"
    DCGM_DIAG = "dcgm-diag", "DCGM diagnostic"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "No answer"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.DONE, JobStatus.FAILED, JobStatus.EXPIRED)

    @property
    def colour(self) -> str:
        return {"queued": "grey", "running": "blue", "done": "green", "failed": "red", "expired": "amber"}[self.value]


OPEN_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)


class Job(models.Model):
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="jobs")
    kind = models.CharField(max_length=10, choices=JobKind.choices)
    fix_code = models.CharField(max_length=64, blank=True)
    # A DCGM diagnostic's level (1 or 2) and its result as read (gpu.dcgm.DiagResult.to_dict).
    level = models.PositiveSmallIntegerField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.QUEUED)
    output = models.TextField(blank=True)
    error = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        what = {JobKind.FIX: f"fix {self.fix_code}", JobKind.DCGM_DIAG: f"DCGM diagnostic -r {self.level}"}.get(
            self.kind, "diagnose")
        return f"{what} on {self.node.name}: {self.status}"

    @property
    def state(self) -> JobStatus:
        return JobStatus(self.status)

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def diag(self):
        """A DCGM diagnostic's result as read (gpu.dcgm.DiagResult), or None."""
        return dcgm.DiagResult.from_dict(self.result) if self.kind == JobKind.DCGM_DIAG else None
