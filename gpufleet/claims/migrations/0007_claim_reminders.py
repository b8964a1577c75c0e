"""After 0.1.0: when the central beat reminded a claim's owner that it starts, and that it
ends, within the hour, so each is told once (and again after a save moves it)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("claims", "0006_claim_team")]

    operations = [
        migrations.AddField(
            model_name="claim",
            name="start_reminded_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="claim",
            name="end_reminded_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
