"""What the idle-claim, no-show, reminder and monthly-report tests share: the owner told,
Django's mail sent over real SMTP to the `inbox` receiver (tests/receivers.py), and a claim
whose GPUs did nothing, made through ingest as a node reports it."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.ingest.services import ingest_snapshot
from tests.claims.helpers import save_owned
from tests.factories import snapshot

SITE = "https://fleet.example.com"
STEP = timedelta(minutes=5)


def port_of(inbox) -> int:
    return int(re.search(r"mailto://127\.0\.0\.1:(\d+)", inbox.url).group(1))


@pytest.fixture(name="owner")
def owner_fixture(operator):
    """The operator, with the address the owner's mail goes to."""
    operator.email = "otto@example.com"
    operator.save()
    return operator


@pytest.fixture(name="mail")
def mail_fixture(settings, inbox):
    """Django's mail through the SMTP receiver on loopback (pytest-django keeps mail in
    memory unless told); links start with SITE."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port_of(inbox)
    settings.DEFAULT_FROM_EMAIL = "gpufleet@example.com"
    settings.GPUFLEET_SITE_URL = SITE
    return inbox


def quiet(node: str, gpus: int, at: datetime, busy: bool = False) -> None:
    """One snapshot of `node` taken `at`: its GPUs doing nothing (or, `busy`, GPU 0 at 90 %)."""
    snap = snapshot(node, gpus, at=at, util="0")
    if busy:
        snap["devices"][0]["utilization_percent"] = 90
    result = ingest_snapshot(snap)
    assert result.outcome == "accepted", result


def idle_claim(settings, owner, node: str = "alpha", gpus: int = 2, minutes: int = 90,
               end: datetime | None = None) -> Claim:
    """A claim of every GPU of a `gpus`-GPU node, owned by `owner`, whose GPUs did nothing
    for `minutes` up to `end` (now), reported every five minutes; the idle rule is one
    hour, so ingest has flagged it idle since the first snapshot."""
    settings.GPUFLEET_COLLECT_INTERVAL = int(STEP.total_seconds())
    settings.GPUFLEET_IDLE_HOURS = 1.0
    end = end or datetime.now(UTC).replace(microsecond=0)
    start = end - timedelta(minutes=minutes)
    quiet(node, gpus, start)
    from gpufleet.fleet.models import Node

    # Made with the first snapshot: a claim is never idle from before it began.
    with time_machine.travel(start, tick=False):
        claim = save_owned(Node.objects.get(name=node), gpu.Claim("train", count=gpus), owner)
    at = start + STEP
    while at <= end:
        quiet(node, gpus, at)
        at += STEP
    claim.refresh_from_db()
    assert claim.idle_since == start
    return claim
