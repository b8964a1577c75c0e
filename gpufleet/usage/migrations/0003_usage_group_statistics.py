"""Extended statistics of the hourly usage rows' group keys, on PostgreSQL. A claim's
id, name, node and owner go together, as do a node's id and name; without being told,
the planner multiplies their distinct counts, expects millions of groups where there
are tens of thousands, and sorts a month of rows on disk instead of hashing them
(docs/performance.md, "Usage accounting")."""

from django.db import migrations

STATISTICS = {
    "usage_1h_claim_groups": "claim_id, claim, node, owner",
    "usage_1h_node_groups": "node_id, node",
}


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, columns in STATISTICS.items():
        schema_editor.execute(f"CREATE STATISTICS IF NOT EXISTS {name} (ndistinct) ON {columns} FROM usage_usagehour")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in STATISTICS:
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("usage", "0002_monthly_report")]

    operations = [migrations.RunPython(create, drop)]
