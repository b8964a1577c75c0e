"""The lists (claims, claims vs use, events, audit log and the API's) never count a
whole big table on each view: they count at most ESTIMATE_FROM rows, and past that give
PostgreSQL's estimate, said to be one ("about"); below it they count exactly; whether
another page follows is read from the rows, never from the estimate."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpufleet.audit.models import Action, AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.core import paging
from gpufleet.events.models import Event, Kind, Severity
from tests.claims.helpers import make_node

pytestmark = pytest.mark.django_db

ROWS = 60


@pytest.fixture
def lists(operator):
    node = make_node("alpha", 2)
    Claim.objects.bulk_create(Claim(node=node, name=f"c{i:03}", count=1, owner=operator) for i in range(ROWS))
    now = timezone.now()
    Event.objects.bulk_create(
        Event(kind=Kind.FINDING, severity=Severity.WARN, node=node, code=f"x{i}", first_seen_at=now, opened_at=now,
              last_seen_at=now, closed_at=now) for i in range(ROWS))
    AuditEntry.objects.bulk_create(
        AuditEntry(action=Action.CLAIM_CREATE, node_name="alpha", target=f"c{i}") for i in range(ROWS))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the planner's statistics, as autovacuum keeps them
    return node


def _text(html: str) -> str:
    """The page's words, without its tags (the "about" of an estimate is a span with a title)."""
    return re.sub(r"<[^>]+>", "", html)


def _get(client, url: str):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, url
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"]]
    return response.content.decode(), counts


@pytest.mark.postgresql
@pytest.mark.parametrize("url, said", [
    ("/claims/", "about 60 claims"),
    ("/events/", "about 60 events"),
    ("/audit/", ""),
    ("/claims/?owner=otto", "about "),  # the planner's guess at what the filter selects
])
def test_a_big_list_page_counts_no_further_than_the_limit_and_says_about(viewer_client, lists, monkeypatch, url, said):
    monkeypatch.setattr(paging, "ESTIMATE_FROM", ROWS // 2)
    html, counts = _get(viewer_client, url)
    assert len(counts) == 1 and f"LIMIT {ROWS // 2 + 1}" in counts[0]
    assert said in _text(html)
    assert re.search(r'page=2"', html)  # the next page, known from the rows read


@pytest.mark.parametrize("url, said", [
    ("/claims/?owner=otto", "60 claims"),
    ("/events/?kind=finding", "60 events"),
])
def test_a_list_under_the_limit_counts_exactly(viewer_client, lists, url, said):
    html, counts = _get(viewer_client, url)
    assert len(counts) == 1
    assert said in _text(html) and f"about {said}" not in _text(html)


@pytest.mark.postgresql
@pytest.mark.parametrize("url", ["/api/claims/", "/api/events/", "/api/nodes/", "/api/claims/?node=alpha"])
def test_a_big_api_list_gives_the_estimate_and_says_so(viewer_client, lists, monkeypatch, url):
    monkeypatch.setattr(paging, "ESTIMATE_FROM", 0)
    body, counts = _get(viewer_client, url)
    assert len(counts) == 1 and "LIMIT 1" in counts[0]
    import json

    answer = json.loads(body)
    assert answer["estimated"] is True and answer["count"] >= 1
    assert answer["next"] is None  # one page of at most 100, whatever the estimate


def test_an_api_list_under_the_limit_counts_exactly(viewer_client, lists):
    answer = viewer_client.get("/api/claims/?node=alpha").json()
    assert (answer["count"], answer["estimated"], answer["pages"]) == (ROWS, False, 1)
