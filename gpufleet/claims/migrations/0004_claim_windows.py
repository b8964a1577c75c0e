"""After 0.1.0: a claim is a window of time. Its expiry becomes the window's end, and a
claim made before windows starts when it was made."""

import django.utils.timezone
from django.db import migrations, models


def _start_when_made(apps, schema_editor):
    apps.get_model("claims", "Claim").objects.update(starts_at=models.F("created_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('claims', '0003_claim_idle_warned_at'),
    ]

    operations = [
        migrations.RenameField(model_name='claim', old_name='expires_at', new_name='ends_at'),
        migrations.AddField(
            model_name='claim',
            name='starts_at',
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(_start_when_made, migrations.RunPython.noop),
    ]
