"""The snapshot's `dcgm` key (whether the node has DCGM): validated strictly, stored on the
node, optional for agents older than DCGM detection (what the site knew stays); and the
`dcgm-diag` finding is the site's alone."""

from __future__ import annotations

import pytest

from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db

INSTALLED = {"installed": True, "version": "4.4.2", "problem": ""}


def test_it_stores_what_the_agent_says_of_dcgm_and_keeps_it_for_an_older_agent():
    snap = {**snapshot("alpha", 2), "dcgm": INSTALLED}
    assert ingest_snapshot(snap).outcome == "accepted"
    assert Node.objects.get(name="alpha").dcgm == INSTALLED
    older = snapshot("alpha", 2, at=later(snap))
    assert "dcgm" not in older
    assert ingest_snapshot(older).outcome == "accepted"
    assert Node.objects.get(name="alpha").dcgm == INSTALLED
    missing = {**snapshot("alpha", 2, at=later(snap, 60)), "dcgm": {"installed": False, "version": "",
                                                                    "problem": "dcgmi not found on PATH"}}
    assert ingest_snapshot(missing).outcome == "accepted"
    assert Node.objects.get(name="alpha").dcgm["installed"] is False


@pytest.mark.parametrize("dcgm", [
    {"installed": "yes", "version": "", "problem": ""},
    {"installed": True, "version": "4.4.2"},
    {"installed": True, "version": "4.4.2", "problem": "", "extra": 1},
    {"installed": True, "version": "x" * 65, "problem": ""},
    {"installed": True, "version": "4.4.2\n", "problem": ""},
    "4.4.2",
])
def test_a_malformed_dcgm_key_rejects_the_snapshot(dcgm):
    result = ingest_snapshot({**snapshot("alpha", 2), "dcgm": dcgm})
    assert result.outcome == "rejected" and "dcgm" in result.reason
    assert not Node.objects.filter(name="alpha", gpu_count=2).exists()


def test_an_agent_may_not_write_the_diagnostic_finding():
    snap = snapshot("alpha", 2)
    snap["findings"].append({"code": "dcgm-diag", "name": "DCGM diagnostic", "status": "ok", "message": "passed"})
    result = ingest_snapshot(snap)
    assert result.outcome == "rejected" and "dcgm-diag" in result.reason


def test_the_agent_clips_a_long_dcgm_text_to_the_schemas_limits():
    from gpufleet.gpu.dcgm import DcgmInfo
    from gpufleet.wire import build_snapshot
    from tests.factories import diagnosis

    snap = build_snapshot(diagnosis("alpha", 2), "alpha", dcgm=DcgmInfo(False, problem="e\x00" * 500))
    assert len(snap["dcgm"]["problem"]) == 200 and "\x00" not in snap["dcgm"]["problem"]
    assert ingest_snapshot(snap).outcome == "accepted"
