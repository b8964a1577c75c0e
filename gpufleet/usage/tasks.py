"""The central beat's usage jobs: roll finished hours, retention, idle claims handed back,
reminders to claim owners and the monthly reports."""

from __future__ import annotations

import logging

from celery import shared_task

from gpufleet.usage import idle, monthly, reminders, rollup

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.usage.tasks.roll_usage", ignore_result=True)
def roll_usage() -> int:
    return rollup.roll()


@shared_task(name="gpufleet.usage.tasks.prune_usage", ignore_result=True)
def prune_usage() -> dict[str, int]:
    return rollup.prune()


@shared_task(name="gpufleet.usage.tasks.idle_claims", ignore_result=True)
def idle_claims() -> dict[str, list[str]]:
    """Tell the owners of idle claims; with GPUFLEET_RELEASE_IDLE, release those idle past the grace."""
    done = idle.run()
    if done.warned or done.released:
        log.info("idle claims: %d owner(s) told (%s), %d released (%s)", len(done.warned), ", ".join(done.warned),
                 len(done.released), ", ".join(done.released))
    return {"warned": done.warned, "released": done.released}


@shared_task(name="gpufleet.usage.tasks.remind_owners", ignore_result=True)
def remind_owners() -> dict[str, list[str]]:
    """Remind the owners of the claims that start, or end, within the hour."""
    done = reminders.run()
    if done.starting or done.ending:
        log.info("reminded the owners of %d claim(s) starting (%s) and %d ending (%s)", len(done.starting),
                 ", ".join(done.starting), len(done.ending), ", ".join(done.ending))
    return {"starting": done.starting, "ending": done.ending}


@shared_task(name="gpufleet.usage.tasks.monthly_reports", ignore_result=True)
def monthly_reports() -> int:
    """Last month's usage reports, made once the month is rolled; the owners' emails sent."""
    return monthly.run()
