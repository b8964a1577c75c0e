"""/audit/: who did what, paginated, for every role."""

import pytest
from django.urls import reverse

from gpufleet.audit.models import record
from tests.factories import hx


@pytest.mark.django_db
def test_it_lists_entries_newest_first(viewer_client, operator, alpha):
    record(operator, "claim.create", node=alpha, target="train", after={"name": "train", "count": 2})
    record(operator, "claim.update", node=alpha, target="train", before={"count": 2}, after={"count": 3})
    page = viewer_client.get(reverse("audit:log")).content.decode()
    table = page[page.index('id="audit-table"'):]  # the filter form names every action too
    assert table.index("claim.update") < table.index("claim.create")
    assert "otto" in page and 'href="/nodes/alpha/"' in page
    assert '<code>{&quot;count&quot;: 2}</code> → <code>{&quot;count&quot;: 3}</code>' in page


@pytest.mark.django_db
def test_it_keeps_entries_of_deleted_nodes_and_system_actions(viewer_client, alpha):
    record(None, "node.diagnose", node=alpha, target="alpha")
    alpha.delete()
    page = viewer_client.get("/audit/").content.decode()
    assert "system" in page and "alpha" in page and 'href="/nodes/alpha/"' not in page


@pytest.mark.django_db
def test_it_paginates_and_filters_by_node(viewer_client, alpha, make_fleet):
    other = make_fleet(1)[0]
    for i in range(60):
        record(None, "node.diagnose", node=alpha, target=f"t{i}")
    record(None, "node.diagnose", node=other, target="other")
    first = viewer_client.get("/audit/?node=alpha").content.decode()
    assert "Page 1 of 2" in first and ">other<" not in first
    assert 'href="/audit/?node=alpha&amp;page=2"' in first
    second = viewer_client.get("/audit/?node=alpha&page=2", **hx())
    body = second.content.decode()
    assert body.lstrip().startswith('<div id="audit-table"') and "<html" not in body
    assert "HX-Request" in second["Vary"]


@pytest.mark.django_db
def test_it_escapes_stored_values(viewer_client, alpha):
    record(None, "claim.create", node=alpha, target="<b>x</b>", after={"name": "<script>"})
    page = viewer_client.get("/audit/").content.decode()
    assert "<b>x</b>" not in page and "<script>\"" not in page and "&lt;script&gt;" in page


@pytest.mark.django_db
@pytest.mark.parametrize("entries", [3, 40])
def test_it_reads_a_fixed_number_of_queries(viewer_client, alpha, django_assert_num_queries, entries):
    for i in range(entries):
        record(None, "node.diagnose", node=alpha, target=f"t{i}")
    with django_assert_num_queries(6):  # session, user, permissions (2), count, page
        viewer_client.get("/audit/")
