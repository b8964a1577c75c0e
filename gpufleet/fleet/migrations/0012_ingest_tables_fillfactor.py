"""Half-empty pages for the rows every snapshot rewrites (a node and its GPUs).

PostgreSQL can then put each new row version on the page of the old one (a HOT
update), which leaves the indexes alone and lets the page reclaim the old version
by itself. On full pages (the default) nearly every ingest update went to another
page with a new entry in each index: 530 of 131,200 GPU updates were HOT, and after
three rounds of 500 nodes the dead versions outnumbered the live rows 7 to 1, and
the lookups of the next snapshots read through them (the lost-GPU query went from 2
to 15 ms a batch). SQLite has no such setting and needs none."""

from django.db import migrations

TABLES = ("fleet_node", "fleet_device")


def _set_fillfactor(percent):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for table in TABLES:
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {percent})")

    return apply


class Migration(migrations.Migration):
    dependencies = [("fleet", "0011_device_vanished_index")]

    operations = [migrations.RunPython(_set_fillfactor(50), _set_fillfactor(100))]
