"""The fleet overview `/`: tiles, fleet findings, the node table with filters,
sort and paging kept in the URL, and its HTMX fragments."""

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from gpufleet.claims.models import Claim
from gpufleet.fleet.filters import DEFAULT_PER_PAGE, NodeFilter
from gpufleet.fleet.models import Node
from gpufleet.fleet.summary import FleetSummary
from tests.factories import hx, ingest


def _names_in(html: str, names) -> list[str]:
    """The node names in `names` in the order the table shows them."""
    positions = {n: html.find(f">{n}</a></th>") for n in names}
    return [n for n, pos in sorted(positions.items(), key=lambda kv: kv[1]) if pos >= 0]


@pytest.mark.django_db
def test_it_shows_tiles_and_rows(viewer_client):
    ingest("alpha", 8)
    ingest("bravo", 2, attach="cdi")
    ingest("nogpu", 0, attach="none", toolkit=None)
    Node.objects.filter(name="bravo").update(offline=True)

    response = viewer_client.get(reverse("fleet:overview"))
    page = response.content.decode()
    assert response.status_code == 200
    assert "Nodes online" in page and "2 <small>/ 3</small>" in page
    # GPUs on online nodes only: bravo's last report is not live.
    assert '<span class="tile-value">8</span>' in page
    assert "Nodes failing" in page
    assert ">alpha</a></th>" in page and ">bravo</a></th>" in page
    assert 'class="is-offline"' in page and "last seen" in page
    assert '<span class="badge badge-grey">Offline</span>' in page
    assert '<span class="badge badge-red">Failing</span>' in page  # nogpu: driver fails
    assert "1 node stopped reporting" in page


@pytest.mark.django_db
def test_it_names_fleet_findings(viewer_client):
    alpha = ingest("alpha", 2, driver="570.133.20")
    ingest("bravo", 2, driver="550.54.15", toolkit="1.17.0")
    Claim.objects.create(node=alpha, name="train", device_ids=["GPU-gone"], missing_devices=["GPU-gone"])
    ingest("alpha", 1, driver="570.133.20", at=timezone.now() + timedelta(seconds=5))  # GPU 1 vanished

    page = viewer_client.get(reverse("fleet:overview")).content.decode()
    assert "Driver versions differ across nodes" in page
    assert 'href="/?driver=550.54.15"' in page
    assert "Container toolkit versions differ across nodes" in page and "1.17.0 on 1 node" in page
    assert "GPUs vanished" in page and "alpha: GPU 1" in page
    assert "Claims name GPUs the node no longer has" in page and "GPU-gone" in page


@pytest.mark.django_db
def test_gpus_free_counts_only_nodes_that_can_take_work(viewer_client):
    """Free GPUs on a failing or offline node cannot be claimed to any use: "find a
    node" rules those nodes out, so the tile does not count them either."""
    alpha = ingest("alpha", 8)
    ingest("warm", 4, used_mib=140000)  # a VRAM warning: still takes work
    ingest("gone", 4)
    ingest("sick", 2)
    Node.objects.filter(name="gone").update(offline=True)
    Node.objects.filter(name="sick").update(health="fail")
    Claim.objects.create(node=alpha, name="train", count=3)
    Node.objects.filter(pk=alpha.pk).update(gpus_reserved=3)
    Node.objects.filter(name="sick").update(gpus_reserved=1)

    tiles = FleetSummary().tiles
    assert tiles["free"] == 5 + 4
    assert tiles["reserved"] == 3 + 1  # what claims hold on online nodes, failing ones too
    page = viewer_client.get("/").content.decode()
    assert "4 <small>/ 9 free</small>" in page and "free: on nodes that can take work" in page


@pytest.mark.django_db
def test_it_says_so_when_the_fleet_agrees(viewer_client, make_fleet):
    make_fleet(2)
    assert "No fleet-level problems" in viewer_client.get("/").content.decode()


