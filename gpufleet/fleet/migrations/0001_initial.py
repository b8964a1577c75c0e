"""The fleet app's tables, as Django generates them (5.2) but for two things done by hand
on PostgreSQL; SQLite keeps Django's plain tables.

- The sample tables are partitioned by time, so that retention drops whole partitions
  instead of deleting rows one by one (gpufleet/fleet/partitions.py keeps them up:
  partitions made ahead, dropped when old). A partitioned table's primary key must hold
  the partition key: it is (id, time) in the database, `id` alone to Django, and `id`
  takes its values from a plain sequence (no identity column on a partitioned table
  before PostgreSQL 17). Each table gets its DEFAULT partition and the partitions from
  the current slice to AHEAD slices on, as the housekeeping would make them.
- The node and GPU tables leave half of each page empty (fillfactor 50), so that the
  row versions each snapshot writes stay on their page (HOT updates) and no index
  entry is added for them.

Written out here rather than imported from gpufleet: a migration must make the same
schema whatever the application's code becomes.
"""

from datetime import UTC, datetime, timedelta

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

# The sample tables as fleet/partitions.py's LAYOUTS has them: the time column each is
# partitioned by, and how long a partition is. Partitions start at whole multiples of
# their width from the Unix epoch (UTC) and are named after their start.
HISTORY_TABLES = {
    "fleet_devicesample": ("collected_at", timedelta(hours=1)),
    "fleet_devicesample5m": ("bucket", timedelta(days=1)),
    "fleet_devicesample1h": ("bucket", timedelta(days=7)),
}
AHEAD = 3
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

ROLLUP_COLUMNS = """
    "samples" integer NOT NULL CONSTRAINT "{table}_samples_check" CHECK ("samples" >= 0),
    "vram_used_mib_min" bigint NULL,
    "vram_used_mib_avg" double precision NULL,
    "vram_used_mib_max" bigint NULL,
    "utilization_percent_min" integer NULL,
    "utilization_percent_avg" double precision NULL,
    "utilization_percent_max" integer NULL,
    "temperature_c_min" integer NULL,
    "temperature_c_avg" double precision NULL,
    "temperature_c_max" integer NULL,
    "power_draw_w_min" double precision NULL,
    "power_draw_w_avg" double precision NULL,
    "power_draw_w_max" double precision NULL,"""

# The names of the foreign keys and indexes are those Django gives them.
HISTORY_SQL = [
    'CREATE SEQUENCE "fleet_devicesample_id_seq"',
    """CREATE TABLE "fleet_devicesample" (
    "id" bigint NOT NULL DEFAULT nextval('fleet_devicesample_id_seq'),
    "collected_at" timestamp with time zone NOT NULL,
    "vram_used_mib" bigint NULL,
    "utilization_percent" integer NULL,
    "temperature_c" integer NULL,
    "power_draw_w" double precision NULL,
    "device_id" bigint NOT NULL,
    CONSTRAINT "fleet_devicesample_pkey" PRIMARY KEY ("id", "collected_at"),
    CONSTRAINT "fleet_devicesample_device_id_07f1775f_fk_fleet_device_id" FOREIGN KEY ("device_id")
        REFERENCES "fleet_device" ("id") DEFERRABLE INITIALLY DEFERRED
) PARTITION BY RANGE ("collected_at")""",
    'ALTER SEQUENCE "fleet_devicesample_id_seq" OWNED BY "fleet_devicesample"."id"',
    'CREATE INDEX "fleet_devic_device__2f2016_idx" ON "fleet_devicesample" ("device_id", "collected_at")',
    'CREATE INDEX "fleet_devic_collect_00586d_idx" ON "fleet_devicesample" ("collected_at")',
]
for _table, _series, _fk in (("fleet_devicesample5m", "5m", "c93674c1"), ("fleet_devicesample1h", "1h", "87927fc9")):
    HISTORY_SQL += [
        f'CREATE SEQUENCE "{_table}_id_seq"',
        f"""CREATE TABLE "{_table}" (
    "id" bigint NOT NULL DEFAULT nextval('{_table}_id_seq'),
    "bucket" timestamp with time zone NOT NULL,{ROLLUP_COLUMNS.format(table=_table)}
    "device_id" bigint NOT NULL,
    CONSTRAINT "{_table}_pkey" PRIMARY KEY ("id", "bucket"),
    CONSTRAINT "one_{_series}_rollup_per_bucket" UNIQUE ("device_id", "bucket"),
    CONSTRAINT "{_table}_device_id_{_fk}_fk_fleet_device_id" FOREIGN KEY ("device_id")
        REFERENCES "fleet_device" ("id") DEFERRABLE INITIALLY DEFERRED
) PARTITION BY RANGE ("bucket")""",
        f'ALTER SEQUENCE "{_table}_id_seq" OWNED BY "{_table}"."id"',
        f'CREATE INDEX "fleet_{_series}_bucket_idx" ON "{_table}" ("bucket")',
    ]
