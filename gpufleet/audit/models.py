"""Who changed what: one row per claim change, fix request and diagnosis request,
written in the same transaction as the change itself."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    at = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text too, so the trail survives a deleted user or node.
    username = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=40)
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    node_name = models.CharField(max_length=200, blank=True)
    target = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username or 'system'} {self.action} {self.target}"


def record(user, action: str, node=None, target: str = "", before=None, after=None) -> AuditEntry:
    """Write one audit row. Call inside the transaction that makes the change."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action,
        node=node,
        node_name=node.name if node is not None else "",
        target=target,
        before=before,
        after=after,
    )
