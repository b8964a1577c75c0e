"""After 0.1.0: why an admin booked a claim over its team's quota; empty on claims made before."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('claims', '0007_claim_reminders'),
    ]

    operations = [
        migrations.AddField(
            model_name='claim',
            name='quota_override_reason',
            field=models.TextField(blank=True, editable=False),
        ),
    ]
