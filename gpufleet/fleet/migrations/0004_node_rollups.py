"""After 0.1.0: the five-minute and hourly GPU history is kept one row per node and
bucket, the node's GPUs' figures packed in one bytes column (NodeRollup5m and
NodeRollup1h), instead of one row per GPU with a column per figure (DeviceSample5m and
DeviceSample1h): a third of the bytes a row, and the roll-up writes an eighth of the rows.
The rows kept are converted, then the old tables dropped; migrating back converts them
back.

On PostgreSQL the new tables are partitioned by `bucket` like the old ones (0001 says
how: primary key (id, bucket), `id` from a plain sequence, a DEFAULT partition), with
partitions from the oldest converted row's slice to AHEAD slices on.

The packing is written out here as gpufleet/gpu/rollups.py has it (a migration imports
no application code): per node and bucket, little-endian, n int64 device ids
(ascending), n uint32 sample counts, then n x 12 float32 figures, GPU after GPU: VRAM
used min, mean, max, utilization's, temperature's, power's; NaN for a missing one."""

import math
import struct
from datetime import UTC, datetime, timedelta

import django.db.models.deletion
from django.db import migrations, models

SERIES = {  # new table: old table, partition width, the unique constraint's suffix, FK name
    "fleet_noderollup5m": ("fleet_devicesample5m", timedelta(days=1), "5m", "ccbf2702"),
    "fleet_noderollup1h": ("fleet_devicesample1h", timedelta(days=7), "1h", "ef41080e"),
}
OLD_FK = {"fleet_devicesample5m": "c93674c1", "fleet_devicesample1h": "87927fc9"}
AHEAD = 3
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MEASURES = ("vram_used_mib", "utilization_percent", "temperature_c", "power_draw_w")
FIGURES = [f"{m}_{s}" for m in MEASURES for s in ("min", "avg", "max")]
WHOLE = {f"{m}_{s}" for m in MEASURES[:3] for s in ("min", "max")}  # integer columns of the old tables
GPU_BYTES = 60
BATCH = 2000


def _new_table_sql(table, series, fk):
    return [
        f'CREATE SEQUENCE "{table}_id_seq"',
        f"""CREATE TABLE "{table}" (
    "id" bigint NOT NULL DEFAULT nextval('{table}_id_seq'),
    "bucket" timestamp with time zone NOT NULL,
    "figures" bytea NOT NULL,
    "node_id" bigint NOT NULL,
    CONSTRAINT "{table}_pkey" PRIMARY KEY ("id", "bucket"),
    CONSTRAINT "one_{series}_rollup_per_node" UNIQUE ("node_id", "bucket"),
    CONSTRAINT "{table}_node_id_{fk}_fk_fleet_node_id" FOREIGN KEY ("node_id")
        REFERENCES "fleet_node" ("id") DEFERRABLE INITIALLY DEFERRED
) PARTITION BY RANGE ("bucket")""",
        f'ALTER SEQUENCE "{table}_id_seq" OWNED BY "{table}"."id"',
        f'CREATE INDEX "fleet_node{series}_bucket_idx" ON "{table}" ("bucket")',
    ]


def _old_table_sql(table, series):
    """As 0001 made it."""
    columns = "".join(
        f'\n    "{name}" {"double precision" if name.endswith("_avg") or name.startswith("power") else "bigint" if name.startswith("vram") else "integer"} NULL,'
        for name in FIGURES
    )
    return [
        f'CREATE SEQUENCE "{table}_id_seq"',
        f"""CREATE TABLE "{table}" (
    "id" bigint NOT NULL DEFAULT nextval('{table}_id_seq'),
    "bucket" timestamp with time zone NOT NULL,
    "samples" integer NOT NULL CONSTRAINT "{table}_samples_check" CHECK ("samples" >= 0),{columns}
    "device_id" bigint NOT NULL,
    CONSTRAINT "{table}_pkey" PRIMARY KEY ("id", "bucket"),
    CONSTRAINT "one_{series}_rollup_per_bucket" UNIQUE ("device_id", "bucket"),
    CONSTRAINT "{table}_device_id_{OLD_FK[table]}_fk_fleet_device_id" FOREIGN KEY ("device_id")
        REFERENCES "fleet_device" ("id") DEFERRABLE INITIALLY DEFERRED
) PARTITION BY RANGE ("bucket")""",
        f'ALTER SEQUENCE "{table}_id_seq" OWNED BY "{table}"."id"',
        f'CREATE INDEX "fleet_{series}_bucket_idx" ON "{table}" ("bucket")',
    ]


