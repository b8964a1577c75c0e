"""NodeFilter on its own, as the API and the exports use it: filters, sort, page
size, and invalid values as errors with nothing listed."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from gpufleet.fleet.filters import NodeFilter
from gpufleet.fleet.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes():
    """Rows as ingest leaves them, made directly so each figure is exact."""
    rows = [
        dict(name="alpha", health="ok", gpu_count=8, utilization_mean=10.0, driver_version="570.133.20", attach="cdi"),
        dict(name="bravo", health="warn", gpu_count=2, utilization_mean=90.0, driver_version="570.133.20"),
        dict(name="charlie", health="fail", gpu_count=0, utilization_mean=None, attach="none"),
        dict(name="delta", health="ok", gpu_count=2, utilization_mean=50.0, offline=True, driver_version="550.54.15"),
        dict(name="echo", health="ok", gpu_count=2, utilization_mean=50.0, driver_version="570.133.20"),
    ]
    defaults = {"attach": "legacy"}
    return [Node.objects.create(**{**defaults, **row}) for row in rows]


def _names(query: str) -> list[str]:
    """The names `query` lists, by name unless it sorts (the default order has its own test)."""
    return [node.name for node in NodeFilter(QueryDict(query), queryset=Node.objects.all(), default_sort="name").qs]


def test_it_filters_outside_a_view(nodes):
    assert _names("health=ok") == ["alpha", "echo"]  # delta is offline: its "ok" is not current
    assert _names("health=offline") == ["delta"]
    assert _names("health=problems") == ["bravo", "charlie", "delta"]
    assert _names("attach=cdi") == ["alpha"]
    assert _names("driver=570.133.20&offline=no") == ["alpha", "bravo", "echo"]
    assert _names("offline=yes") == ["delta"]
    assert _names("q=  HAR  ") == ["charlie"]  # trimmed, any case
    assert _names("") == ["alpha", "bravo", "charlie", "delta", "echo"]


def test_it_sorts_descending_with_nulls_last_and_name_breaking_ties(nodes):
    assert _names("sort=-util") == ["bravo", "delta", "echo", "alpha", "charlie"]
    assert _names("sort=util") == ["alpha", "delta", "echo", "bravo", "charlie"]
    assert _names("sort=-gpus") == ["alpha", "bravo", "delta", "echo", "charlie"]
    assert _names("sort=-name&health=ok") == ["echo", "alpha"]


def test_it_sorts_health_by_rank_offline_worst(nodes):
    assert _names("sort=-health") == ["delta", "charlie", "bravo", "alpha", "echo"]
    assert _names("sort=health") == ["alpha", "echo", "bravo", "charlie", "delta"]


def test_it_keeps_a_bookmarked_driver_that_left_the_fleet(nodes):
    node_filter = NodeFilter(QueryDict("driver=535.0"), queryset=Node.objects.all())
    assert node_filter.is_valid()
    assert list(node_filter.qs) == []
    # Offered (and selected) in the form, so the page says what it filters by.
    assert '<option value="535.0" selected>535.0</option>' in str(node_filter.form["driver"])
    assert '<option value="550.54.15">550.54.15</option>' in str(node_filter.form["driver"])


@pytest.mark.parametrize(
    "query, field",
    [
        ("health=bogus", "health"),
        ("attach=docker", "attach"),
        ("offline=maybe", "offline"),
        ("sort=nonsense", "sort"),
        ("sort=-", "sort"),
        ("per=7", "per"),
        ("per=lots", "per"),
        ("q=" + "x" * 201, "q"),
    ],
)
def test_it_lists_nothing_for_an_invalid_value(nodes, query, field):
    # With a valid filter beside it: one wrong value still empties the list.
    node_filter = NodeFilter(QueryDict(f"{query}&driver=570.133.20"), queryset=Node.objects.all())
    assert not node_filter.is_valid()
    assert list(node_filter.errors) == [field]
    assert list(node_filter.qs) == []
    assert node_filter.error_messages()[0].startswith(f"{field}: ")


def test_it_lists_worst_first_by_default_with_name_breaking_ties(nodes):
    listed = NodeFilter(QueryDict(""), queryset=Node.objects.all()).qs
    # Offline is worst whatever its last health; then failing, warning, ok.
    assert [n.name for n in listed] == ["delta", "charlie", "bravo", "alpha", "echo"]
    assert _names("sort=health") == ["alpha", "echo", "bravo", "charlie", "delta"]


def test_it_reads_sort_and_page_size_with_defaults(nodes):
    def made(query: str) -> NodeFilter:
        return NodeFilter(QueryDict(query), queryset=Node.objects.all())

    assert (made("").current_sort, made("").per_page, made("").active) == ("-health", 50, False)
    by_name = NodeFilter(QueryDict(""), queryset=Node.objects.all(), default_sort="name")
    assert by_name.current_sort == "name" and [n.name for n in by_name.qs] == sorted(n.name for n in nodes)
    assert (made("sort=-free&per=200").current_sort, made("sort=-free&per=200").per_page) == ("-free", 200)
    assert not made("sort=-free&per=200").active
    assert made("offline=no").active
    # The valid fields stay readable while another is wrong (the page keeps its sort).
    assert made("sort=-gpus&health=bogus").current_sort == "-gpus"
    assert made("sort=bogus").current_sort == "-health"
