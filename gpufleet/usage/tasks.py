"""The central beat's usage jobs: roll finished hours, and retention."""

from __future__ import annotations

from celery import shared_task

from gpufleet.usage import rollup


@shared_task(name="gpufleet.usage.tasks.roll_usage", ignore_result=True)
def roll_usage() -> int:
    return rollup.roll()


@shared_task(name="gpufleet.usage.tasks.prune_usage", ignore_result=True)
def prune_usage() -> dict[str, int]:
    return rollup.prune()
