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
from django.utils.crypto import salted_hmac

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


class CalendarFeed(models.Model):
    """A private iCalendar URL: a person's (the claims they own) or a team's (the team's
    claims), its secret in the URL. Unlike an API token's, the URL must be shown again
    (to the person each time they ask, to every member of a team), so its secret is not
    random but an HMAC of a random nonce under the site's SECRET_KEY: the table holds the
    nonce and the secret's digest, and neither gives the URL without the key. The feed is
    looked up by the digest, as a token is."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="calendar_feeds")
    team = models.ForeignKey("teams.Team", null=True, blank=True, on_delete=models.CASCADE,
                             related_name="calendar_feeds")
    nonce = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, team__isnull=True) | models.Q(user__isnull=True, team__isnull=False),
                name="calendar_feed_of_a_person_or_a_team",
            ),
            # Re-issuing revokes the live one first; two people asking at once make one feed.
            models.UniqueConstraint(fields=["user"], condition=models.Q(revoked_at__isnull=True),
                                    name="calendar_feed_one_live_per_person"),
            models.UniqueConstraint(fields=["team"], condition=models.Q(revoked_at__isnull=True),
                                    name="calendar_feed_one_live_per_team"),
        ]

    def __str__(self) -> str:
        return self.subject()

    def subject(self) -> str:
        return f"team {self.team.name}" if self.team_id else self.user.get_username()

    @classmethod
    def issue(cls, by, *, user=None, team=None) -> CalendarFeed:
        """A new live feed of `user` or of `team`, asked by `by`. Call with none live for it
        (`reissue` revokes it first): a second live one is an IntegrityError."""
        nonce = secrets.token_urlsafe(32)
        with transaction.atomic():
            feed = cls.objects.create(user=user, team=team, nonce=nonce, digest=digest(_feed_secret(nonce)))
            record(by, "feed.create", target=f"calendar feed of {feed.subject()}", after=feed.as_audit_dict())
        return feed

    @classmethod
    def find(cls, secret: str) -> CalendarFeed | None:
        """The live feed with this secret, its person or team loaded; None if unknown,
        revoked, or a person's whose account is deactivated."""
        live = cls.objects.select_related("user", "team").filter(revoked_at__isnull=True)
        live = live.filter(models.Q(user__isnull=True) | models.Q(user__is_active=True))
        return live.filter(digest=digest(secret)).first()

    def secret(self) -> str | None:
        """The secret of the feed's URL, rebuilt; None where it was issued under a SECRET_KEY
        that is neither the current one nor in SECRET_KEY_FALLBACKS (re-issue it)."""
        for key in [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]:
            secret = _feed_secret(self.nonce, key)
            if digest(secret) == self.digest:
                return secret
        return None

    @property
    def live(self) -> bool:
        return self.revoked_at is None

    def revoke(self, by) -> None:
        with transaction.atomic():
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])
            record(by, "feed.revoke", target=f"calendar feed of {self.subject()}", before=self.as_audit_dict())

    def reissue(self, by) -> CalendarFeed:
        """A new URL for the same person or team; the live one (if any) is revoked with it."""
        with transaction.atomic():
            for live in CalendarFeed.objects.select_for_update().filter(
                    user=self.user_id, team=self.team_id, revoked_at__isnull=True):
                live.revoke(by)
            return CalendarFeed.issue(by, user=self.user, team=self.team)

    def as_audit_dict(self) -> dict:
        return {"team": self.team.name} if self.team_id else {"user": self.user.get_username()}


def _feed_secret(nonce: str, key: str | None = None) -> str:
    return salted_hmac("gpufleet.api.CalendarFeed", nonce, secret=key, algorithm="sha256").hexdigest()
