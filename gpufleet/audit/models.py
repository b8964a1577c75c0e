"""Who changed what: one row per claim change, fix request and diagnosis request,
written in the same transaction as the change itself."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Action(models.TextChoices):
    """Every action an audit row may name, in the audit log's words: `record` writes
    no other, so the log's Action filter (built from this) can select each one."""

    CLAIM_CREATE = "claim.create", "Claim added"
    CLAIM_UPDATE = "claim.update", "Claim changed"
    CLAIM_DELETE = "claim.delete", "Claim deleted"
    NODE_DIAGNOSE = "node.diagnose", "Diagnosis asked"
    NODE_FIX = "node.fix", "Fix asked"
    XID_ACKNOWLEDGE = "xid.acknowledge", "Xid errors acknowledged"
    NODE_ENROLL = "node.enroll", "Node enrolled"
    NODE_ROTATE_KEY = "node.rotate_key", "Node key rotated"
    NODE_REVOKE_KEY = "node.revoke_key", "Node key revoked"
    GPU_FORGET = "gpu.forget", "Vanished GPUs forgotten"
    TOKEN_CREATE = "token.create", "API token created"
    TOKEN_REVOKE = "token.revoke", "API token revoked"
    # Calendar feeds (gpufleet.api.models.CalendarFeed): a re-issue is a revoke and a create.
    FEED_CREATE = "feed.create", "Calendar feed issued"
    FEED_REVOKE = "feed.revoke", "Calendar feed revoked"
    # The admin site's user and group changes, and login lockouts (gpufleet.audit.receivers).
    USER_CREATE = "user.create", "User added"
    USER_UPDATE = "user.update", "User changed"
    USER_DELETE = "user.delete", "User deleted"
    GROUP_CREATE = "group.create", "Group added"
    GROUP_UPDATE = "group.update", "Group changed"
    GROUP_DELETE = "group.delete", "Group deleted"
    LOGIN_LOCKOUT = "login.lockout", "Login locked out"
    # Alerts (gpufleet.alerts): a channel's URL is never written, only that it changed.
    CHANNEL_CREATE = "channel.create", "Alert channel added"
    CHANNEL_UPDATE = "channel.update", "Alert channel changed"
    CHANNEL_DELETE = "channel.delete", "Alert channel deleted"
    RULE_CREATE = "rule.create", "Alert rule added"
    RULE_UPDATE = "rule.update", "Alert rule changed"
    RULE_DELETE = "rule.delete", "Alert rule deleted"
    SILENCE_CREATE = "silence.create", "Silence added"
    SILENCE_UPDATE = "silence.update", "Silence changed"
    SILENCE_END = "silence.end", "Silence ended"
    MAINTENANCE_START = "maintenance.start", "Maintenance set"
    MAINTENANCE_END = "maintenance.end", "Maintenance ended"
    # DCGM diagnostics (gpufleet/jobs) and validation after maintenance (gpufleet/fleet/maintenance.py).
    NODE_DCGM_DIAG = "node.dcgm_diag", "DCGM diagnostic asked"
    VALIDATION_START = "validation.start", "Validation required"
    VALIDATION_END = "validation.end", "Validation ended"
    # Single sign-on (gpufleet.sso): each login, each role and team list its groups changed, each refusal.
    SSO_LOGIN = "sso.login", "Single sign-on login"
    SSO_ROLE = "sso.role", "Role set by directory groups"
    SSO_TEAMS = "sso.teams", "Teams set by directory groups"
    SSO_REFUSED = "sso.refused", "Single sign-on refused"
    TEAM_CREATE = "team.create", "Team added"
    TEAM_UPDATE = "team.update", "Team changed"
    TEAM_DELETE = "team.delete", "Team deleted"


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
    """Write one audit row. Call inside the transaction that makes the change. An action
    that is not an `Action` is refused (ValueError): the log could not filter on it."""
    if action not in Action.values:
        raise ValueError(f"unknown audit action {action!r}: add it to gpufleet.audit.models.Action")
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return AuditEntry.objects.create(
        user=user if authenticated else None,
        username=user.get_username() if authenticated else "",
        action=action,
        node=node,
        node_name=node.name if node is not None else "",
        # A name a stranger typed (a login's) may be longer than the column: cut, as the log shows it.
        target=target[: AuditEntry._meta.get_field("target").max_length],
        before=before,
        after=after,
    )
