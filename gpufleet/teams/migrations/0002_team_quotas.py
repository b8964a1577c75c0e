"""After 0.1.0: a team's quotas (gpufleet/gpu/quota.py), each empty (no limit) for teams made before."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('teams', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='team',
            name='gpu_hours_per_month',
            field=models.PositiveIntegerField(blank=True, help_text='The GPU-hours the team may reserve in a calendar month, bookings ahead included.', null=True, verbose_name='GPU-hours per month'),
        ),
        migrations.AddField(
            model_name='team',
            name='max_gpu_hours_ahead',
            field=models.PositiveIntegerField(blank=True, help_text='The GPU-hours the team may hold booked beyond the next 24 hours.', null=True, verbose_name='GPU-hours ahead'),
        ),
        migrations.AddField(
            model_name='team',
            name='max_gpus',
            field=models.PositiveIntegerField(blank=True, help_text='The most GPUs the team may hold at any instant.', null=True, verbose_name='most GPUs at once'),
        ),
        migrations.AddField(
            model_name='team',
            name='max_gpus_by_model',
            field=models.JSONField(blank=True, default=dict, help_text='As {"H100": 8}: a model as find-a-node takes it (part of the GPU\'s name, any case) and the most of its GPUs the team may hold at any instant.', verbose_name='most GPUs at once by model'),
        ),
    ]
