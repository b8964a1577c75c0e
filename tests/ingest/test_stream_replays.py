"""Replays on the ingest stream: an entry signed with a key of before a rotation, or a
snapshot not newer than the stored one, is refused and counted on the node it names,
and never turns that node FAIL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet import wire
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Health, Node, Refusal
from gpufleet.ingest import stream
from gpufleet.ingest.services import ACCEPTED, STALE
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db


def _entry(key: wire.NodeKey, snap: dict) -> dict:
    return wire.encode_entry(key, snap["node"], wire.SNAPSHOT, [wire.encode_snapshot(snap), None])


def test_messages_signed_with_the_key_of_before_a_rotation_are_refused_and_counted_never_failing_the_node():
    old = credentials.enroll("alpha")
    assert stream.in_process([_entry(old, snapshot("alpha", 2))]) == [ACCEPTED]
    new = credentials.enroll("alpha", rotate=True)
    replayed = _entry(old, snapshot("alpha", 2, at=timezone.now() + timedelta(seconds=5)))
    assert stream.in_process([replayed] * 30) == [stream.REFUSED] * 30
    node = Node.objects.get(name="alpha")
    assert node.status == Health.OK and node.problem == ""
    assert not node.findings.filter(code="rejected-snapshot").exists()
    assert (node.refused_total, node.refused_last_reason) == (30, Refusal.OLD_KEY)
    assert stream.in_process([_entry(new, snapshot("alpha", 2, at=timezone.now() + timedelta(seconds=6)))]) == [ACCEPTED]


@pytest.mark.parametrize("seconds", [-30, 0])
def test_a_replayed_snapshot_not_newer_than_the_stored_one_is_refused_and_counted(seconds):
    key = credentials.enroll("alpha")
    first = snapshot("alpha", 2)
    assert stream.in_process([_entry(key, first)]) == [ACCEPTED]
    assert stream.in_process([_entry(key, snapshot("alpha", 2, at=later(first, seconds)))]) == [STALE]
    node = Node.objects.get(name="alpha")
    assert (node.refused_total, node.refused_last_reason) == (1, Refusal.REPLAY)
    assert node.status == Health.OK


def test_forged_entries_naming_a_node_do_not_spend_its_cap(settings):
    """Any broker user can append entries in any node's name: only those the node
    really signed count against what it may have accepted per collect interval."""
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 4
    key = credentials.enroll("alpha")
    forged_key = wire.NodeKey(key.generation, b"not alpha's key" * 2)
    forged = [_entry(forged_key, snapshot("alpha", 1)) for _ in range(50)]
    real = _entry(key, snapshot("alpha", 2))
    assert stream.in_process([*forged, real]) == [stream.REFUSED] * 50 + [ACCEPTED]
    node = Node.objects.get(name="alpha")
    assert (node.refused_total, node.refused_last_reason) == (50, Refusal.BAD_SIGNATURE)


def test_a_node_flooding_in_its_own_name_is_capped_per_interval(settings):
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 4
    key = credentials.enroll("bravo")
    start = timezone.now()
    flood = [_entry(key, snapshot("bravo", 1, at=start + timedelta(milliseconds=i))) for i in range(20)]
    outcomes = stream.in_process(flood)
    assert outcomes[4:] == [stream.REFUSED] * 16 and outcomes[:4].count(ACCEPTED) == 1
    # The three of the four that a newer one of the batch replaced count as replays.
    assert Node.objects.get(name="bravo").refused_total == 16 + outcomes.count(STALE)


def test_only_what_the_old_key_really_signed_counts_as_an_old_key(settings, viewer_client):
    """Entries that merely claim an old generation of a node that is down make it
    neither look like an agent holding an old key nor go FAIL."""
    from gpufleet.fleet import tasks as fleet_tasks
    from gpufleet.ingest.services import ingest_snapshot

    settings.GPUFLEET_COLLECT_INTERVAL = 30
    credentials.enroll("alpha")
    key = credentials.enroll("alpha", rotate=True)
    long_ago = timezone.now() - timedelta(hours=1)
    ingest_snapshot(snapshot("alpha", 1, at=long_ago), now=long_ago)
    claimed_old = wire.NodeKey(key.generation - 1, b"not alpha's old key" * 2)
    assert stream.in_process([_entry(claimed_old, snapshot("alpha", 1))] * 5) == [stream.REFUSED] * 5
    assert Node.objects.get(name="alpha").refused_last_reason == Refusal.BAD_SIGNATURE
    fleet_tasks.mark_offline()
    alpha = Node.objects.get(name="alpha")
    assert alpha.offline and not alpha.lacks_valid_key and alpha.health != Health.FAIL
