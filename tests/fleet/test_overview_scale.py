"""The overview at fleet scale: past paging.ESTIMATE_FROM nodes the table's total is
PostgreSQL's estimate ("about N") instead of a count of them all on each view and
refresh, paging still reaches every node, and the search is served by trigram indexes.
ESTIMATE_FROM is lowered here so a small fleet stands for a large one."""

import re

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gpufleet.core import paging
from gpufleet.fleet.filters import NodeFilter
from gpufleet.fleet.models import Node
from tests.factories import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def large(monkeypatch):
    monkeypatch.setattr(paging, "ESTIMATE_FROM", 2)


def _analyze():
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE fleet_node")


def _fleet_counts(queries) -> list[str]:
    """The table's counts of nodes not bounded by a LIMIT: each reads every node it counts."""
    return [q["sql"] for q in queries if "COUNT(*)" in q["sql"] and 'FROM "fleet_node"' in q["sql"] and "LIMIT" not in q["sql"]]


@pytest.mark.postgresql
def test_a_large_fleet_s_total_is_an_estimate_and_paging_reaches_every_node(viewer_client, make_fleet, large):
    make_fleet(30)
    _analyze()
    with CaptureQueriesContext(connection) as queries:
        first = viewer_client.get("/?per=25").content.decode()
    assert _fleet_counts(queries.captured_queries) == []
    assert re.search(r"Nodes 1–25 of <span title=\"An estimate[^\"]*\">about</span> 30\b", first)
    assert re.search(r"Page 1 of <span [^>]*>about</span> 2\b", first)
    assert 'rel="next"' in first
    second = viewer_client.get("/?per=25&page=2", **hx()).content.decode()
    assert "Nodes 26–30 of" in second and ">node-29</a></th>" in second
    assert 'rel="next"' not in second and 'rel="prev"' in second
    # A page past the nodes there are gives the last one.
    assert ">node-29</a></th>" in viewer_client.get("/?per=25&page=9", **hx()).content.decode()


@pytest.mark.postgresql
def test_a_filter_matching_many_nodes_estimates_too(viewer_client, make_fleet, large):
    make_fleet(30)
    _analyze()
    with CaptureQueriesContext(connection) as queries:
        page = viewer_client.get("/?q=node-1", **hx()).content.decode()
    assert _fleet_counts(queries.captured_queries) == []
    assert re.search(r"Nodes 1–10 of <span [^>]*>about</span> \d+ matching the filters", page)
    assert _names_in_order(page) == [f"node-1{i}" for i in range(10)]


def _names_in_order(html: str) -> list[str]:
    return re.findall(r">(node-\d\d)</a></th>", html)


def test_a_total_under_the_limit_is_counted_exactly(viewer_client, make_fleet):
    make_fleet(3)
    page = viewer_client.get("/").content.decode()
    assert "Nodes 1–3 of 3" in page and "about" not in page.split('class="table-bar"')[1].split("</span>")[0]


def test_sqlite_keeps_no_estimate_and_counts(viewer_client, make_fleet, large):
    if connection.vendor == "postgresql":
        pytest.skip("SQLite's path")
    make_fleet(30)
    page = viewer_client.get("/?per=25").content.decode()
    assert "Nodes 1–25 of 30" in page and "Page 1 of 2" in page


# Past the limit the table reads one query more (the planner's estimate, no count of
# the fleet), and that number must not grow with the fleet either.
@pytest.mark.postgresql
def test_a_large_fleet_reads_a_fixed_number_of_queries(viewer_client, make_fleet, large):
    from tests.fleet.test_overview import TABLE_QUERIES

    def counts():
        _analyze()
        read = []
        for url, headers in [("/", {}), ("/?per=25&health=ok", hx()), ("/?q=node", hx())]:
            with CaptureQueriesContext(connection) as queries:
                assert viewer_client.get(url, **headers).status_code == 200
            read.append(len(queries))
        return read

    with time_machine.travel(timezone.now(), tick=False) as clock:
        make_fleet(5)
        small = counts()
        make_fleet(40, prefix="more")
        clock.shift(settings.GPUFLEET_SUMMARY_MAX_AGE_S + 1)  # the kept summary is recomputed
        assert counts() == small
    assert small[1:] == [TABLE_QUERIES + 1, TABLE_QUERIES + 1]


def test_the_driver_select_offers_every_version_the_fleet_runs(viewer_client, make_fleet):
    nodes = make_fleet(3)
    Node.objects.filter(pk=nodes[0].pk).update(offline=True, driver_version="550.54.15")
    page = viewer_client.get("/").content.decode()
    select = page.split('name="driver"')[1].split("</select>")[0]
    assert re.findall(r'<option value="([^"]*)"', select) == ["", "550.54.15", Node.objects.get(pk=nodes[1].pk).driver_version]


@pytest.mark.postgresql
@pytest.mark.parametrize("search", ["bench-0123", "h200"])
def test_the_search_is_read_off_the_trigram_indexes(search):
    Node.objects.create(name="bench-01230", gpu_models="8x NVIDIA H200")
    found = NodeFilter({"q": search}, queryset=Node.objects.all()).qs
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a 1-node table is otherwise read whole
        # ... or walked through another index with the search as a filter, which for a few
        # rows costs less than a trigram index: with both off only a trigram index can answer.
        cursor.execute("SET LOCAL enable_indexscan = off")
        sql, params = found.order_by().query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "node_name_trgm" in plan and "node_gpu_models_trgm" in plan, plan
    assert list(found.values_list("name", flat=True)) == ["bench-01230"]
