"""GET /api/usage/: the usage report of a period, grouped and narrowed as asked, behind
the API's login and roles, a bad parameter refused in words naming it; the same answer
as `manage.py usage --json` prints and as gpufleet.usage.report reads, on rows written
by hand and on a day stored by the real ingest and rolled by the beat's code."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from gpufleet.api.models import ApiToken
from gpufleet.usage import query, report
from gpufleet.usage.models import UsageFiveMinutes
from tests.usage.api_helpers import DAY, ingested_day, known_hours

pytestmark = pytest.mark.django_db

URL = "/api/usage/"
FIGURES = ["gpu_hours_reserved", "gpu_hours_used", "gpu_hours_idle_reserved", "gpu_hours_used_unreserved",
           "gpu_hours_unknown", "gpu_hours_power_unknown", "efficiency", "energy_kwh", "cost"]


@pytest.fixture
def prices(settings):
    settings.GPUFLEET_PRICE_GPU_HOUR = {"NVIDIA H200": 4.0, "*": 1.0}
    settings.GPUFLEET_PRICE_KWH = 0.5
    settings.GPUFLEET_CURRENCY = "EUR"


def _figures(row: dict) -> list:
    return [row[name] for name in FIGURES]


def test_it_answers_each_group_s_figures_in_hours_kwh_and_cost(viewer_client, prices):
    known_hours()
    response = viewer_client.get(URL, {"from": DAY, "to": DAY, "by": "owner"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert list(body) == ["by", "from", "to", "currency", "rows", "total"]
    assert (body["by"], body["from"], body["to"], body["currency"]) == ("owner", DAY, DAY, "EUR")
    assert [row["key"] for row in body["rows"]] == [{"owner": "otto"}, {"owner": ""}, {"owner": "vera"}]
    otto, nobody, vera = body["rows"]
    assert list(otto) == ["key", *FIGURES]
    assert _figures(otto) == pytest.approx([2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 1.4, 8.7])
    # Unreserved and unknown: no efficiency, and no kWh without a power reading (never 0).
    assert _figures(nobody)[:6] == pytest.approx([0.0, 0.5, 0.0, 0.5, 2.0, 1.0])
    assert (nobody["efficiency"], nobody["energy_kwh"], nobody["cost"]) == (None, None, pytest.approx(2.0))
    # The hour the beat has not rolled comes from the five-minute rows.
    assert _figures(vera) == pytest.approx([1 / 12, 0.0, 1 / 12, 0.0, 0.0, 0.0, 0.0, 0.01, 1 / 12 + 0.005])
    assert body["total"]["key"] == {}
    assert _figures(body["total"]) == pytest.approx([2 + 1 / 12, 1.5, 1 + 1 / 12, 0.5, 2.0, 1.0, 1 / (2 + 1 / 12), 1.41,
                                                     8.7 + 2.0 + 1 / 12 + 0.005])


def test_without_prices_there_is_no_cost(viewer_client):
    known_hours()
    body = viewer_client.get(URL, {"from": DAY, "to": DAY}).json()
    assert body["currency"] == "" and body["total"]["cost"] is None
    assert {row["cost"] for row in body["rows"]} == {None}


@pytest.mark.parametrize("by, keys", [
    ("claim", [{"claim_id": 7, "claim": "train", "node": "alpha", "owner": "otto"},
               {"claim_id": None, "claim": "", "node": "beta", "owner": ""},
               {"claim_id": None, "claim": "", "node": "alpha", "owner": ""},
               {"claim_id": 8, "claim": "notebooks", "node": "beta", "owner": "vera"}]),
    ("team", [{"team": "vision"}, {"team": ""}]),
    ("node", [{"node_id": 1, "node": "alpha"}, {"node_id": 2, "node": "beta"}]),
    ("model", [{"model": "NVIDIA H200"}, {"model": "NVIDIA A100"}]),
    ("image", [{"image": "pytorch/pytorch:2.5.1"}, {"image": ""}]),
    ("label", [{"label": "train"}, {"label": ""}]),
])
def test_it_groups_by_each_key_the_report_knows(viewer_client, by, keys):
    known_hours()
    body = viewer_client.get(URL, {"from": DAY, "to": DAY, "by": by}).json()
    assert body["by"] == by
    assert sorted(map(json.dumps, (row["key"] for row in body["rows"]))) == sorted(map(json.dumps, keys))


@pytest.mark.parametrize("params, owners", [
    ({"owner": "otto"}, [{"owner": "otto"}]),
    ({"team": "vision"}, [{"owner": "otto"}]),
    ({"claim_id": "8"}, [{"owner": "vera"}]),
    ({"node_id": "2"}, [{"owner": "vera"}, {"owner": ""}]),
    ({"model": "NVIDIA H200"}, [{"owner": "otto"}, {"owner": ""}]),
    ({"image": "pytorch/pytorch:2.5.1"}, [{"owner": "otto"}]),
    ({"owner": "nobody"}, []),
])
def test_it_narrows_by_each_filter(viewer_client, params, owners):
    known_hours()
    body = viewer_client.get(URL, {"from": DAY, "to": DAY, **params}).json()
    assert [row["key"] for row in body["rows"]] == owners
    assert body["total"]["gpu_hours_reserved"] == pytest.approx(sum(r["gpu_hours_reserved"] for r in body["rows"]))


def test_without_days_it_answers_this_month_so_far_and_a_period_names_another(viewer_client):
    today = timezone.now().astimezone(UTC).date()
    body = viewer_client.get(URL).json()
    assert (body["by"], body["from"], body["to"]) == ("owner", today.replace(day=1).isoformat(), today.isoformat())
    assert body["rows"] == [] and body["total"]["gpu_hours_reserved"] == 0.0
    day = viewer_client.get(URL, {"period": "day"}).json()
    assert day["from"] == day["to"] == today.isoformat()
    # From alone: up to today.
    since = (today - timedelta(days=40)).isoformat()
    assert viewer_client.get(URL, {"from": since}).json()["to"] == today.isoformat()


@pytest.mark.parametrize("params, field, words", [
    ({"by": "colour"}, "by", "by is one of owner, team, claim, image, label, node, model, not 'colour'"),
    ({"from": "2025-02-30"}, "from", "from is a day written YYYY-MM-DD, not '2025-02-30'"),
    ({"from": "2025-03-01", "to": "March"}, "to", "to is a day written YYYY-MM-DD, not 'March'"),
    ({"from": "2025-03-04", "to": "2025-03-01"}, "to", "the period ends before it starts: to is before from"),
    ({"from": "2024-01-01", "to": "2025-12-31"}, "to", "a period is at most 400 days"),
    ({"to": "2025-03-01"}, "from", "to needs from: the period's first day"),
    ({"period": "year"}, "period", "unknown period 'year': use one of day, week, month, or from and to dates"),
    ({"period": "month", "from": "2025-03-01"}, "period", "give a period, or from and to days, not both"),
    ({"claim_id": "train"}, "claim_id", "claim_id is a whole number, not 'train'"),
    ({"node_id": "-1"}, "node_id", "node_id is a whole number, not '-1'"),
])
def test_a_bad_parameter_is_a_400_naming_it(viewer_client, params, field, words):
    response = viewer_client.get(URL, params)
    assert response.status_code == 400
    assert response.json() == {"error": {"code": "bad_parameter", "message": words, "field": field}}


def test_every_role_reads_it_with_a_login_or_a_read_token(client, viewer, outsider):
    assert client.get(URL).status_code == 401
    assert client.get(URL).json()["error"]["code"] == "login_required"
    refused = Client()
    refused.force_login(outsider)
    assert refused.get(URL).status_code == 403
    _, secret = ApiToken.issue(viewer, "usage", "read")
    with_token = Client(headers={"authorization": f"Bearer {secret}"})
    assert with_token.get(URL, {"from": DAY, "to": DAY}).status_code == 200
    head = with_token.head(URL)
    assert head.status_code == 200 and head.content == b""
    assert with_token.post(URL, {}).status_code in (403, 405)


def test_the_schema_documents_its_parameters_and_its_answer(viewer_client):
    schema = viewer_client.get("/api/openapi.json").json()
    operation = schema["paths"][URL]["get"]
    params = {p["name"]: p for p in operation["parameters"]}
    assert list(params) == list(query.PARAMETERS)
    assert all(p["in"] == "query" and not p["required"] for p in params.values())
    assert params["by"]["schema"]["enum"] == list(report.GROUPS)
    assert params["period"]["schema"]["enum"] == ["day", "week", "month"]
    assert params["from"]["schema"]["format"] == params["to"]["schema"]["format"] == "date"
    assert {int(s) for s in operation["responses"]} == {200, 400, 401, 403}
    components = schema["components"]["schemas"]
    answer = components[operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/")[-1]]
    assert list(answer["properties"]) == ["by", "from", "to", "currency", "rows", "total"]
    row = components[answer["properties"]["total"]["$ref"].rsplit("/")[-1]]
    assert list(row["properties"]) == ["key", *FIGURES]


def _command_json(*args: str) -> dict:
    out = io.StringIO()
    call_command("usage", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_the_api_the_command_and_the_report_agree_on_a_day_the_ingest_stored(viewer_client, operator, viewer,
                                                                               settings, prices):
    settings.GPUFLEET_COLLECT_INTERVAL = 600
    ingested_day(operator, viewer)
    assert UsageFiveMinutes.objects.filter(bucket__gte=datetime(2025, 3, 4, 12, tzinfo=UTC)).exists()
    start, end = datetime(2025, 3, 4, tzinfo=UTC), datetime(2025, 3, 5, tzinfo=UTC)
    for by in report.GROUPS:
        api = viewer_client.get(URL, {"from": DAY, "to": DAY, "by": by}).json()
        printed = _command_json("--from", DAY, "--to", DAY, "--by", by)
        assert api == printed == query.answer(report.report(start, end, by)), by
        assert api["rows"], by
    narrowed = viewer_client.get(URL, {"from": DAY, "to": DAY, "by": "node", "owner": "vera"}).json()
    assert narrowed == _command_json("--from", DAY, "--to", DAY, "--by", "node", "--owner", "vera")
    assert narrowed == query.answer(report.report(start, end, "node", {"owner": "vera"}))
    # Each claim is counted from the snapshot of 10:10 to that of 12:30: 15 snapshots of 600 s, 2 GPUs.
    owners = {row["key"]["owner"]: row for row in api_rows(viewer_client, "owner")}
    assert owners["otto"]["gpu_hours_reserved"] == pytest.approx(5.0)
    assert owners["otto"]["gpu_hours_used"] == pytest.approx(5.0)
    assert owners["vera"]["gpu_hours_reserved"] == pytest.approx(5.0)
    assert owners["vera"]["gpu_hours_idle_reserved"] == pytest.approx(5.0)
    assert owners["vera"]["efficiency"] == 0.0 and owners["otto"]["efficiency"] == pytest.approx(1.0)


def api_rows(client, by: str) -> list[dict]:
    return client.get(URL, {"from": DAY, "to": DAY, "by": by}).json()["rows"]