@pytest.mark.django_db
def test_it_filters_by_health_attach_driver_offline_and_name(viewer_client):
    ingest("alpha", 2)
    ingest("bravo", 2, attach="cdi", driver="550.54.15")
    ingest("charlie", 0, attach="none", toolkit=None)
    ingest("delta", 2, used_mib=140000)  # VRAM warning
    Node.objects.filter(name="delta").update(offline=True)
    names = ["alpha", "bravo", "charlie", "delta"]

    def shown(query: str) -> list[str]:
        return _names_in(viewer_client.get("/" + query).content.decode(), names)

    assert shown("") == ["delta", "charlie", "alpha", "bravo"]  # worst first, then by name
    assert shown("?sort=name") == names
    assert shown("?health=fail") == ["charlie"]
    assert shown("?health=ok") == ["alpha", "bravo"]
    assert shown("?health=warn") == []  # delta is offline: its warning is not current
    assert shown("?health=offline") == ["delta"]
    assert shown("?health=problems") == ["delta", "charlie"]
    assert shown("?attach=cdi") == ["bravo"]
    assert shown("?driver=550.54.15") == ["bravo"]
    assert shown("?offline=yes") == ["delta"]
    assert shown("?offline=no") == ["charlie", "alpha", "bravo"]
    assert shown("?q=ARL") == ["charlie"]
    assert shown("?health=problems&driver=550.54.15") == []
    assert shown("?health=ok&attach=cdi&driver=550.54.15&offline=no&q=rav") == ["bravo"]


@pytest.mark.django_db
def test_it_shows_an_invalid_filter_at_its_field_and_lists_nothing(viewer_client):
    ingest("alpha", 2)
    ingest("bravo", 2, attach="cdi")
    response = viewer_client.get("/?health=bogus&attach=cdi&per=7")
    page = response.content.decode()
    assert response.status_code == 200
    assert _names_in(page, ["alpha", "bravo"]) == []
    assert 'aria-invalid="true" aria-describedby="id_health_error" id="id_health"' in page
    assert (
        '<span id="id_health_error" class="error">Select a valid choice. bogus is not one of the available choices.</span>'
        in page
    )
    assert '<span id="id_per_error" class="error">Select a valid choice. 7 is not one of the available choices.</span>' in page
    assert '<span id="id_attach_error" class="error"></span>' in page
    assert "Nothing is listed: these filter values are not valid." in page
    assert "<li>Health: Select a valid choice. bogus is not one of the available choices.</li>" in page
    assert "Fix the filter values above" in page
    # No download of a filter that is refused, and nothing to refresh.
    assert "/report.json" not in page and 'hx-trigger="every 10s" hx-target="this"' not in page


@pytest.mark.django_db
def test_it_shows_an_unknown_sort_above_the_table(viewer_client, make_fleet):
    make_fleet(2)
    page = viewer_client.get("/?sort=nonsense").content.decode()
    assert _names_in(page, ["node-00", "node-01"]) == []
    assert "<li>Sort: Select a valid choice. nonsense is not one of the available choices.</li>" in page
    # The form's hidden sort is the default again, so the next filter change lists.
    assert '<input type="hidden" name="sort" value="-health" form="filters">' in page


@pytest.mark.django_db
def test_it_sends_filter_errors_with_the_htmx_table(viewer_client, make_fleet):
    make_fleet(2)
    body = viewer_client.get("/?offline=maybe&q=node", **hx()).content.decode()
    assert body.lstrip().startswith('<div id="node-table"')
    assert "<li>Reporting: Select a valid choice. maybe is not one of the available choices.</li>" in body
    assert _names_in(body, ["node-00", "node-01"]) == []
    # The form is outside the swapped table: its error slots come out of band, the
    # wrong one filled and the others emptied (an earlier error fixed).
    assert (
        '<span id="id_offline_error" class="error" hx-swap-oob="true">'
        "Select a valid choice. maybe is not one of the available choices.</span>" in body
    )
    assert '<span id="id_health_error" class="error" hx-swap-oob="true"></span>' in body
    fixed = viewer_client.get("/?offline=no&q=node", **hx()).content.decode()
    assert _names_in(fixed, ["node-00", "node-01"]) == ["node-00", "node-01"]
    assert '<span id="id_offline_error" class="error" hx-swap-oob="true"></span>' in fixed
    assert "Nothing is listed" not in fixed
    # A full page draws the slots in the form itself, never out of band.
    assert "hx-swap-oob" not in viewer_client.get("/?offline=maybe").content.decode()


