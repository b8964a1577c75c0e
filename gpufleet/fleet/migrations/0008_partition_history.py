# The sample tables partitioned by time on PostgreSQL. A migration of its own:
# the schema editor creates 0007's indexes and foreign keys only at its end, and
# the conversion must see them to carry them over.

from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone

from gpufleet.fleet import partitions


def partition_history(apps, schema_editor):
    """On PostgreSQL, the sample tables become partitioned by time (see
    gpufleet/fleet/partitions.py); the raw samples kept so far move over, with
    partitions for as far back as they are still kept. The rollups get partitions
    as far back too: the first rollups are made from those samples, and a bucket
    from before midnight (or before the week's start) would otherwise land in the
    DEFAULT partition. SQLite keeps plain tables."""
    connection = schema_editor.connection
    if not partitions.supported(connection):
        return
    now = timezone.now()
    raw_since = now - timedelta(hours=settings.GPUFLEET_HISTORY_RAW_HOURS)
    partitions.partition_table(connection, "fleet_devicesample", since=raw_since, now=now)
    partitions.partition_table(connection, "fleet_devicesample5m", since=raw_since, now=now)
    partitions.partition_table(connection, "fleet_devicesample1h", since=raw_since, now=now)


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0007_history_rollups"),
    ]

    operations = [
        # Going back leaves the tables partitioned: the older code reads and writes them alike.
        migrations.RunPython(partition_history, migrations.RunPython.noop),
    ]
