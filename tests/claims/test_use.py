"""The "Claims vs use" page and its exports: every disagreement between the
claims and the work on the GPUs that ingest found, fleet-wide, filtered, sorted,
paged, in a fixed number of queries whatever the fleet size."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot, ingest_snapshots
from tests.claims.helpers import HTMX, claim
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

BOX = {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": None}


def _busy(name: str, at=None, label: str | None = None, box: str = "trainer") -> dict:
    snap = snapshot(name, 4, at=at)
    for device in snap["devices"]:
        device["utilization_percent"] = 0
    snap["devices"][2]["processes"] = [
        {"pid": 4412, "name": "python3", "used_mib": 30720, "container": {**BOX, "name": box, "claim": label}}
    ]
    return snap


@pytest.fixture
def fleet(operator):
    """alpha: GPU 2 busy, no claim. beta: a container labelled for a claim that pins
    GPU 0, running on GPU 2. gamma: a claim whose GPUs did nothing for a day."""
    ingest_snapshot(_busy("alpha"))
    ingest_snapshot(_busy("beta", label="train"))
    claim(Node.objects.get(name="beta"), "train", operator, device_ids=["0"])
    ingest_snapshot(_busy("beta", at=datetime.now(UTC) + timedelta(seconds=1), label="train"))
    day_ago = datetime.now(UTC) - timedelta(hours=25)
    quiet = snapshot("gamma", 4, at=day_ago)
    for device in quiet["devices"]:
        device["utilization_percent"] = 0
    ingest_snapshot(quiet)
    with time_machine.travel(day_ago, tick=False):  # a claim is idle from its start
        claim(Node.objects.get(name="gamma"), "notebooks", operator, count=2)
    quiet["collected_at"] = datetime.now(UTC).isoformat()
    ingest_snapshot(quiet)


def _rows(html: str) -> list[tuple[str, str]]:
    """(node, kind) per table row."""
    return re.findall(r'<td[^>]*><a href="/nodes/[^"]+/">([^<]+)</a></td>\s*<th scope="row"><span[^>]*>([^<]+)</span>', html)


def test_it_lists_each_kind_of_disagreement_by_node(viewer_client, fleet):
    response = viewer_client.get("/claims/use/")
    assert response.status_code == 200
    html = response.content.decode()
    assert _rows(html) == [
        ("alpha", "Used but unclaimed"),
        ("beta", "Running outside its claim"),
        ("beta", "Used but unclaimed"),
        ("gamma", "Claimed but idle"),
    ]
    assert "GPU 2 (container trainer)" in html and "claim &#x27;train&#x27; holds other GPUs" in html
    assert "&#x27;notebooks&#x27; (GPUs 0, 1, 2, 3)" in html


def test_a_container_attached_to_an_unclaimed_gpu_and_idle_is_attached_not_in_use(viewer_client):
    snap = snapshot("delta", 2)
    for device in snap["devices"]:
        device["utilization_percent"] = 0
    snap["devices"][1]["attached_idle"] = [{**BOX, "name": "notebook"}]
    ingest_snapshot(snap)
    html = viewer_client.get("/claims/use/").content.decode()
    assert _rows(html) == [("delta", "Attached but unclaimed")]
    assert "1 GPU with a container attached, idle, that no claim holds: GPU 1 (container notebook)" in html
    assert "in use" not in html[html.index('id="use-table"'):]
    assert _rows(viewer_client.get("/claims/use/?kind=attached-unclaimed").content.decode()) == [
        ("delta", "Attached but unclaimed")
    ]
    assert _rows(viewer_client.get("/claims/use/?kind=use-unclaimed").content.decode()) == []


def test_it_filters_by_kind_and_node_and_sorts_both_ways(viewer_client, fleet):
    assert _rows(viewer_client.get("/claims/use/?kind=claim-idle").content.decode()) == [("gamma", "Claimed but idle")]
    assert [n for n, _ in _rows(viewer_client.get("/claims/use/?q=BET").content.decode())] == ["beta", "beta"]
    by_kind = _rows(viewer_client.get("/claims/use/?sort=kind").content.decode())
    assert by_kind == [("gamma", "Claimed but idle"), ("beta", "Running outside its claim"),
                       ("alpha", "Used but unclaimed"), ("beta", "Used but unclaimed")]
    assert [n for n, _ in _rows(viewer_client.get("/claims/use/?sort=-node").content.decode())][0] == "gamma"


def test_an_invalid_filter_lists_nothing_and_says_why_and_the_export_refuses_it(viewer_client, fleet):
    html = viewer_client.get("/claims/use/?kind=bogus").content.decode()
    assert _rows(html) == [] and "Select a valid choice" in html
    response = viewer_client.get("/claims/use.csv?sort=sideways")
    assert response.status_code == 400 and "sort: Select a valid choice" in response.content.decode()


def test_htmx_gets_the_table_alone(viewer_client, fleet):
    html = viewer_client.get("/claims/use/?kind=use-unclaimed", **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="use-table"') and "<h1>" not in html
    assert [n for n, _ in _rows(html)] == ["alpha", "beta"]


def test_the_csv_export_holds_the_filtered_rows_with_cells_made_safe(viewer_client, fleet):
    ingest_snapshot(_busy("delta", box="=HYPERLINK(1)"))
    response = viewer_client.get("/claims/use.csv?kind=use-unclaimed&sort=-node")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="gpufleet-claims-vs-use-' in response["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [r["node"] for r in table] == ["delta", "beta", "alpha"]
    assert {r["kind"] for r in table} == {"Used but unclaimed"}
    # A container name is the workload's text: it must not become a formula.
    assert "(container =HYPERLINK(1))" in table[0]["detail"]
    assert all(not r["detail"].startswith("=") for r in table)


def test_the_json_export_names_its_columns_and_every_row(viewer_client, fleet):
    response = viewer_client.get("/claims/use.json")
    document = json.loads(b"".join(response.streaming_content))
    assert document["columns"] == ["node", "kind", "code", "status", "detail", "node_health", "collected_at"]
    assert [(r["node"], r["code"]) for r in document["rows"]] == [
        ("alpha", "use-unclaimed"), ("beta", "use-misplaced"), ("beta", "use-unclaimed"), ("gamma", "claim-idle")
    ]
    assert all(r["status"] == "warn" and r["node_health"] == "warn" for r in document["rows"])


def test_it_needs_a_login(client, fleet):
    for url in ("/claims/use/", "/claims/use.csv", "/claims/use.json"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_claims_list_says_since_when_a_claim_is_idle(viewer_client, fleet):
    idle = Claim.objects.get(name="notebooks")
    assert idle.idle_since is not None
    html = viewer_client.get("/claims/").content.decode()
    assert f'idle since <time datetime="{idle.idle_since.isoformat()}">' in html
    assert html.count("idle since") == 1  # "train" on beta is in use: its label's container runs


@pytest.mark.parametrize("nodes", [3, 30])
def test_the_page_and_the_export_take_fixed_queries_whatever_the_fleet_size(viewer_client, django_assert_num_queries,
                                                                            nodes):
    assert {r.outcome for r in ingest_snapshots([_busy(f"n{i:03}") for i in range(nodes)])} == {"accepted"}
    # session, user, the user's and its groups' permissions, count, a page of findings with their nodes
    with django_assert_num_queries(6):
        assert viewer_client.get("/claims/use/").status_code == 200
    with django_assert_num_queries(5):  # no count: the rows, streamed
        response = viewer_client.get("/claims/use.csv")
        assert len(b"".join(response.streaming_content).splitlines()) == nodes + 1
