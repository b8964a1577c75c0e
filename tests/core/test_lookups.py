"""core.lookups: `__any`, which is `__in` with one array parameter on PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.fleet.models import Device, Node

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("names", [
    pytest.param(["a", "c", "missing"], id="some"),
    pytest.param({"a", "b"}, id="a-set"),
    pytest.param(["a", None], id="none-equals-nothing"),
    pytest.param([], id="empty"),
    pytest.param([None], id="only-none"),
])
def test_it_finds_what_in_finds(names):
    for name in "abc":
        Node.objects.create(name=name)
    found = set(Node.objects.filter(name__any=names).values_list("name", flat=True))
    assert found == set(Node.objects.filter(name__in=names).values_list("name", flat=True))


def test_it_works_on_foreign_keys_in_updates_and_deletes():
    nodes = [Node.objects.create(name=name) for name in "ab"]
    for node in nodes:
        Device.objects.create(node=node, uuid=f"GPU-{node.name}", index=0, name="H200")
    assert Device.objects.filter(node_id__any=[nodes[0].pk]).update(name="H100") == 1
    assert Device.objects.filter(node_id__any=[nodes[1].pk]).delete()[0] == 1
    assert list(Device.objects.values_list("uuid", "name")) == [("GPU-a", "H100")]


@pytest.mark.postgresql
def test_on_postgresql_the_values_are_one_parameter():
    with CaptureQueriesContext(connection) as ctx:
        list(Node.objects.filter(name__any=[f"n{i}" for i in range(200)]))
    (query,) = ctx.captured_queries
    assert "= ANY(" in query["sql"] and " IN (" not in query["sql"]
