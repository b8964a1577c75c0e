"""After 0.1.0: on PostgreSQL, trigram indexes (pg_trgm) for the overview's search, which
looks for a substring of a node's name or GPU models. Django writes icontains there as
UPPER("col"::text) LIKE UPPER(%s), so each index is on that expression; without them the
search reads every node. SQLite has no such index and searches as before."""

from django.db import migrations

_INDEXES = {"node_name_trgm": "name", "node_gpu_models_trgm": "gpu_models"}


def add_search_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for index, column in _INDEXES.items():
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{index}" ON "fleet_node" USING gin ((UPPER("{column}"::text)) gin_trgm_ops)'
        )


def drop_search_indexes(apps, schema_editor):
    # The extension stays: something else in the database may use it.
    if schema_editor.connection.vendor != "postgresql":
        return
    for index in _INDEXES:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{index}"')


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0002_finding_problems'),
    ]

    operations = [
        migrations.RunPython(add_search_indexes, drop_search_indexes),
    ]