def _partitions_sql(table, width, since):
    """The DEFAULT partition and those from the slice holding `since` to AHEAD slices
    after now's (literals: DDL takes no parameters)."""
    statements = [f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT']
    start = EPOCH + (since - EPOCH) // width * width
    last = EPOCH + (datetime.now(UTC) - EPOCH) // width * width + AHEAD * width
    while start <= last:
        statements.append(
            f'CREATE TABLE "{table}_{start:%Y%m%d_%H%M}" PARTITION OF "{table}"'
            f" FOR VALUES FROM ('{start.isoformat()}') TO ('{(start + width).isoformat()}')"
        )
        start += width
    return statements


def _oldest(schema_editor, table):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f'SELECT MIN("bucket") FROM "{table}"')
        oldest = cursor.fetchone()[0]
    if isinstance(oldest, str):  # SQLite
        oldest = datetime.fromisoformat(oldest)
    return (oldest.replace(tzinfo=oldest.tzinfo or UTC) if oldest else None) or datetime.now(UTC)


def _pack(gpus):
    """(device id, samples, 12 figures with None for missing) per GPU -> bytes."""
    gpus = sorted(gpus)
    n = len(gpus)
    figures = [math.nan if f is None else min(max(float(f), -3.4e38), 3.4e38) for _, _, row in gpus for f in row]
    return struct.pack(f"<{n}q{n}I{12 * n}f", *(g[0] for g in gpus), *(g[1] for g in gpus), *figures)


def _unpack(data):
    n = len(data) // GPU_BYTES
    ids = struct.unpack_from(f"<{n}q", data, 0)
    samples = struct.unpack_from(f"<{n}I", data, 8 * n)
    figures = struct.unpack_from(f"<{12 * n}f", data, 12 * n)
    return [(ids[i], samples[i], figures[12 * i:12 * i + 12]) for i in range(n)]


