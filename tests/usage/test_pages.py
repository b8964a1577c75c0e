"""The Usage page (issue #31): a period's GPU-hours grouped by one key, sorted, charted,
linked to the claims and nodes behind each group, exported; and the "this month"
panels the node page and the claim page load. Hourly rows are written by hand where
only the page is tested, and come through the real ingest and beat where the figures
are."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from html import unescape

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import report, rollup
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.claims.helpers import claim, make_node
from tests.factories import hx, snapshot

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 20, 15, 30, tzinfo=UTC)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
HOSTILE = "<script>alert(1)</script>"
# Ids no node or claim a test makes will have, whatever the database's sequences.
ALPHA, BETA, TRAIN, NOTES = 900_001, 900_002, 900_007, 900_008


@pytest.fixture(autouse=True)
def _now():
    with time_machine.travel(NOW, tick=False):
        yield


def hour(bucket=None, **values) -> UsageHour:
    """One hourly row, on 3 March unless told, with a key of its own."""
    values.setdefault("node_id", ALPHA)
    values.setdefault("node", "alpha")
    values.setdefault("model", H100)
    values.setdefault("key", f"k{UsageHour.objects.count()}")
    return UsageHour.objects.create(bucket=bucket or datetime(2025, 3, 3, 10, tzinfo=UTC), **values)


H = 3600.0


@pytest.fixture
def hours():
    """March: ada's claim 'train' (id TRAIN) held 4 GPU-hours, 3 busy, 2 kWh; ben's 'notes'
    (NOTES, on beta, both claims and nodes long deleted) held 2, idle; 1 GPU-hour busy unreserved on alpha with no power
    reading; beta silent 2 GPU-hours. February: a row the month leaves out."""
    hour(claim_id=TRAIN, claim="train", owner="ada", image="pytorch:2.5", label="train", seen_s=4 * H, used_s=3 * H,
         power_s=4 * H, energy_wh=2000)
    hour(node_id=BETA, node="beta", model=A100, claim_id=NOTES, claim="notes", owner="ben", image="jupyter:4",
         seen_s=2 * H, power_s=2 * H, energy_wh=200)
    hour(image="pytorch:2.5", seen_s=1 * H, used_s=1 * H)
    hour(node_id=BETA, node="beta", model=A100, key=rollup.UNKNOWN_KEY, unknown_s=2 * H)
    hour(bucket=datetime(2025, 2, 27, tzinfo=UTC), claim_id=TRAIN, claim="train", owner="ada", seen_s=50 * H)


def page(client, **params):
    response = client.get("/usage/", params)
    assert response.status_code == 200
    return response.content.decode()


def table_rows(html: str) -> list[list[str]]:
    """The report table's body rows, each as its cells' text."""
    body = html.split('<table class="dense usage-table">', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [cells(row) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def total_row(html: str) -> list[str]:
    return cells(html.split("<tfoot>", 1)[1].split("</tfoot>", 1)[0])


def cells(row: str) -> list[str]:
    return [" ".join(unescape(re.sub(r"<[^>]+>", " ", cell)).split())
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]


def node(name: str, gpus: int = 2) -> Node:
    """A node stored through ingest, without the five-minute row its snapshot counted."""
    made = make_node(name, gpus)
    UsageFiveMinutes.objects.all().delete()
    return made


# --- who may see it ------------------------------------------------------------------


def test_it_needs_a_login_and_a_role(client, outsider):
    for url in ("/usage/", "/usage/export.csv", "/usage/export.json", "/usage/node/1/month", "/usage/claim/1/month"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
    client.force_login(outsider)
    for url in ("/usage/", "/usage/export.csv", "/usage/node/1/month", "/usage/claim/1/month"):
        assert client.get(url, **hx()).status_code == 403, url


def test_the_navigation_links_to_it(viewer_client):
    html = page(viewer_client)
    assert '<a href="/usage/" aria-current="page">Usage</a>' in html


# --- the page --------------------------------------------------------------------------


def test_this_month_by_owner_by_default_with_the_total(viewer_client, hours):
    html = page(viewer_client)
    assert "this month so far" in html and "2025-03-01 00:00" in html
    assert table_rows(html) == [
        # owner, reserved, used, idle reserved, used unreserved, efficiency, energy, unknown
        ["ada by claim", "4.0", "3.0", "1.0", "0.0", "75 %", "2.0", "0.0"],
        ["ben by claim", "2.0", "0.0", "2.0", "0.0", "0 %", "0.2", "0.0"],
        ["no owner (unreserved, or a claim without one)", "0.0", "1.0", "0.0", "1.0", "—", "— 1.0 GPU-h unread", "2.0"],
    ]
    assert total_row(html) == ["Total", "6.0", "4.0", "3.0", "1.0", "50 %", "2.2 1.0 GPU-h unread", "2.0"]
    assert "Cost" not in html  # no price set
    # An owner links to the claims list filtered by them, and to their usage by claim.
    assert 'href="/claims/?owner=ada"' in html
    assert 'href="/usage/?by=claim&amp;owner=ada"' in html


def test_each_grouping_links_to_what_is_behind_it(viewer_client, hours, operator):
    alpha = node("alpha")
    kept = claim(alpha, "train", operator, count=1)
    UsageHour.objects.filter(claim_id=TRAIN).update(claim_id=kept.pk, node_id=alpha.pk)

    by_claim = page(viewer_client, by="claim")
    assert f'href="/nodes/alpha/#claim-{kept.pk}">train</a>' in by_claim
    assert [row[0] for row in table_rows(by_claim)] == ["train on alpha · ada", "notes on beta · ben",
                                                        "unreserved on alpha", "unreserved on beta"]
    assert ">notes<" in by_claim and f"#claim-{NOTES}" not in by_claim  # deleted: its name, no link

    by_node = page(viewer_client, by="node")
    assert 'href="/nodes/alpha/">alpha</a>' in by_node
    assert "<th" in by_node and ">beta<" in by_node and 'href="/nodes/beta/"' not in by_node  # no such node now

    by_image = page(viewer_client, by="image", period="month")
    assert 'href="/usage/?period=month&amp;by=node&amp;image=pytorch%3A2.5"' in by_image
    by_model = page(viewer_client, by="model")
    assert f'href="/usage/?by=node&amp;model={H100.replace(" ", "+")}"' in by_model
    by_label = page(viewer_client, by="label")
    assert [row[0] for row in table_rows(by_label)] == ["train", "no label"]


def test_it_narrows_to_an_owner_a_node_an_image_or_a_model(viewer_client, hours):
    assert [row[0] for row in table_rows(page(viewer_client, by="claim", owner="ada"))] == ["train on alpha · ada"]
    html = page(viewer_client, by="claim", node_id=BETA)
    assert [row[0] for row in table_rows(html)] == ["notes on beta · ben", "unreserved on beta"]
    assert f"Only node <strong>#{BETA} (deleted)</strong>" in html
    assert [row[0] for row in table_rows(page(viewer_client, by="node", image="jupyter:4"))] == ["beta"]
    assert [row[0] for row in table_rows(page(viewer_client, by="owner", model=A100))] == [
        "ben by claim", "no owner (unreserved, or a claim without one)"]


def test_my_usage_is_the_page_narrowed_to_me(viewer_client, viewer, hours):
    html = page(viewer_client, period="week")
    assert f'href="?period=week&amp;by=claim&amp;owner={viewer.get_username()}">My usage</a>' in html


def test_it_sorts_by_each_figure_largest_first_then_smallest(viewer_client, hours):
    names = lambda **params: [row[0].split()[0] for row in table_rows(page(viewer_client, **params))]  # noqa: E731
    assert names(sort="-used") == ["ada", "no", "ben"]
    assert names(sort="used") == ["ben", "no", "ada"]
    assert names(sort="-idle_reserved") == ["ben", "ada", "no"]
    assert names(sort="-unknown") == ["no", "ada", "ben"]
    assert names(sort="efficiency") == ["ben", "ada", "no"]  # none last, whichever way
    assert names(sort="-efficiency") == ["ada", "ben", "no"]
    assert names(sort="-energy") == ["ada", "ben", "no"]
    html = page(viewer_client, sort="-used")
    assert 'aria-sort="descending"' in html
    assert 'href="/usage/?sort=used"' in html  # the next click: smallest first
    assert 'href="/usage/?sort=-reserved"' in html  # another column: largest first


def test_a_period_by_dates_and_presets(viewer_client, hours):
    html = page(viewer_client, **{"from": "2025-02-01", "to": "2025-02-28"})
    assert "2025-02-01 to 2025-02-28" in html
    assert table_rows(html)[0][:2] == ["ada by claim", "50.0"]
    assert table_rows(page(viewer_client, period="day")) == [["No GPU time was counted in this period."]]
    html = page(viewer_client, period="week", by="node")
    assert '<strong aria-current="true">This week</strong>' in html
    assert 'href="?by=node&amp;period=month">This month</a>' in html


@pytest.mark.parametrize(("params", "message"), [
    ({"from": "2025-13-01"}, "from is a day written YYYY-MM-DD, not '2025-13-01'"),
    ({"from": "2025-03-01", "to": "yesterday"}, "to is a day written YYYY-MM-DD, not 'yesterday'"),
    ({"to": "2025-03-02"}, "to needs from"),
    ({"from": "2025-03-05", "to": "2025-03-01", "period": "week"}, "the period ends before it starts"),
    ({"from": "2023-01-01", "to": "2025-03-01"}, "a period is at most"),
    ({"by": "salary"}, "Select a valid choice"),
    ({"node_id": "x"}, "Enter a whole number"),
])
def test_a_period_or_value_it_cannot_read_is_said_on_the_page(viewer_client, hours, params, message):
    html = page(viewer_client, **params)
    assert message in unescape(html)  # in the API's words (gpufleet/usage/query.py)
    assert 'role="alert"' in html and "Nothing is shown" in html
    assert "usage-table" not in html
    response = viewer_client.get("/usage/export.csv", params)
    assert response.status_code == 400 and message in response.content.decode()


def test_htmx_gets_the_report_alone(viewer_client, hours):
    response = viewer_client.get("/usage/", {"by": "claim"}, **hx())
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="usage-report"') and "<html" not in html
    assert "HX-Request" in response["Vary"]


def test_the_cost_column_shows_only_with_prices(viewer_client, hours, settings):
    settings.GPUFLEET_PRICE_GPU_HOUR = {H100: 3.0, "*": 1.0}
    settings.GPUFLEET_CURRENCY = "EUR"
    html = page(viewer_client)
    assert "Cost (EUR)" in html and "cost in EUR" in html
    # ada: 4 H100-hours held at 3.0; ben: 2 A100-hours at 1.0; unreserved: 1 H100-hour used at 3.0.
    assert [row[-2] for row in table_rows(html)] == ["12.00", "2.00", "3.00"]
    assert total_row(html)[-2] == "17.00"


def test_the_chart_draws_reserved_and_used_of_the_largest_groups(viewer_client, hours):
    html = page(viewer_client, by="claim")
    chart = html.split('<figure class="usage-chart">', 1)[1].split("</figure>", 1)[0]
    assert chart.count('class="usage-reserved"') == 4 and chart.count('class="usage-used"') == 4
    assert "train on alpha: 4 GPU-h reserved, 3 GPU-h used" in chart
    assert "style=" not in html and "<script>" not in html.split("</head>", 1)[1]


def test_stored_names_are_escaped_everywhere(viewer_client, hours):
    hour(claim_id=99, claim=HOSTILE, owner=HOSTILE, team=HOSTILE, image='"><img src=x onerror=alert(2)>',
         label=HOSTILE, model=HOSTILE, node=HOSTILE, node_id=900_005, seen_s=H)
    for by in report.GROUPS:
        html = page(viewer_client, by=by)
        assert HOSTILE not in html and "<img src=x" not in html, by
        assert "&lt;script&gt;" in html or "&lt;img src=x" in html or "&quot;&gt;&lt;img" in html, by
    exported = viewer_client.get("/usage/export.csv", {"by": "claim"}).getvalue().decode()
    assert HOSTILE in exported  # CSV is data; a formula-like cell would be quoted off


def test_the_page_reads_a_fixed_number_of_queries_whatever_the_groups(viewer_client, viewer, django_assert_num_queries):
    def count(groups: int) -> int:
        UsageHour.objects.all().delete()
        Node.objects.all().delete()
        for i in range(groups):
            hour(node_id=ALPHA + i, node=f"n{i}", claim_id=TRAIN + i, claim=f"c{i}", owner=f"u{i % 7}",
                 team=f"t{i % 5}", seen_s=H, used_s=H / 2)
        with CaptureQueriesContext(connection) as queries:
            for by in ("owner", "team", "claim", "node", "image"):
                page(viewer_client, by=by)
        return len(queries)

    assert count(3) == count(40)
    hour(seen_s=H)
    with CaptureQueriesContext(connection) as report_queries:
        report.report(datetime(2025, 3, 1, tzinfo=UTC), NOW, "claim")
    # The session, its user and their permissions (2), the report's own queries (the
    # groups, the total), and the claims still there for the links.
    with django_assert_num_queries(4 + len(report_queries) + 1):
        page(viewer_client, by="claim")


# --- exports -----------------------------------------------------------------------------


def test_the_exports_hold_the_rows_and_the_total_with_the_api_names(viewer_client, hours):
    response = viewer_client.get("/usage/export.csv", {"by": "claim", "sort": "-used"})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="gpufleet-usage-by-claim-' in response["Content-Disposition"]
    lines = list(csv.reader(io.StringIO(response.getvalue().decode())))
    assert lines[0] == ["row", "claim_id", "claim", "node", "owner", "gpu_hours_reserved", "gpu_hours_used",
                        "gpu_hours_idle_reserved", "gpu_hours_used_unreserved", "gpu_hours_unknown",
                        "gpu_hours_power_unknown", "efficiency", "energy_kwh", "cost"]
    assert lines[1][:6] == ["group", str(TRAIN), "train", "alpha", "ada", "4.0"]
    assert [line[2] for line in lines[1:-1]] == ["train", "", "notes", ""]
    assert lines[-1][:5] == ["total", "", "", "", ""] and lines[-1][5:9] == ["6.0", "4.0", "3.0", "1.0"]

    # The JSON is what GET /api/usage/ answers for the same question.
    data = json.loads(viewer_client.get("/usage/export.json", {"owner": "ada"}).getvalue())
    assert data["by"] == "owner" and data["from"] == "2025-03-01" and data["to"] == "2025-03-20"
    assert data["rows"] == [{"key": {"owner": "ada"}, "gpu_hours_reserved": 4.0, "gpu_hours_used": 3.0,
                             "gpu_hours_idle_reserved": 1.0, "gpu_hours_used_unreserved": 0.0,
                             "gpu_hours_unknown": 0.0, "gpu_hours_power_unknown": 0.0, "efficiency": 0.75,
                             "energy_kwh": 2.0, "cost": None}]
    assert data["total"]["gpu_hours_reserved"] == 4.0 and data["currency"] == ""


def test_the_page_links_its_exports_with_its_question(viewer_client, hours):
    html = page(viewer_client, by="image", sort="-used", page="1")
    assert 'href="/usage/export.csv?by=image&amp;sort=-used"' in html


# --- the month panels of the node page and the claim page -------------------------------


def test_the_node_page_loads_its_month_by_claim(viewer_client, operator):
    alpha = node("alpha")
    train = claim(alpha, "train", operator, count=1)
    hour(node_id=alpha.pk, claim_id=train.pk, claim="train", owner="otto", seen_s=2 * H, used_s=H)
    node_page = viewer_client.get("/nodes/alpha/").content.decode()
    assert f'hx-get="/usage/node/{alpha.pk}/month"' in node_page

    panel = viewer_client.get(f"/usage/node/{alpha.pk}/month", **hx()).content.decode()
    assert panel.lstrip().startswith('<section id="usage-month"') and "hx-trigger" not in panel
    assert table_rows(panel) == [["train on alpha · otto", "2.0", "1.0", "1.0", "0.0", "50 %", "— 2.0 GPU-h unread", "0.0"]]
    assert f'href="/usage/?by=claim&amp;node_id={alpha.pk}"' in panel
    # Without HTMX (a person following the link): the Usage page, narrowed to the node.
    response = viewer_client.get(f"/usage/node/{alpha.pk}/month")
    assert response.status_code == 302 and response["Location"] == f"/usage/?by=claim&node_id={alpha.pk}"


def test_the_claim_page_loads_its_month(operator_client, operator):
    alpha = node("alpha")
    train = claim(alpha, "train", operator, count=1)
    hour(node_id=alpha.pk, claim_id=train.pk, claim="train", owner="otto", seen_s=2 * H, used_s=H / 2,
         power_s=2 * H, energy_wh=500)
    claim_page = operator_client.get(f"/claims/{train.pk}/edit/").content.decode()
    assert f'hx-get="/usage/claim/{train.pk}/month"' in claim_page

    panel = unescape(operator_client.get(f"/usage/claim/{train.pk}/month", **hx()).content.decode())
    assert "Reserved</dt><dd>2.0 GPU-h" in panel and "Efficiency</dt><dd>25 %" in panel
    assert "Energy</dt><dd>0.5 kWh" in panel
    empty = operator_client.get("/usage/claim/12345/month", **hx()).content.decode()
    assert "No GPU time counted for this claim this month yet." in empty


# --- through the real ingest and beat ----------------------------------------------------


def test_the_page_shows_what_ingest_counted_and_the_beat_rolled(viewer_client, operator, settings):
    """alpha's 2 GPUs from 10:00 to 12:00 on 20 March, a snapshot every ten minutes: GPU
    0 busy in a pytorch container under 'train' (otto's, made after the first snapshot),
    GPU 1 idle; the beat rolls both hours, the last snapshot is read from its
    five-minute row."""
    settings.GPUFLEET_COLLECT_INTERVAL = 600
    ten = datetime(2025, 3, 20, 10, tzinfo=UTC)
    box = {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": "train"}
    for step in range(13):
        at = ten + step * timedelta(minutes=10)
        snap = snapshot("alpha", 2, at=at, util="0")
        snap["devices"][0]["utilization_percent"] = 90
        snap["devices"][0]["processes"] = [{"pid": 4412, "name": "python3", "used_mib": 30720, "container": box}]
        assert {r.outcome for r in ingest_snapshots([snap], now=at)} == {"accepted"}
        if step == 0:
            # Made then: a claim holds its GPUs from when it starts.
            with time_machine.travel(at + timedelta(seconds=1), tick=False):
                claim(Node.objects.get(name="alpha"), "train", operator, device_ids=("0",))
    rollup.roll(ten + timedelta(hours=2, minutes=5))
    assert UsageHour.objects.exists()

    by_image = table_rows(page(viewer_client, by="image"))
    assert by_image[0][0] == "pytorch/pytorch:2.5.1"
    # Held from the second snapshot on: 12 intervals of ten minutes; busy in all 13.
    assert by_image[0][1:3] == ["2.0", "2.2"]
    by_owner = table_rows(page(viewer_client, by="owner"))
    assert by_owner[0][0] == "otto by claim"
