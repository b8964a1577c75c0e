# Deliveries keep why they were held back: maintenance, or which silence.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='delivery',
            name='muted',
            field=models.CharField(blank=True, choices=[('', 'not muted'), ('silenced', 'silenced'), ('maintenance', 'in maintenance')], default='', max_length=12),
        ),
        migrations.AddField(
            model_name='delivery',
            name='silence',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='alerts.silence'),
        ),
    ]
