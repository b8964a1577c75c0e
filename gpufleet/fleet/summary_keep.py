"""The overview's summary is kept, not computed for each view: summary.py computes it at
most once per GPUFLEET_SUMMARY_MAX_AGE_S and every view and poll shares it through Django's
cache (the local-memory one unless the site configures a shared one). Apart from summary.py
so that the services that change what it shows can drop it without importing its queries.

Other fleet-wide answers that the same changes alter (the claims' free GPUs and slots) are
kept the same way by `kept`, each for its own max age, and dropped by the same `changed()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from uuid import uuid4

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

KEY = "gpufleet:fleet-summary"
# The kept answers' keys carry this token; `changed()` drops it, which orphans them all at
# once (they go at their max age) whatever their keys.
GENERATION = "gpufleet:fleet-generation"
T = TypeVar("T")


def get_or_compute(compute: Callable[[], T]) -> T:
    """The kept summary, or `compute()`'s, kept for the max age (0: kept for none)."""
    return cache.get_or_set(KEY, compute, settings.GPUFLEET_SUMMARY_MAX_AGE_S)


def kept(key: str, compute: Callable[[], T], max_age_s: float) -> T:
    """The answer kept under `key` since the last `changed()`, or `compute()`'s, kept for
    `max_age_s` seconds (0: kept for none). `key` names everything the answer depends on
    but the site's rows (a request's terms, the hour it starts from)."""
    if max_age_s <= 0:
        return compute()
    generation = cache.get_or_set(GENERATION, lambda: uuid4().hex, None)
    return cache.get_or_set(f"gpufleet:kept:{generation}:{key}", compute, max_age_s)


def changed() -> None:
    """The site itself changed what the summary shows (a maintenance window, an Xid
    acknowledged, a claim): drop the kept one once that is committed (a view computing
    before then reads the old rows), so the next view shows the change. With the local-memory
    cache that drops this process's; the other processes show it within the max age."""
    transaction.on_commit(lambda: cache.delete_many([KEY, GENERATION]))
