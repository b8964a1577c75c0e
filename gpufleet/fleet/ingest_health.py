"""Whether the site hears its nodes: the one rule for the central beat (which opens an
ingest-silent event of the site while it does not: gpufleet/fleet/tasks.py) and for
/healthz (503 with the reason while it does not).

The site receives no snapshots when nodes are enrolled (an unrevoked key) and none was
stored for GPUFLEET_INGEST_SILENCE_ALERT_S: counted from the last one stored, or from the
first enrolment where that came later (nothing was expected before it). Every stored
snapshot stamps its node's `last_seen`, so the usual answer, "one arrived lately", is a
single look for a recent stamp; a silent site costs two aggregates more."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, Min
from django.utils import timezone

from gpufleet.fleet.models import Node, NodeCredential


@dataclass(frozen=True)
class IngestSilence:
    """The site has stored no snapshot since `since`; `last_stored` is when the last
    one was (None: never)."""

    since: datetime
    last_stored: datetime | None

    @property
    def reason(self) -> str:
        """What /healthz answers and the event says, with when the last snapshot came."""
        if self.last_stored is None:
            last = f"none was stored since the first node was enrolled, {self.since:%Y-%m-%d %H:%M} UTC"
        else:
            last = f"the last one was stored {self.last_stored:%Y-%m-%d %H:%M} UTC"
        return f"gpufleet receives no snapshots: check the ingest worker and the broker; {last}"


def silence_after() -> timedelta:
    return timedelta(seconds=settings.GPUFLEET_INGEST_SILENCE_ALERT_S)


def ingest_silence(now: datetime | None = None) -> IngestSilence | None:
    """Since when the site has heard nothing while it should, or None while it hears
    its nodes (or has none enrolled). At most three statements, whatever the fleet size."""
    now = now or timezone.now()
    cutoff = now - silence_after()
    if Node.objects.filter(last_seen__gt=cutoff).exists():
        return None
    enrolled = NodeCredential.objects.filter(revoked_at__isnull=True).aggregate(first=Min("issued_at"))["first"]
    if enrolled is None or enrolled > cutoff:
        return None
    last_stored = Node.objects.aggregate(last=Max("last_seen"))["last"]
    return IngestSilence(since=max(enrolled, last_stored) if last_stored else enrolled, last_stored=last_stored)
