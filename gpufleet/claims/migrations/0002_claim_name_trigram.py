"""After 0.1.0: on PostgreSQL, a trigram index (pg_trgm) for the claims list's search,
which looks for a substring of a claim's name (and of its node's, through fleet 0003's
index). Django writes icontains as UPPER("name"::text) LIKE UPPER(%s), so the index is
on that expression; without it the search reads every claim. SQLite has no such index
and searches as before."""

from django.db import migrations

INDEX = "claim_name_trgm"


def add_search_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(
        f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "claims_claim" USING gin ((UPPER("name"::text)) gin_trgm_ops)'
    )


def drop_search_index(apps, schema_editor):
    # The extension stays: something else in the database may use it.
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')


class Migration(migrations.Migration):

    dependencies = [
        ('claims', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(add_search_index, drop_search_index),
    ]
