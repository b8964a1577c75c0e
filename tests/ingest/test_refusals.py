"""Counting refusals (gpufleet/ingest/refusals.py): per node on its row, per reason
fleet-wide in /metrics; one statement whatever the batch; an unknown name makes no node
and costs no statement; the node's health is never touched."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api.metrics import render
from gpufleet.fleet.models import Health, Node, Refusal
from gpufleet.ingest.refusals import count_refusals
from tests.factories import ingest

pytestmark = pytest.mark.django_db


def _refused_by_reason() -> dict[str, float]:
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(render().decode())
            for s in family.samples if s.name == "gpufleet_ingest_refused_total"}


def test_it_counts_per_node_in_one_statement_whatever_the_batch(django_assert_num_queries):
    """One UPDATE of the counters, and three statements of events (the nodes named, their
    open events of refusals, one write: tests/events), whatever the batch."""
    nodes = [ingest(f"node-{i:02d}") for i in range(20)]
    counts = {(node.name, reason): i + 1 for i, node in enumerate(nodes)
              for reason in (Refusal.OVER_CAP, Refusal.BAD_SIGNATURE)}
    with django_assert_num_queries(1 + 3):
        count_refusals(counts)
    with django_assert_num_queries(1 + 3):
        count_refusals({("node-03", Refusal.REPLAY): 5})
    node = Node.objects.get(name="node-03")
    assert node.refused_total == 4 + 4 + 5
    assert node.refused_last_reason == Refusal.REPLAY
    assert node.refused_since <= node.refused_last_at
    assert Node.objects.get(name="node-19").refused_total == 40
    assert Node.objects.get(name="node-19").refused_last_reason == Refusal.BAD_SIGNATURE


def test_refusals_keep_the_first_time_and_never_change_health():
    node = ingest("alpha")
    first = timezone.now() - timedelta(hours=2)
    count_refusals({("alpha", Refusal.OLD_KEY): 1}, now=first)
    count_refusals({("alpha", Refusal.OVER_CAP): 2})
    node.refresh_from_db()
    assert node.refused_since == first
    assert node.refused_last_at > first
    assert node.refused_total == 3
    assert node.status == Health.OK and node.problem == ""


def test_unknown_names_are_counted_fleet_wide_and_make_no_node(django_assert_num_queries):
    before = _refused_by_reason()
    with django_assert_num_queries(0):
        count_refusals({(f"junk-{i}", Refusal.UNKNOWN_NODE): 1 for i in range(1000)})
    # A known reason naming a node the centre never saw: one UPDATE that matches nothing.
    count_refusals({("never-seen", Refusal.MALFORMED): 2, ("", Refusal.MALFORMED): 1})
    assert not Node.objects.exists()
    after = _refused_by_reason()
    assert after[Refusal.UNKNOWN_NODE] - before.get(Refusal.UNKNOWN_NODE, 0) == 1000
    assert after[Refusal.MALFORMED] - before.get(Refusal.MALFORMED, 0) == 3


def test_an_empty_batch_costs_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        count_refusals({})


def test_a_reason_that_is_no_refusal_is_a_bug():
    with pytest.raises(ValueError, match="'lost'"):
        count_refusals({("alpha", "lost"): 1})