HISTORY_MODELS = ("DeviceSample", "DeviceSample5m", "DeviceSample1h")


def _partitions_sql(now):
    """The DEFAULT partition of each sample table and its partitions from the slice
    holding `now` to AHEAD slices after it. DDL takes no query parameters: the bounds
    are literals made from datetimes computed here."""
    statements = []
    for table, (_column, width) in HISTORY_TABLES.items():
        statements.append(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT')
        start = EPOCH + (now - EPOCH) // width * width
        for _ in range(AHEAD + 1):
            end = start + width
            statements.append(
                f'CREATE TABLE "{table}_{start:%Y%m%d_%H%M}" PARTITION OF "{table}"'
                f" FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
            start = end
    return statements


def create_history_tables(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        for name in HISTORY_MODELS:
            schema_editor.create_model(apps.get_model("fleet", name))
        return
    for statement in HISTORY_SQL + _partitions_sql(datetime.now(UTC)):
        schema_editor.execute(statement)


def drop_history_tables(apps, schema_editor):
    for name in reversed(HISTORY_MODELS):
        # On PostgreSQL the partitions and the sequence go with their table.
        schema_editor.delete_model(apps.get_model("fleet", name))


def half_empty_pages(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in ("fleet_node", "fleet_device"):
            schema_editor.execute(f'ALTER TABLE "{table}" SET (fillfactor = 50)')


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='NodeCredential',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('generation', models.PositiveIntegerField(default=1)),
                ('issued_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='Node',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('first_seen', models.DateTimeField(default=django.utils.timezone.now)),
                ('last_seen', models.DateTimeField(default=django.utils.timezone.now, help_text='When the last snapshot arrived.')),
                ('collected_at', models.DateTimeField(blank=True, help_text='When the agent took it.', null=True)),
                ('offline', models.BooleanField(default=False)),
                ('health', models.CharField(choices=[('ok', 'OK'), ('warn', 'Warning'), ('fail', 'Failing')], default='ok', max_length=8)),
                ('present', models.BooleanField(default=False)),
                ('driver_version', models.CharField(blank=True, max_length=64)),
                ('runtime_installed', models.BooleanField(default=False)),
                ('toolkit_version', models.CharField(blank=True, max_length=200)),
                ('attach', models.CharField(choices=[('cdi', 'CDI'), ('legacy', 'nvidia runtime'), ('none', 'none')], default='none', max_length=8)),
                ('cdi_spec_files', models.JSONField(blank=True, default=list)),
                ('cdi_devices', models.JSONField(blank=True, default=list)),
                ('fixes_allowed', models.JSONField(blank=True, default=list, help_text='Finding codes the agent may fix.')),
                ('gpu_count', models.PositiveIntegerField(default=0)),
                ('vram_total_mib', models.BigIntegerField(default=0)),
                ('vram_used_mib', models.BigIntegerField(default=0)),
                ('utilization_mean', models.FloatField(blank=True, null=True)),
                ('gpus_reserved', models.PositiveIntegerField(default=0)),
                ('gpus_lost', models.PositiveIntegerField(default=0)),
                ('problem', models.CharField(blank=True, max_length=300)),
                ('gpu_models', models.CharField(blank=True, max_length=500)),
                ('simulated', models.BooleanField(default=False)),
                ('refused_total', models.PositiveBigIntegerField(default=0)),
                ('refused_since', models.DateTimeField(blank=True, null=True)),
                ('refused_last_at', models.DateTimeField(blank=True, null=True)),
                ('refused_last_reason', models.CharField(blank=True, choices=[('unknown-node', 'names no enrolled node'), ('old-key', 'signed with an old key'), ('bad-signature', 'bad signature'), ('over-cap', 'more than the node may send per collect interval'), ('too-large', 'too large'), ('malformed', 'malformed'), ('replay', 'not newer than the stored snapshot'), ('centre-only-code', 'a finding only the site writes')], max_length=32)),
            ],
            options={
                'ordering': ['name'],
                'permissions': [('diagnose_node', 'Can ask a node to diagnose itself now'), ('apply_fix', 'Can apply a doctor fix on a node'), ('acknowledge_xid', "Can acknowledge a GPU's Xid errors")],
                'indexes': [models.Index(models.OrderBy(models.Case(models.When(offline=True, then=models.Value(3)), models.When(health='warn', then=models.Value(1)), models.When(health='fail', then=models.Value(2)), default=models.Value(0), output_field=models.IntegerField()), descending=True), models.F('name'), name='node_worst_first')],
            },
        ),
        migrations.CreateModel(
            name='Device',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('uuid', models.CharField(max_length=100)),
                ('index', models.IntegerField()),
                ('name', models.CharField(max_length=200)),
                ('vram_total_mib', models.BigIntegerField(blank=True, null=True)),
                ('vram_used_mib', models.BigIntegerField(blank=True, null=True)),
                ('utilization_percent', models.IntegerField(blank=True, null=True)),
                ('pci_bus_id', models.CharField(blank=True, max_length=32)),
                ('temperature_c', models.IntegerField(blank=True, null=True)),
                ('power_draw_w', models.FloatField(blank=True, null=True)),
                ('power_limit_w', models.FloatField(blank=True, null=True)),
                ('health', models.JSONField(blank=True, default=dict)),
                ('last_seen', models.DateTimeField(default=django.utils.timezone.now)),
                ('vanished_at', models.DateTimeField(blank=True, null=True)),
                ('first_seen', models.DateTimeField(default=django.utils.timezone.now)),
                ('busy_at', models.DateTimeField(blank=True, null=True)),
                ('node', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='devices', to='fleet.node')),
            ],
            options={
                'ordering': ['node', 'index'],
            },
        ),
        migrations.CreateModel(
            name='XidAcknowledgement',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('device_uuid', models.CharField(max_length=100)),
                ('xid_errors', models.JSONField(default=list)),
                ('at', models.DateTimeField(default=django.utils.timezone.now)),
                ('by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='xid_acknowledgements', to='fleet.node')),
            ],
        ),
        # The sample tables: Django's on SQLite, partitioned by time on PostgreSQL (below).
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='DeviceSample',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('collected_at', models.DateTimeField()),
                    ('vram_used_mib', models.BigIntegerField(blank=True, null=True)),
                    ('utilization_percent', models.IntegerField(blank=True, null=True)),
                    ('temperature_c', models.IntegerField(blank=True, null=True)),
                    ('power_draw_w', models.FloatField(blank=True, null=True)),
                    ('device', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='samples', to='fleet.device')),
                ],
                options={
                    'ordering': ['device', 'collected_at'],
                    'indexes': [models.Index(fields=['device', 'collected_at'], name='fleet_devic_device__2f2016_idx'), models.Index(fields=['collected_at'], name='fleet_devic_collect_00586d_idx')],
                },
            ),
            migrations.CreateModel(
                name='DeviceSample1h',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('bucket', models.DateTimeField(help_text='Start of the bucket.')),
                    ('samples', models.PositiveIntegerField(default=0)),
                    ('vram_used_mib_min', models.BigIntegerField(blank=True, null=True)),
                    ('vram_used_mib_avg', models.FloatField(blank=True, null=True)),
                    ('vram_used_mib_max', models.BigIntegerField(blank=True, null=True)),
                    ('utilization_percent_min', models.IntegerField(blank=True, null=True)),
                    ('utilization_percent_avg', models.FloatField(blank=True, null=True)),
                    ('utilization_percent_max', models.IntegerField(blank=True, null=True)),
                    ('temperature_c_min', models.IntegerField(blank=True, null=True)),
                    ('temperature_c_avg', models.FloatField(blank=True, null=True)),
                    ('temperature_c_max', models.IntegerField(blank=True, null=True)),
                    ('power_draw_w_min', models.FloatField(blank=True, null=True)),
                    ('power_draw_w_avg', models.FloatField(blank=True, null=True)),
                    ('power_draw_w_max', models.FloatField(blank=True, null=True)),
                    ('device', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.device')),
                ],
                options={
                    'verbose_name': 'device sample (hourly)',
                    'verbose_name_plural': 'device samples (hourly)',
                    'ordering': ['device', 'bucket'],
                    'abstract': False,
                    'indexes': [models.Index(fields=['bucket'], name='fleet_1h_bucket_idx')],
                    'constraints': [models.UniqueConstraint(fields=('device', 'bucket'), name='one_1h_rollup_per_bucket')],
                },
            ),
            migrations.CreateModel(
                name='DeviceSample5m',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('bucket', models.DateTimeField(help_text='Start of the bucket.')),
                    ('samples', models.PositiveIntegerField(default=0)),
                    ('vram_used_mib_min', models.BigIntegerField(blank=True, null=True)),
                    ('vram_used_mib_avg', models.FloatField(blank=True, null=True)),
                    ('vram_used_mib_max', models.BigIntegerField(blank=True, null=True)),
                    ('utilization_percent_min', models.IntegerField(blank=True, null=True)),
                    ('utilization_percent_avg', models.FloatField(blank=True, null=True)),
                    ('utilization_percent_max', models.IntegerField(blank=True, null=True)),
                    ('temperature_c_min', models.IntegerField(blank=True, null=True)),
                    ('temperature_c_avg', models.FloatField(blank=True, null=True)),
                    ('temperature_c_max', models.IntegerField(blank=True, null=True)),
                    ('power_draw_w_min', models.FloatField(blank=True, null=True)),
                    ('power_draw_w_avg', models.FloatField(blank=True, null=True)),
                    ('power_draw_w_max', models.FloatField(blank=True, null=True)),
                    ('device', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='fleet.device')),
                ],
                options={
                    'verbose_name': 'device sample (5 minutes)',
                    'verbose_name_plural': 'device samples (5 minutes)',
                    'ordering': ['device', 'bucket'],
                    'abstract': False,
                    'indexes': [models.Index(fields=['bucket'], name='fleet_5m_bucket_idx')],
                    'constraints': [models.UniqueConstraint(fields=('device', 'bucket'), name='one_5m_rollup_per_bucket')],
                },
            ),
        ]),
        migrations.RunPython(create_history_tables, drop_history_tables),
        migrations.CreateModel(
            name='Finding',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('position', models.PositiveIntegerField(default=0)),
                ('code', models.CharField(max_length=64)),
                ('name', models.CharField(max_length=200)),
                ('status', models.CharField(choices=[('ok', 'OK'), ('warn', 'Warning'), ('fail', 'Failing')], max_length=8)),
                ('message', models.TextField(blank=True)),
                ('fix', models.TextField(blank=True)),
                ('node', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='findings', to='fleet.node')),
            ],
            options={
                'ordering': ['node', 'position'],
                'constraints': [models.UniqueConstraint(fields=('node', 'code'), name='finding_unique_code_per_node')],
            },
        ),
        migrations.AddIndex(
            model_name='device',
            index=models.Index(condition=models.Q(('vanished_at__isnull', False)), fields=['-vanished_at'], name='device_vanished_latest'),
        ),
        migrations.AddConstraint(
            model_name='device',
            constraint=models.UniqueConstraint(fields=('node', 'uuid'), name='device_unique_uuid_per_node'),
        ),
        migrations.AddConstraint(
            model_name='xidacknowledgement',
            constraint=models.UniqueConstraint(fields=('node', 'device_uuid'), name='one_xid_ack_per_gpu'),
        ),
        migrations.CreateModel(
            name='Maintenance',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('until', models.DateTimeField()),
                ('reason', models.CharField(max_length=500)),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('author', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('node', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='maintenance', to='fleet.node')),
            ],
        ),
        migrations.RunPython(half_empty_pages, migrations.RunPython.noop),
    ]
