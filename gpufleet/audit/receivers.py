"""Audit rows for what happens outside the apps' own services: user and group changes
in the admin site (sent by gpufleet/core/admin.py) and login lockouts (django-axes)."""

from __future__ import annotations

from datetime import datetime, timedelta

from axes.helpers import get_cool_off
from axes.signals import user_locked_out
from django.db import transaction
from django.dispatch import receiver
from django.utils import timezone

from gpufleet.audit.models import Action, AuditEntry, record
from gpufleet.core.signals import account_changed

_LOCKOUT_ROW_SPAN = timedelta(days=1)


@receiver(account_changed, dispatch_uid="gpufleet.audit.account_changed")
def record_account_change(sender, actor, action: str, target: str, before, after, **kwargs) -> None:
    # "user.update", "group.delete" ...; the admin's own transaction holds the change.
    record(actor, f"{sender._meta.model_name}.{action}", target=target, before=before, after=after)


@receiver(user_locked_out, dispatch_uid="gpufleet.audit.user_locked_out")
def record_lockout(sender, request, username: str, ip_address: str, **kwargs) -> None:
    """One row per lockout of a user name from an address, counting its attempts: django-axes
    sends this signal for the attempt that locks and for every one refused while locked."""
    # Nobody is logged in: "who" is the system, the username tried is the target.
    target = (username or "")[: AuditEntry._meta.get_field("target").max_length]
    now = timezone.now()
    # Each refused attempt restarts the cool-off (axes' default), so the lockout lasts while
    # attempts come closer together than that. A row older than a day is not looked at, so the
    # lookup reads a bounded part of the log; a lockout kept up longer starts a new row each day.
    cool_off = get_cool_off(request) or _LOCKOUT_ROW_SPAN
    with transaction.atomic():
        entry = (
            AuditEntry.objects.select_for_update()
            .filter(action=Action.LOGIN_LOCKOUT, target=target, at__gte=now - _LOCKOUT_ROW_SPAN, after__ip_address=ip_address)
            .order_by("-at", "-id")
            .first()
        )
        if entry is None or not _still_locked(entry.after, now - cool_off):
            record(None, Action.LOGIN_LOCKOUT, target=target,
                   after={"ip_address": ip_address, "attempts": 1, "last_attempt_at": now.isoformat()})
            return
        entry.after = {**entry.after, "attempts": entry.after["attempts"] + 1, "last_attempt_at": now.isoformat()}
        entry.save(update_fields=["after"])


def _still_locked(after: dict, since: datetime) -> bool:
    try:
        return isinstance(after["attempts"], int) and datetime.fromisoformat(after["last_attempt_at"]) >= since
    except (KeyError, TypeError, ValueError):  # a row written before lockouts were counted
        return False
