from django.conf import settings
from django.db import migrations, models
import django.db.models.deletion
import django.db.models.functions.text


class Migration(migrations.Migration):
    initial = True

    dependencies = [migrations.swappable_dependency(settings.AUTH_USER_MODEL)]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=100)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.CreateModel(
            name="Membership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("lead", models.BooleanField(default=False, help_text="A lead changes every claim of the team.")),
                ("from_directory", models.BooleanField(default=False, editable=False)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="teams.team")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to=settings.AUTH_USER_MODEL)),
            ],
            options={"ordering": ["team", "user"]},
        ),
        migrations.AddField(
            model_name="team",
            name="members",
            field=models.ManyToManyField(related_name="teams", through="teams.Membership", to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddConstraint(
            model_name="team",
            constraint=models.UniqueConstraint(django.db.models.functions.text.Lower("name"), name="team_unique_name_any_case"),
        ),
        migrations.AddConstraint(
            model_name="membership",
            constraint=models.UniqueConstraint("team", "user", name="membership_unique_person_per_team"),
        ),
    ]
