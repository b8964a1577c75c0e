"""After 0.1.0: every claim belongs to a team. Claims made before teams go to a team
named "general" whose members are the people who made or own them, so that each keeps
the right to change their own claims; an admin may then move them to their teams."""

import django.db.models.deletion
from django.db import migrations, models

GENERAL = "general"


def into_general_team(apps, schema_editor):
    Claim = apps.get_model("claims", "Claim")
    Team = apps.get_model("teams", "Team")
    Membership = apps.get_model("teams", "Membership")
    unassigned = Claim.objects.filter(team__isnull=True)
    if not unassigned.exists():
        return
    team = Team.objects.filter(name__iexact=GENERAL).first() or Team.objects.create(name=GENERAL)
    people = set(unassigned.exclude(owner=None).values_list("owner_id", flat=True))
    people |= set(unassigned.exclude(created_by=None).values_list("created_by_id", flat=True))
    for user_id in sorted(people):
        Membership.objects.get_or_create(team=team, user_id=user_id)
    unassigned.update(team=team)


class Migration(migrations.Migration):
    dependencies = [("claims", "0005_claim_series"), ("teams", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="claim",
            name="team",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="claims", to="teams.team"),
        ),
        migrations.RunPython(into_general_team, migrations.RunPython.noop),
    ]
