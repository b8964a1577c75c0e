"""Who a directory says a user is. A user with an Identity came from single sign-on; one
without is a local account, which single sign-on never takes over."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class Identity(models.Model):
    class Source(models.TextChoices):
        LDAP = "ldap", "LDAP"
        OIDC = "oidc", "OpenID Connect"
        PROXY = "proxy", "Authenticating proxy"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identities")
    source = models.CharField(max_length=10, choices=Source.choices)
    # LDAP: the user's DN; OIDC: "<issuer> <sub>" (a sub is unique only within its issuer);
    # proxy: the user name the proxy sends.
    subject = models.CharField(max_length=500)
    # The role the groups gave at the last login ("" for none) and the groups seen then.
    role = models.CharField(max_length=20, blank=True)
    groups = models.JSONField(default=list, blank=True)
    seen_at = models.DateTimeField(default=timezone.now)
    # Deactivated by a login that found no mapped group: the next login with a mapped
    # group reactivates the user. A user an admin deactivated stays so.
    refused = models.BooleanField(default=False)
    # OIDC: the provider's refresh token, with which the site asks it again about the person
    # (gpufleet/sso/recheck.py); the provider rotates it at each use.
    refresh_token = models.TextField(blank=True, default="")

    class Meta:
        verbose_name_plural = "identities"
        constraints = [models.UniqueConstraint(fields=["source", "subject"], name="sso_identity_source_subject")]

    def __str__(self) -> str:
        return f"{self.get_source_display()} {self.subject}"
