"""Lies an agent cannot tell: a finding code only the centre writes is refused and
counted; and a node whose agent kept a key of before a rotation (its messages refused
as old-key, tests/ingest/test_stream_replays.py) shows as not reporting with a valid
key once it goes offline, never as FAIL while it is online."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gpufleet import wire
from gpufleet.fleet import tasks as fleet_tasks
from gpufleet.fleet.models import Node, Refusal
from gpufleet.ingest import schema
from gpufleet.ingest.refusals import count_refusals
from gpufleet.ingest.services import ACCEPTED, REJECTED, ingest_snapshot
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


def test_a_node_whose_agent_kept_the_old_key_goes_offline_as_not_reporting_with_a_valid_key(viewer_client, settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 30
    long_ago = timezone.now() - timedelta(hours=1)
    for name in ("alpha", "bravo", "charlie"):
        ingest_snapshot(snapshot(name, 1, at=long_ago), now=long_ago)
    # alpha's agent has a key of before a rotation; charlie is only off; bravo had
    # junk sent in its name, but not with a key it once had.
    count_refusals({("alpha", Refusal.OLD_KEY): 3, ("bravo", Refusal.BAD_SIGNATURE): 9})
    assert fleet_tasks.mark_offline() == 3
    alpha, bravo, charlie = (Node.objects.get(name=name) for name in ("alpha", "bravo", "charlie"))
    assert alpha.offline and alpha.problem.startswith("Not reporting with a valid key")
    assert alpha.lacks_valid_key and not bravo.lacks_valid_key and not charlie.lacks_valid_key
    assert not bravo.problem.startswith("Not reporting") and not charlie.problem.startswith("Not reporting")
    assert b"Not reporting with a valid key" in viewer_client.get("/nodes/alpha/").content
    assert b"Not reporting with a valid key" not in viewer_client.get("/nodes/bravo/").content


def test_an_online_node_never_shows_as_lacking_a_key(viewer_client):
    ingest_snapshot(snapshot("alpha", 1))
    count_refusals({("alpha", Refusal.OLD_KEY): 3})
    assert fleet_tasks.mark_offline() == 0
    assert b"Not reporting with a valid key" not in viewer_client.get("/nodes/alpha/").content


# Every finding code the centre writes (the probe named these).
CENTRE_CODES = ["rejected-snapshot", "claims-overlap", "lost-capacity", "use-unclaimed", "attached-unclaimed",
                "use-misplaced", "claim-idle", "dcgm-diag"]


@pytest.mark.parametrize("code", CENTRE_CODES)
def test_a_finding_code_only_the_centre_writes_is_refused_from_an_agent_and_counted(code):
    good = snapshot("alpha", 2)
    assert ingest_snapshot(good).outcome == ACCEPTED
    lie = snapshot("alpha", 2, at=later(good))
    lie["findings"].append({"code": code, "name": "Lie", "status": "ok", "message": "all is well", "fix": ""})
    with pytest.raises(wire.CentreOnlyFinding, match=code):
        schema.parse_snapshot(lie)
    with pytest.raises(wire.CentreOnlyFinding):
        schema.parse_snapshot(wire.encode_snapshot(lie))
    result = ingest_snapshot(lie)
    assert result.outcome == REJECTED and "only the site writes" in result.reason
    node = Node.objects.get(name="alpha")
    assert node.collected_at.isoformat() == good["collected_at"]
    assert (node.refused_total, node.refused_last_reason) == (1, Refusal.CENTRE_ONLY_CODE)
    assert not node.findings.filter(code=code, name="Lie").exists()


def test_the_agent_may_still_say_it_clipped_its_snapshot():
    snap = snapshot("alpha", 2)
    snap["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(wire.CDI_DEVICES_MAX + 1)]
    clipped = wire.fit_snapshot(snap)
    assert "snapshot-clipped" in [f["code"] for f in clipped["findings"]]
    assert ingest_snapshot(clipped).outcome == ACCEPTED


def test_the_list_of_centre_only_codes_is_every_code_the_centre_writes():
    written = set()
    for path in ("gpufleet/ingest/services.py", "gpufleet/gpu/usage.py", "gpufleet/gpu/dcgm.py"):
        text = (REPO / path).read_text(encoding="utf-8")
        written |= set(re.findall(r'Finding\(\s*"([a-z][a-z0-9-]*)"', text))
        written |= set(re.findall(r'code="([a-z][a-z0-9-]*)"', text))
        written |= set(re.findall(r'FINDING_CODE = "([a-z][a-z0-9-]*)"', text))  # the DCGM diagnostic's
    assert written == set(CENTRE_CODES) == set(wire.CENTRE_ONLY_CODES)


def test_refusal_codes_of_the_wire_are_refusals():
    assert wire.SnapshotError.refusal in Refusal.values
    assert wire.CentreOnlyFinding.refusal == Refusal.CENTRE_ONLY_CODE
