"""Usage by team (issue #42): the GPU time of a claim counts under the team the claim
belonged to when it was counted, as its owner does, on the page, the API, `manage.py
usage` and the exports; GPU time no claim held under no team; a claim moved to another
team later keeps its past hours where they were."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.teams.models import Team
from gpufleet.usage import query, report, rollup
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.claims.helpers import claim
from tests.factories import snapshot
from tests.usage.test_pages import page, table_rows

pytestmark = pytest.mark.django_db

DAY = "2025-03-04"
TEN = datetime(2025, 3, 4, 10, tzinfo=UTC)
START, END = TEN.replace(hour=0), TEN.replace(hour=0) + timedelta(days=1)
INTERVAL = 600


@pytest.fixture
def day(settings, operator):
    """alpha's two GPUs, a snapshot every ten minutes from 10:00 to 12:30. otto's claim
    'train' of team vision pins GPU 0 after the first snapshot; after the one of 11:00 it
    is moved to team nlp. The beat rolls 10:00 and 11:00; the rest is in five-minute rows.
    So vision reserved GPU 0 from 10:10 to 11:00 (1 GPU-hour), nlp from 11:10 to 12:30
    (1 1/2); no claim held GPU 1 (16 snapshots) nor GPU 0 in the first one."""
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL
    vision, nlp = Team.objects.create(name="vision"), Team.objects.create(name="nlp")
    for step in range(16):
        at = TEN + step * timedelta(seconds=INTERVAL)
        assert ingest_snapshots([snapshot("alpha", 2, at=at)])[0].outcome == "accepted"
        if step == 0:
            train = claim(Node.objects.get(name="alpha"), "train", operator, device_ids=("0",))
            Claim.objects.filter(pk=train.pk).update(team=vision)
        if step == 6:
            Claim.objects.filter(pk=train.pk).update(team=nlp)
    rollup.roll(TEN + timedelta(hours=2, minutes=5))
    assert UsageFiveMinutes.objects.filter(bucket__gte=TEN + timedelta(hours=2)).exists()


def _reserved(rows: list[dict]) -> dict[str, float]:
    return {row["key"]["team"]: row["gpu_hours_reserved"] for row in rows}


def test_the_api_counts_each_hour_under_the_team_of_its_claim_then(viewer_client, day):
    body = viewer_client.get("/api/usage/", {"from": DAY, "to": DAY, "by": "team"}).json()
    assert body["by"] == "team"
    assert [row["key"] for row in body["rows"]] == [{"team": ""}, {"team": "nlp"}, {"team": "vision"}]
    assert _reserved(body["rows"]) == pytest.approx({"nlp": 1.5, "vision": 1.0, "": 0.0})
    # GPU time no claim held (the fake GPUs are busy): no team, all of it used unreserved.
    nobody = body["rows"][0]
    assert nobody["gpu_hours_used_unreserved"] == pytest.approx(17 / 6)
    assert body["total"]["gpu_hours_used"] == pytest.approx(17 / 6 + 2.5)


def test_moving_a_claim_to_another_team_leaves_its_past_hours_where_they_were(viewer_client, day):
    Claim.objects.update(team=Team.objects.get(name="nlp"))
    assert set(UsageHour.objects.filter(claim="train").values_list("bucket", "team")) == {
        (TEN, "vision"), (TEN + timedelta(hours=1), "vision"), (TEN + timedelta(hours=1), "nlp")}
    found = report.report(START, END, "team")
    assert {row.key["team"]: row.reserved for row in found.rows} == pytest.approx(
        {"nlp": 1.5, "vision": 1.0, "": 0.0})


def test_a_team_narrows_every_grouping(viewer_client, day):
    body = viewer_client.get("/api/usage/", {"from": DAY, "to": DAY, "by": "owner", "team": "vision"}).json()
    assert [row["key"] for row in body["rows"]] == [{"owner": "otto"}]
    assert body["total"]["gpu_hours_reserved"] == pytest.approx(1.0)
    assert report.report(START, END, "claim", {"team": "nobody"}).rows == []


def test_the_command_prints_each_team_and_no_team_in_words(day):
    out = io.StringIO()
    call_command("usage", "--from", DAY, "--to", DAY, "--by", "team", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "GPU-hours by team, 2025-03-04 to 2025-03-04 (UTC)"
    assert lines[1].startswith("team ")
    assert [line.split()[:2] for line in lines[2:-1]] == [
        ["(no", "team)"], ["nlp", "1.50"], ["vision", "1.00"], ["total", "2.50"]]
    narrowed = io.StringIO()
    call_command("usage", "--from", DAY, "--to", DAY, "--by", "team", "--team", "vision", "--json", stdout=narrowed)
    assert json.loads(narrowed.getvalue()) == query.answer(report.report(START, END, "team", {"team": "vision"}))


def test_the_page_groups_by_team_and_names_the_group_of_no_team(viewer_client, day):
    html = page(viewer_client, by="team", **{"from": DAY, "to": DAY})
    rows = table_rows(html)
    assert [row[0] for row in rows] == ["no team (unreserved, or a claim without one)", "nlp by claim",
                                        "vision by claim"]
    assert [row[1] for row in rows] == ["0.0", "1.5", "1.0"]
    # A team leads to its people's usage, and beside it its claims'.
    assert "/usage/?from=2025-03-04&amp;to=2025-03-04&amp;by=owner&amp;team=vision" in html
    assert "/usage/?from=2025-03-04&amp;to=2025-03-04&amp;by=claim&amp;team=vision" in html
    assert '<option value="team" selected>Team</option>' in html
    narrowed = table_rows(page(viewer_client, by="owner", team="vision", **{"from": DAY, "to": DAY}))
    assert [row[0].split()[0] for row in narrowed] == ["otto"]


def test_the_exports_hold_the_teams(viewer_client, day):
    lines = list(csv.reader(io.StringIO(
        viewer_client.get("/usage/export.csv", {"by": "team", "from": DAY, "to": DAY}).getvalue().decode())))
    assert lines[0][:3] == ["row", "team", "gpu_hours_reserved"]
    assert [line[:3] for line in lines[1:]] == [["group", "", "0.0"], ["group", "nlp", "1.5"],
                                               ["group", "vision", "1.0"], ["total", "", "2.5"]]
    exported = json.loads(viewer_client.get("/usage/export.json", {"by": "team", "from": DAY, "to": DAY}).getvalue())
    assert exported == viewer_client.get("/api/usage/", {"from": DAY, "to": DAY, "by": "team"}).json()


def test_a_claim_in_no_team_counts_under_no_team(viewer_client, settings, operator):
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL
    assert ingest_snapshots([snapshot("alpha", 1, at=TEN)])[0].outcome == "accepted"
    claim(Node.objects.get(name="alpha"), "loose", operator)
    Claim.objects.update(team=None)
    assert ingest_snapshots([snapshot("alpha", 1, at=TEN + timedelta(seconds=INTERVAL))])[0].outcome == "accepted"
    rows = report.report(START, END, "team").rows
    assert [(row.key, round(row.reserved * 6)) for row in rows] == [({"team": ""}, 1)]

