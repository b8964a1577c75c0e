"""The tables every snapshot writes carry no index that another index already makes
redundant (a plain one whose columns lead another's; a unique one enforces something):
each is written for every row ingest inserts, and the lookups it would serve use the
longer one."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.fleet.summary import FleetSummary
from tests.factories import ingest

pytestmark = pytest.mark.django_db

INGEST_TABLES = ("fleet_node", "fleet_device", "fleet_finding", "fleet_devicesample")


def _indexes(table: str) -> dict[str, tuple[list[str], bool]]:
    """Each index of `table` but the primary key's: (its columns, whether it is unique).
    Indexes on expressions are left out: their columns are None or none at all."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return {name: (c["columns"], c["unique"]) for name, c in constraints.items()
            if (c["index"] or c["unique"]) and not c["primary_key"] and c["columns"] and all(c["columns"])}


@pytest.mark.parametrize("table", INGEST_TABLES)
def test_no_index_leads_another(table):
    indexes = _indexes(table)
    redundant = [
        (name, other) for name, (columns, unique) in indexes.items() for other, (longer, _) in indexes.items()
        if not unique and other != name and len(longer) > len(columns) and longer[:len(columns)] == columns
    ]
    assert redundant == []


def test_lookups_by_node_keep_an_index_that_leads_with_the_node():
    for table in ("fleet_device", "fleet_finding"):
        assert any(columns[0] == "node_id" for columns, _ in _indexes(table).values()), table


@pytest.mark.postgresql
def test_problems_by_cause_can_read_only_the_problem_findings():
    # The query's status test must imply the partial index's condition, or the
    # overview reads every ok finding of the fleet again.
    ingest("alpha", 1)
    with CaptureQueriesContext(connection) as queries:
        assert FleetSummary().findings is not None
    sql = next(q["sql"] for q in queries.captured_queries if 'FROM "fleet_finding"' in q["sql"] and "GROUP BY" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "finding_problems" in plan
