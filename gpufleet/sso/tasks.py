"""Single sign-on's part of the central beat."""

from __future__ import annotations

from celery import shared_task

from gpufleet.sso import recheck


@shared_task(ignore_result=True)
def recheck_directory() -> int:
    """Ask the directory again about each active single sign-on user it was not asked about
    within GPUFLEET_SSO_RECHECK_S, so one who holds only API tokens, or is not seen at all,
    loses access too once it gives them no role. How many were asked about."""
    identities = list(recheck.due().select_related("user").order_by("seen_at")[:recheck.BATCH])
    for identity in identities:
        recheck.ask(identity)
    return len(identities)
