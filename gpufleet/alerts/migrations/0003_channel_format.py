# A channel may send Alertmanager's webhook format instead of apprise's message.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0002_delivery_muted'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='format',
            field=models.CharField(choices=[('apprise', "apprise (the service's own message)"), ('alertmanager', 'Alertmanager webhook (version 4)')], default='apprise', max_length=12),
        ),
    ]
