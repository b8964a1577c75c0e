"""The claims-vs-use page counts and lists its findings from the partial index of them
(fleet 0005), not by reading every finding of the fleet."""

from __future__ import annotations

import pytest
from django.db import connection

from gpufleet.claims import use

pytestmark = pytest.mark.django_db


@pytest.mark.postgresql
def test_the_use_findings_are_read_through_their_partial_index():
    keys = use.findings().order_by().values("pk")
    sql, params = keys.query.sql_with_params()
    with connection.cursor() as cursor:
        # The table is empty here: without this the planner reads it whole anyway.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "finding_use" in plan
