"""Personal API tokens: a script sends `Authorization: Bearer <token>` and acts as the
token's user, under the same role rules as the pages, never more than its scope allows."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from gpufleet.audit.models import record
from gpufleet.sso import recheck

PREFIX = "gpf_"
# How stale `last_used_at` may get: a busy script must not cost a write on every request.
TOUCH_EVERY = timedelta(minutes=1)


def digest(secret: str) -> str:
    """What is stored instead of the secret. A plain SHA-256 is enough here, unlike for
    passwords: a token is 256 random bits, so guessing it from the digest is hopeless
    even at full speed, and a slow password hash would cost every API request for nothing.
    Being deterministic, the digest is also what the token is looked up by."""
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiToken(models.Model):
    """A user's API token. The secret itself is shown once, at creation, and never stored."""

    class Scope(models.TextChoices):
        READ = "read", "Read"
        READ_WRITE = "read_write", "Read and write"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. the script using it.")
    scope = models.CharField(max_length=20, choices=Scope.choices, default=Scope.READ)
    # The secret's first characters, so a user can tell which token a script holds.
    hint = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.user.get_username()}, {self.get_scope_display().lower()})"

    @classmethod
    def issue(cls, user, name: str, scope: str) -> tuple[ApiToken, str]:
        """Create a token for `user`; returns it with its secret, which only the caller ever sees."""
        secret = PREFIX + secrets.token_urlsafe(32)
        with transaction.atomic():
            token = cls.objects.create(user=user, name=name, scope=scope, hint=secret[:10], digest=digest(secret))
            record(user, "token.create", target=name, after=token.as_audit_dict())
        return token, secret

    @classmethod
    def find(cls, secret: str) -> ApiToken | None:
        """The live token with this secret, its user loaded; None if unknown, revoked or
        its user deactivated (who can no longer log in either), or if the directory, asked
        again when due, no longer gives its single sign-on user a role."""
        live = cls.objects.select_related("user").filter(revoked_at__isnull=True, user__is_active=True)
        # Whether to ask comes with the token, so a token's request costs no query more.
        live = live.annotate(ask_directory=Exists(recheck.due(OuterRef("user"))))
        found = live.filter(digest=digest(secret)).first()
        if found is not None and found.ask_directory and not recheck.still_allowed(found.user):
            return None
        return found

    @property
    def can_write(self) -> bool:
        return self.scope == self.Scope.READ_WRITE

    def revoke(self, user) -> None:
        """Revoke for good; the row stays, so the page and the admin can say when."""
        with transaction.atomic():
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
            record(user, "token.revoke", target=self.name, before=self.as_audit_dict())

    def touch(self) -> None:
        """Note a use, writing at most once per TOUCH_EVERY."""
        now = timezone.now()
        if self.last_used_at is None or now - self.last_used_at >= TOUCH_EVERY:
            ApiToken.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

    def as_audit_dict(self) -> dict:
        return {"name": self.name, "scope": self.scope, "hint": self.hint}
