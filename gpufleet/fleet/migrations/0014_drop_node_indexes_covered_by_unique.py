"""Drop the index Django makes for a foreign key where a unique index already leads with
that column: devices by (node, uuid), findings by (node, code). Each snapshot deletes
and inserts its node's findings, and every index is written for each of those rows
(in process, batches of 200 8-GPU snapshots: the COPY of their findings took 11.5 ms
with the index, 10.0 ms without)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0013_node_worst_first_index'),
    ]

    operations = [
        migrations.AlterField(
            model_name='device',
            name='node',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='devices', to='fleet.node'),
        ),
        migrations.AlterField(
            model_name='finding',
            name='node',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='findings', to='fleet.node'),
        ),
    ]
