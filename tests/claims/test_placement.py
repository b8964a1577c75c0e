"""Find a node: the placement answer on the claims page, from stored nodes that came
in through ingest, and "claim here" through the normal (locked, ledger-checked) save."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.claims.placement import fleet_placement
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.claims.helpers import HTMX, claim, field_errors, make_node, uuid
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

GIB = 1024


def a100_node(node: str, used_mib: int) -> Node:
    result = ingest_snapshot(snapshot(node, 2, name="NVIDIA A100-SXM4-80GB", total_mib=81920, used_mib=used_mib))
    assert result.outcome == "accepted", result
    return Node.objects.get(name=node)


def mixed_fleet(operator) -> None:
    """Nodes of two models, some partly claimed, one of each state that rules out."""
    make_node("h200-eight", 8)
    claim(make_node("h200-four", 4), "train", operator, count=2)
    a100_node("a100-two", used_mib=1024)
    a100_node("a100-full", used_mib=80000)
    make_node("gone", 8)
    make_node("sick", 8)
    make_node("late", 8)
    Node.objects.filter(name="gone").update(offline=True)
    Node.objects.filter(name="sick").update(health="fail")
    Node.objects.filter(name="late").update(last_seen=timezone.now() - timedelta(hours=1))


def names(fits) -> list[str]:
    return [f.name for f in fits]


def test_it_answers_from_the_ledgers_of_every_node(operator):
    mixed_fleet(operator)
    placement = fleet_placement(gpu.PlacementRequest(count=2))
    # Exactly two GPUs left free on three nodes; among them the most free VRAM first.
    assert names(placement.fits) == ["h200-four", "a100-two", "a100-full", "h200-eight"]
    assert {r.name: r.reason for r in placement.ruled_out} == {
        "gone": "offline",
        "sick": "failing",
        "late": "stale: it missed its last reports",
    }


def test_it_filters_by_model_and_free_vram(operator):
    mixed_fleet(operator)
    placement = fleet_placement(gpu.PlacementRequest(count=2, model="a100", min_free_vram_mib=40 * GIB))
    assert names(placement.fits) == ["a100-two"]
    reasons = {r.name: r.code for r in placement.ruled_out}
    assert reasons["a100-full"] == "low_vram"
    assert reasons["h200-eight"] == reasons["h200-four"] == "no_model"


def test_it_counts_claims_that_the_ledger_counts(operator):
    mixed_fleet(operator)
    placement = fleet_placement(gpu.PlacementRequest(count=3))
    assert "h200-four" not in names(placement.fits)
    ruled = {r.name: r.reason for r in placement.ruled_out}
    assert ruled["h200-four"] == "too few free GPUs (2 free of 4)"


def test_whole_nodes_need_nothing_reserved(operator):
    mixed_fleet(operator)
    placement = fleet_placement(gpu.PlacementRequest(count=0))
    assert names(placement.fits) == ["h200-eight", "a100-two", "a100-full"]
    assert [f.gpus for f in placement.fits] == [8, 2, 2]


@pytest.mark.parametrize("extra_nodes", [0, 12])
def test_it_reads_the_fleet_in_fixed_queries(operator, django_assert_num_queries, extra_nodes):
    mixed_fleet(operator)
    for n in range(extra_nodes):
        claim(make_node(f"more-{n}", 4), f"job-{n}", operator, count=1)
    # nodes, their current GPUs, their claims
    with django_assert_num_queries(3):
        placement = fleet_placement(gpu.PlacementRequest(count=1))
    assert len(placement.fits) + len(placement.ruled_out) == 7 + extra_nodes


def test_the_claims_page_offers_the_form(viewer_client):
    html = viewer_client.get("/claims/").content.decode()
    assert 'action="/claims/find/"' in html
    assert 'id="placement-result"' in html


def test_the_page_answers_without_javascript_and_offers_claim_here(operator_client, operator):
    mixed_fleet(operator)
    response = operator_client.get("/claims/find/", {"count": "2", "model": "A100"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html
    # Only GPUs of that model will do, so "claim here" pins the ones the answer chose.
    assert [unescape(link) for link in re.findall(r'href="(/claims/nodes/[^"]+)"', html)] == [
        f"/claims/nodes/{name}/new/?devices={uuid(node, 0)}&devices={uuid(node, 1)}"
        for name, node in [("a100-two", Node.objects.get(name="a100-two")), ("a100-full", Node.objects.get(name="a100-full"))]
    ]
    assert "no GPU of model &#x27;A100&#x27;" in html
    assert "Ruled out: 5 nodes" in html
    assert "no GPU of that model: 2" in html and "offline: 1" in html


def test_the_answer_is_in_gib_as_the_question_was(viewer_client, operator):
    mixed_fleet(operator)
    html = viewer_client.get("/claims/find/", {"count": "2", "model": "A100", "min_free_vram_gib": "40"},
                             **HTMX).content.decode()
    assert "MiB" not in html
    assert re.search(r'<th scope="col">Free VRAM \(GiB\)</th>', html)
    # a100-two: two GPUs of 81,920 MiB with 1,024 used.
    assert re.search(r"<td[^>]*>158\.0</td>", html)
    assert "not enough free VRAM: no GPU has 40 GiB free" in html
    half = viewer_client.get("/claims/find/", {"count": "2", "min_free_vram_gib": "79.5"}, **HTMX).content.decode()
    assert "no GPU has 79.5 GiB free" in half


def test_htmx_gets_the_answer_alone(viewer_client, operator):
    mixed_fleet(operator)
    response = viewer_client.get("/claims/find/", {"count": "1"}, **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="placement-result">')
    assert "<html" not in html
    # A viewer sees the answer but is not offered a claim.
    assert "Claim here" not in html


def test_a_bad_question_is_answered_with_why(viewer_client):
    response = viewer_client.get("/claims/find/", {"count": "0"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200
    assert "GPUs: Ensure this value is greater than or equal to 1." in html
    missing = viewer_client.get("/claims/find/", {"count": ""}, **HTMX).content.decode()
    assert "Say how many GPUs" in missing


def test_whole_node_links_claim_every_gpu(operator_client, operator):
    make_node("empty", 2)
    html = operator_client.get("/claims/find/", {"whole_node": "on"}).content.decode()
    assert 'href="/claims/nodes/empty/new/?mode=all"' in html
    form = operator_client.get("/claims/nodes/empty/new/?mode=all").content.decode()
    assert re.search(r'value="all"[^>]*checked', form)


def test_claim_here_prefills_the_form_and_the_ledger_still_decides_the_post(operator_client, operator):
    node = make_node("h200-four", 4)
    form = operator_client.get("/claims/nodes/h200-four/new/?count=3").content.decode()
    assert re.search(r'name="count" value="3"', form)
    # Someone else takes two GPUs between the answer and the save: the ledger refuses.
    claim(node, "first", operator, count=2)
    response = operator_client.post(
        "/claims/nodes/h200-four/new/", {"name": "mine", "mode": "count", "count": "3", "owner": operator.username}
    )
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "count") == ["Needs 3 GPUs but only 2 of 4 are free."]
    assert not Claim.objects.filter(name="mine").exists()


def test_claim_here_on_a_mixed_node_pins_the_gpus_of_the_model(operator_client, operator):
    # GPUs 0 and 1 have little VRAM free: only 2 and 3 will do, so those are pinned.
    ingest_snapshot(snapshot("mixed", 4, used_mib=140000))
    node = Node.objects.get(name="mixed")
    node.devices.filter(index__in=[2, 3]).update(vram_used_mib=0)
    placement = fleet_placement(gpu.PlacementRequest(count=2, min_free_vram_mib=100 * GIB))
    (fit,) = placement.fits
    assert fit.device_ids == (uuid(node, 2), uuid(node, 3))
    html = operator_client.get("/claims/find/", {"count": "2", "min_free_vram_gib": "100"}).content.decode()
    link = unescape(re.search(r'href="(/claims/nodes/mixed/new/[^"]+)"', html).group(1))
    form = operator_client.get(link).content.decode()
    checked = re.findall(r'<input type="checkbox" name="devices" value="([^"]+)"[^>]*checked', form)
    assert checked == [uuid(node, 2), uuid(node, 3)]
    response = operator_client.post(
        "/claims/nodes/mixed/new/",
        {"name": "big", "mode": "devices", "devices": checked, "owner": operator.username},
    )
    assert response.status_code == 302
    assert Claim.objects.get(name="big").device_ids == [uuid(node, 2), uuid(node, 3)]


def test_the_page_needs_a_login(client):
    response = client.get("/claims/find/", {"count": "1"})
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
