"""/events/, its exports, the navigation's count, the node page's timeline and
GET /api/events/: one FilterSet for all, login required, stored text escaped."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from gpufleet.api.models import ApiToken
from gpufleet.events.models import Event, Kind
from gpufleet.fleet.models import Node
from tests.factories import hx

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 4, 14, 2, tzinfo=UTC)
HOSTILE = '<script>alert("x")</script>=cmd|calc'


def event(node: Node | None, kind: str = Kind.FINDING, severity: str = "warn", code: str = "gpu3.thermal",
          opened: datetime = T0, closed: datetime | None = None, **fields) -> Event:
    fields.setdefault("message", "Thermal slowdown active at 91 °C")
    return Event.objects.create(kind=kind, severity=severity, node=node, code=code, first_seen_at=opened,
                                opened_at=opened, last_seen_at=opened, closed_at=closed,
                                message_opened=fields["message"], **fields)


@pytest.fixture
def fleet():
    h200 = Node.objects.create(name="h200-a", gpu_models="NVIDIA H200")
    a100 = Node.objects.create(name="a100-b", gpu_models="NVIDIA A100-SXM4-80GB")
    return {
        "old": event(h200, closed=T0 + timedelta(minutes=35), gpu_index=3, name="GPU 3 (NVIDIA H200)"),
        "offline": event(a100, Kind.OFFLINE, "fail", "", opened=T0 + timedelta(hours=1), message="No snapshot"),
        "newest": event(h200, code="gpu1.xid", opened=T0 + timedelta(hours=2), closed=T0 + timedelta(hours=3)),
        "pending": Event.objects.create(kind=Kind.FINDING, severity="warn", node=h200, code="gpu2",
                                        first_seen_at=T0, last_seen_at=T0),
    }


def on_page(page: str) -> list[int]:
    """The events the page lists, in its order."""
    return [int(pk) for pk in re.findall(r'<tr id="event-(\d+)"', page)]


def test_it_asks_for_a_login():
    for url in ("/events/", "/events/export.csv", "/events/open-count", "/api/events/"):
        assert Client().get(url).status_code in (302, 401)


def test_it_lists_open_events_first_then_the_newest_never_pending_ones(viewer_client, fleet):
    page = viewer_client.get("/events/").content.decode()
    # The pending one is left out: its condition has not held long enough.
    assert on_page(page) == [fleet["offline"].pk, fleet["newest"].pk, fleet["old"].pk]
    assert "3 events" in page


@pytest.mark.parametrize("query,found", [
    ("?kind=offline", ["offline"]),
    ("?severity=warn", ["newest", "old"]),
    ("?node=a100-b", ["offline"]),
    ("?gpu_model=H200", ["newest", "old"]),
    ("?state=open", ["offline"]),
    ("?state=closed", ["newest", "old"]),
    # Open at some moment of the range: the old one ended before it, the newest began after.
    ("?since=2026-05-04T14:40:00Z&until=2026-05-04T15:30:00Z", ["offline"]),
    ("?since=2026-05-04T14:30:00Z&until=2026-05-04T15:30:00Z", ["offline", "old"]),
])
def test_the_page_the_export_and_the_api_take_the_same_filters(viewer_client, fleet, query, found):
    expected = [fleet[name].pk for name in found]
    assert on_page(viewer_client.get(f"/events/{query}").content.decode()) == expected
    exported = json.loads(b"".join(viewer_client.get(f"/events/export.json{query}").streaming_content))
    assert [row["id"] for row in exported["rows"]] == expected
    api = viewer_client.get(f"/api/events/{query}").json()
    assert [row["id"] for row in api["results"]] == expected and api["count"] == len(expected)


def test_an_invalid_filter_lists_nothing_and_says_why(viewer_client, fleet):
    page = viewer_client.get("/events/?kind=meteor").content.decode()
    assert "not valid" in page and on_page(page) == []
    assert viewer_client.get("/events/export.csv?kind=meteor").status_code == 400
    answer = viewer_client.get("/api/events/?state=ajar")
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "bad_filter"


def test_htmx_gets_the_table_alone(viewer_client, fleet):
    response = viewer_client.get("/events/?kind=offline", **hx())
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="events-table"') and "<html" not in body
    assert "HX-Request" in response["Vary"]


def test_the_api_answers_the_fields_the_issue_names(viewer_client, fleet):
    row = viewer_client.get("/api/events/?kind=finding&state=closed").json()["results"][-1]
    assert row == {
        "id": fleet["old"].pk, "kind": "finding", "severity": "warn", "node": "h200-a", "gpu_index": 3,
        "pci_bus_id": "", "code": "gpu3.thermal", "message": "Thermal slowdown active at 91 °C",
        "opened_at": "2026-05-04T14:02:00+00:00", "closed_at": "2026-05-04T14:37:00+00:00", "muted": "",
    }


def test_the_csv_export_is_safe_for_spreadsheets(viewer_client):
    event(Node.objects.create(name="n"), message=HOSTILE)
    response = viewer_client.get("/events/export.csv")
    assert response["Content-Disposition"].startswith('attachment; filename="gpufleet-events-')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0]["message"] == HOSTILE and rows[0]["node"] == "n"
    event(Node.objects.get(name="n"), code="x", message="=HYPERLINK(1)")
    rows = list(csv.DictReader(io.StringIO(b"".join(viewer_client.get("/events/export.csv").streaming_content).decode())))
    assert {row["message"] for row in rows} == {HOSTILE, "'=HYPERLINK(1)"}


def test_a_token_exports_as_its_user(viewer):
    _, secret = ApiToken.issue(viewer, "nightly", "read")
    response = Client(headers={"authorization": f"Bearer {secret}"}).get("/events/export.json")
    assert response.status_code == 200


def test_hostile_text_is_escaped_on_the_page_and_the_timeline(viewer_client):
    node = Node.objects.create(name="n")
    event(node, message=HOSTILE, name="<b>GPU</b>", code="<i>c</i>")
    for url in ("/events/", "/nodes/n/"):
        page = viewer_client.get(url).content.decode()
        assert "<script>alert" not in page and "<b>GPU</b>" not in page and "<i>c</i>" not in page
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_the_navigation_shows_the_open_events_count(viewer_client, fleet):
    page = viewer_client.get("/claims/").content.decode()
    assert 'href="/events/"' in page and 'hx-get="/events/open-count"' in page
    badge = viewer_client.get("/events/open-count", **hx()).content.decode()
    assert ">1<" in badge  # the offline one: closed and pending ones do not count
    Event.objects.filter(closed_at__isnull=True).update(closed_at=T0 + timedelta(hours=4))
    assert viewer_client.get("/events/open-count", **hx()).content.decode().strip() == ""


def test_the_node_page_has_a_timeline_with_durations(viewer_client, fleet):
    page = viewer_client.get("/nodes/h200-a/").content.decode()
    timeline = page[page.index('id="timeline"'):]
    assert "GPU 3 (NVIDIA H200): Thermal slowdown active at 91 °C" in timeline
    assert "2026-05-04 14:02–14:37</time>,\n      35 minutes" in timeline
    assert 'href="/events/?node=h200-a"' in timeline


@pytest.mark.parametrize("events", [3, 40])
def test_the_page_reads_a_fixed_number_of_queries(viewer_client, django_assert_num_queries, events):
    node = Node.objects.create(name="n")
    for i in range(events):
        event(node, code=f"c{i}")
    with django_assert_num_queries(6):  # session, user, permissions (2), count, page with nodes
        viewer_client.get("/events/")


def test_a_row_leads_with_what_the_event_concerns_and_names_its_kind_below(viewer_client, fleet):
    page = viewer_client.get("/events/").content.decode()
    row = page.split(f'id="event-{fleet["old"].pk}"', 1)[1].split("</tr>", 1)[0]
    what = re.search(r'data-label="What">(.*?)</td>', row, re.S).group(1)
    assert what.startswith("GPU 3 (NVIDIA H200)<span class=\"sub\">Finding</span>")
    # An event without a name of its own says its kind once.
    row = page.split(f'id="event-{fleet["offline"].pk}"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'data-label="What">Node offline(<span class="sub"><code>|</td>)', row)