@pytest.mark.django_db
def test_it_sorts_and_links_headers_back_and_forth(viewer_client):
    ingest("alpha", 8)
    ingest("bravo", 2)
    ingest("charlie", 4)
    names = ["alpha", "bravo", "charlie"]

    page = viewer_client.get("/?sort=-gpus").content.decode()
    assert _names_in(page, names) == ["alpha", "charlie", "bravo"]
    # The active column links to the other direction, keeping the filters.
    assert 'href="/?sort=gpus"' in page
    assert 'aria-sort="descending"' in page
    assert _names_in(viewer_client.get("/?sort=gpus").content.decode(), names) == ["bravo", "charlie", "alpha"]
    assert _names_in(viewer_client.get("/?sort=-name").content.decode(), names) == ["charlie", "bravo", "alpha"]


@pytest.mark.django_db
def test_it_paginates_keeping_filters_and_sort(viewer_client, make_fleet):
    make_fleet(30)
    page = viewer_client.get("/?per=25&sort=-name&attach=legacy").content.decode()
    assert "Nodes 1–25 of 30" in page
    assert ">node-29</a></th>" in page and ">node-04</a></th>" not in page
    next_url = "/?per=25&amp;sort=-name&amp;attach=legacy&amp;page=2"
    assert f'href="{next_url}" hx-get="{next_url}" hx-push-url="true"' in page

    second = viewer_client.get("/?per=25&sort=-name&attach=legacy&page=2").content.decode()
    assert "Nodes 26–30 of 30" in second and ">node-00</a></th>" in second
    # The table refreshes itself from the URL it was rendered for.
    assert 'hx-get="/?per=25&amp;sort=-name&amp;attach=legacy&amp;page=2" hx-trigger="every 10s"' in second
    # Downloads keep the filters and sort, not the page.
    assert 'href="/report.csv?sort=-name&amp;attach=legacy"' in second


@pytest.mark.django_db
def test_it_renders_the_filter_form_as_plain_get_with_htmx_push(viewer_client, make_fleet):
    make_fleet(1)
    page = viewer_client.get("/?health=warn").content.decode()
    assert '<form id="filters" class="filters" method="get" action="/"' in page
    assert 'hx-target="#node-table"' in page and 'hx-push-url="true"' in page
    assert '<option value="warn" selected>' in page
    assert '<input type="hidden" name="sort" value="-health" form="filters">' in page


@pytest.mark.django_db
def test_it_sends_only_the_table_to_htmx(viewer_client, make_fleet):
    make_fleet(2)
    response = viewer_client.get("/?sort=-name", **hx())
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="node-table"')
    assert "<html" not in body and "Fleet findings" not in body and 'id="filters"' not in body
    assert "HX-Request" in response["Vary"]


@pytest.mark.django_db
def test_it_sends_the_full_page_on_boosted_and_history_restore(viewer_client, make_fleet):
    make_fleet(1)
    for headers in (hx(hx_history_restore_request="true"), hx(hx_boosted="true")):
        response = viewer_client.get("/", **headers)
        assert "<html" in response.content.decode()
        assert "HX-Request" in response["Vary"]
    assert "HX-Request" in viewer_client.get("/")["Vary"]


@pytest.mark.django_db
def test_it_sends_the_summary_fragment(viewer_client, make_fleet):
    make_fleet(2)
    response = viewer_client.get(reverse("fleet:summary"), **hx())
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="fleet-summary"')
    assert "Nodes online" in body and "node-table" not in body
    assert "HX-Request" in response["Vary"]


@pytest.mark.django_db
def test_it_escapes_stored_text(viewer_client):
    node = ingest("alpha", 2)
    node.driver_version = "<script>alert(1)</script>"
    node.save()
    page = viewer_client.get("/").content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.django_db
def test_it_refuses_post(operator_client, make_fleet):
    assert operator_client.post("/").status_code == 405


# Query counts must not grow with the fleet. Every request: session, user,
# permissions (user, groups). Then the table: count, page; the summary: the fleet by
# state and versions (tiles, driver and toolkit drift and the filter form's driver
# versions, all from one scan), failing and warning nodes' problems, offline nodes,
# problems by cause, vanished GPUs, claims naming missing GPUs, failing alert
# channels. Maintenance is a join or a subquery of these, never a query. The fleet's own
# part of the summary (KEPT_QUERIES: by state and versions, failing, warning, offline,
# by cause, vanished) is kept for GPUFLEET_SUMMARY_MAX_AGE_S: a view within it reads none.
FULL_PAGE_QUERIES = 14
TABLE_QUERIES = 6
SUMMARY_QUERIES = 12
KEPT_QUERIES = 6


