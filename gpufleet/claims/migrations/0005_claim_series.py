"""After 0.1.0: the occurrences of a repeating booking share a series id."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("claims", "0004_claim_windows")]

    operations = [
        migrations.AddField(
            model_name="claim",
            name="series",
            field=models.UUIDField(blank=True, db_index=True, editable=False, null=True),
        ),
    ]
