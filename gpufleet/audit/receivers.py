"""Audit rows for what happens outside the apps' own services: user and group changes
in the admin site (sent by gpufleet/core/admin.py) and login lockouts (django-axes)."""

from __future__ import annotations

from axes.signals import user_locked_out
from django.dispatch import receiver

from gpufleet.audit.models import record
from gpufleet.core.signals import account_changed


@receiver(account_changed, dispatch_uid="gpufleet.audit.account_changed")
def record_account_change(sender, actor, action: str, target: str, before, after, **kwargs) -> None:
    # "user.update", "group.delete" ...; the admin's own transaction holds the change.
    record(actor, f"{sender._meta.model_name}.{action}", target=target, before=before, after=after)


@receiver(user_locked_out, dispatch_uid="gpufleet.audit.user_locked_out")
def record_lockout(sender, request, username: str, ip_address: str, **kwargs) -> None:
    # Nobody is logged in: "who" is the system, the username tried is the target.
    record(None, "login.lockout", target=username or "", after={"ip_address": ip_address})
