"""The overview's summary is kept, not computed for each view: summary.py computes it at
most once per GPUFLEET_SUMMARY_MAX_AGE_S and every view and poll shares it through Django's
cache (the local-memory one unless the site configures a shared one). Apart from summary.py
so that the services that change what it shows can drop it without importing its queries."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

KEY = "gpufleet:fleet-summary"
T = TypeVar("T")


def get_or_compute(compute: Callable[[], T]) -> T:
    """The kept summary, or `compute()`'s, kept for the max age (0: kept for none)."""
    return cache.get_or_set(KEY, compute, settings.GPUFLEET_SUMMARY_MAX_AGE_S)


def changed() -> None:
    """The site itself changed what the summary shows (a maintenance window, an Xid
    acknowledged, a claim): drop the kept one once that is committed (a view computing
    before then reads the old rows), so the next view shows the change. With the local-memory
    cache that drops this process's; the other processes show it within the max age."""
    transaction.on_commit(lambda: cache.delete(KEY))