def create_node_rollups(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for name in ("NodeRollup5m", "NodeRollup1h"):
            schema_editor.create_model(apps.get_model("fleet", name))
        return
    for table, (old, width, series, fk) in SERIES.items():
        for statement in _new_table_sql(table, series, fk) + _partitions_sql(table, width, _oldest(schema_editor, old)):
            schema_editor.execute(statement)


def drop_node_rollups(apps, schema_editor):
    for name in ("NodeRollup1h", "NodeRollup5m"):
        schema_editor.delete_model(apps.get_model("fleet", name))


def convert_to_node_rows(apps, schema_editor):
    """Each (node, bucket)'s per-GPU rows packed into one row."""
    for old_name, new_name in (("DeviceSample5m", "NodeRollup5m"), ("DeviceSample1h", "NodeRollup1h")):
        old, new = apps.get_model("fleet", old_name), apps.get_model("fleet", new_name)
        rows = old.objects.order_by("device__node_id", "bucket", "device_id").values_list(
            "device__node_id", "bucket", "device_id", "samples", *FIGURES).iterator(chunk_size=BATCH)
        batch, key, gpus = [], None, []
        for node_id, bucket, device_id, samples, *figures in rows:
            if key != (node_id, bucket):
                if gpus:
                    batch.append(new(node_id=key[0], bucket=key[1], figures=_pack(gpus)))
                key, gpus = (node_id, bucket), []
            gpus.append((device_id, samples, figures))
            if len(batch) >= BATCH:
                new.objects.bulk_create(batch)
                batch = []
        if gpus:
            batch.append(new(node_id=key[0], bucket=key[1], figures=_pack(gpus)))
        new.objects.bulk_create(batch)


def convert_to_gpu_rows(apps, schema_editor):
    """Back: one per-GPU row for each GPU of a node's row (of a GPU that still exists)."""
    devices = set(apps.get_model("fleet", "Device").objects.values_list("pk", flat=True))
    for old_name, new_name in (("DeviceSample5m", "NodeRollup5m"), ("DeviceSample1h", "NodeRollup1h")):
        old, new = apps.get_model("fleet", old_name), apps.get_model("fleet", new_name)
        batch = []
        for bucket, packed in new.objects.order_by("bucket", "node_id").values_list("bucket", "figures").iterator(
                chunk_size=BATCH):
            for device_id, samples, figures in _unpack(packed):
                if device_id in devices:
                    values = {name: None if f != f else round(f) if name in WHOLE and math.isfinite(f) else f
                              for name, f in zip(FIGURES, figures, strict=True)}
                    batch.append(old(device_id=device_id, bucket=bucket, samples=samples, **values))
            if len(batch) >= BATCH:
                old.objects.bulk_create(batch)
                batch = []
        old.objects.bulk_create(batch)


def drop_gpu_rollups(apps, schema_editor):
    for name in ("DeviceSample1h", "DeviceSample5m"):
        # On PostgreSQL the partitions and the sequence go with their table.
        schema_editor.delete_model(apps.get_model("fleet", name))


def create_gpu_rollups(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for name in ("DeviceSample5m", "DeviceSample1h"):
            schema_editor.create_model(apps.get_model("fleet", name))
        return
    for table, (old, width, series, _fk) in SERIES.items():
        for statement in _old_table_sql(old, series) + _partitions_sql(old, width, _oldest(schema_editor, table)):
            schema_editor.execute(statement)


ROLLUP_FIELDS = [
    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
    ('bucket', models.DateTimeField(help_text='Start of the bucket.')),
    ('figures', models.BinaryField()),
]


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0003_node_search_trigram'),
    ]

    operations = [
        # The new tables: Django's on SQLite, partitioned by time on PostgreSQL.
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='NodeRollup1h',
                fields=[
                    *ROLLUP_FIELDS,
                    ('node', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.node')),
                ],
                options={
                    'verbose_name': 'GPU history (hourly)',
                    'verbose_name_plural': 'GPU history (hourly)',
                    'ordering': ['node', 'bucket'],
                    'abstract': False,
                    'indexes': [models.Index(fields=['bucket'], name='fleet_node1h_bucket_idx')],
                    'constraints': [models.UniqueConstraint(fields=('node', 'bucket'), name='one_1h_rollup_per_node')],
                },
            ),
            migrations.CreateModel(
                name='NodeRollup5m',
                fields=[
                    *ROLLUP_FIELDS,
                    ('node', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.node')),
                ],
                options={
                    'verbose_name': 'GPU history (5 minutes)',
                    'verbose_name_plural': 'GPU history (5 minutes)',
                    'ordering': ['node', 'bucket'],
                    'abstract': False,
                    'indexes': [models.Index(fields=['bucket'], name='fleet_node5m_bucket_idx')],
                    'constraints': [models.UniqueConstraint(fields=('node', 'bucket'), name='one_5m_rollup_per_node')],
                },
            ),
        ]),
        migrations.RunPython(create_node_rollups, drop_node_rollups),
        migrations.RunPython(convert_to_node_rows, convert_to_gpu_rows),
        migrations.RunPython(drop_gpu_rollups, create_gpu_rollups),
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.DeleteModel(name='DeviceSample1h'),
            migrations.DeleteModel(name='DeviceSample5m'),
        ]),
    ]