@pytest.mark.django_db
@pytest.mark.parametrize("size", [3, 30])
def test_it_reads_a_fixed_number_of_queries(viewer_client, make_fleet, django_assert_num_queries, size):
    nodes = make_fleet(size)
    # Something for every fleet finding, so each of their queries runs.
    Node.objects.filter(pk=nodes[0].pk).update(offline=True, driver_version="550.54.15")
    Node.objects.filter(pk=nodes[1].pk).update(driver_version="550.54.15", toolkit_version="v 1.17.0", health="warn")
    ingest(nodes[2].name, 1, at=timezone.now() + timedelta(seconds=5))  # lost a GPU: failing
    Claim.objects.create(node=nodes[2], name="train", device_ids=["9"], missing_devices=["9"])

    with time_machine.travel(timezone.now(), tick=False) as clock:
        with django_assert_num_queries(FULL_PAGE_QUERIES):
            assert viewer_client.get("/?per=200").status_code == 200
        with django_assert_num_queries(TABLE_QUERIES):
            assert viewer_client.get("/?per=200&sort=-vram", **hx()).status_code == 200
        with django_assert_num_queries(SUMMARY_QUERIES - KEPT_QUERIES):
            assert viewer_client.get(reverse("fleet:summary"), **hx()).status_code == 200
        with django_assert_num_queries(FULL_PAGE_QUERIES - KEPT_QUERIES):
            assert viewer_client.get("/?per=200").status_code == 200
        clock.shift(settings.GPUFLEET_SUMMARY_MAX_AGE_S + 1)
        with django_assert_num_queries(SUMMARY_QUERIES):
            assert viewer_client.get(reverse("fleet:summary"), **hx()).status_code == 200


@pytest.mark.django_db
def test_it_pushes_the_short_url_for_a_filter_form_sent_by_htmx(viewer_client, make_fleet):
    make_fleet(1)
    response = viewer_client.get("/?q=&health=warn&attach=&driver=&offline=&per=&sort=name", **hx())
    assert response["HX-Push-Url"] == "/?health=warn&sort=name"
    assert 'hx-get="/?health=warn&amp;sort=name" hx-trigger="every 10s"' in response.content.decode()
    # A refresh from the short URL itself pushes nothing.
    assert "HX-Push-Url" not in viewer_client.get("/?health=warn&sort=name", **hx())


@pytest.mark.django_db
def test_drift_counts_each_version_over_every_node_that_runs_it():
    """Driver and toolkit drift come from one query by (driver, toolkit): each version's
    count adds up its rows, and the most common version comes first."""
    fleet = [("570.1", "1.17.0"), ("570.1", "1.17.0"), ("570.1", "1.18.2"), ("550.5", "1.18.2"), ("550.5", ""),
             ("580.9", "1.17.0")]
    for i, (driver, toolkit) in enumerate(fleet):
        Node.objects.create(name=f"n{i}", present=True, driver_version=driver, toolkit_version=toolkit)
    Node.objects.create(name="gone", present=True, offline=True, driver_version="999.0", toolkit_version="9.9")
    findings = {f.code: [item.text for item in f.items] for f in FleetSummary().findings}
    assert findings["driver_drift"] == ["570.1 on 3 nodes", "550.5 on 2 nodes", "580.9 on 1 node"]
    assert findings["toolkit_drift"] == ["1.17.0 on 3 nodes", "1.18.2 on 2 nodes"]


@pytest.mark.postgresql
@pytest.mark.django_db
def test_on_postgresql_the_first_page_worst_first_is_read_off_an_index(make_fleet):
    """The overview's default order (health rank, worst first, then name) is the key
    of the node_worst_first index, so its first page needs no sort of the whole fleet."""
    make_fleet(3)
    page = NodeFilter({}, queryset=Node.objects.all()).qs[:DEFAULT_PER_PAGE]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a 3-node table is otherwise read whole
        sql, params = page.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "node_worst_first" in plan and "Sort" not in plan, plan
