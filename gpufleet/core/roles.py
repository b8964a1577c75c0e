"""The three roles, as Django groups: viewer reads, operator also edits claims,
asks for diagnoses and puts nodes in maintenance, admin also applies fixes, runs DCGM diagnostics, manages users and teams and sets up alerts. Kept in step with
this table after every migrate."""

from __future__ import annotations

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"

_READ = [
    "fleet.view_node",
    "fleet.view_device",
    "fleet.view_finding",
    "fleet.view_devicesample",
    "claims.view_claim",
    "jobs.view_job",
    "audit.view_auditentry",
    "alerts.view_channel",
    "alerts.view_rule",
    "alerts.view_silence",
    "alerts.view_delivery",
]
_OPERATE = ["claims.add_claim", "claims.change_claim", "claims.delete_claim", "fleet.diagnose_node",
            "fleet.change_maintenance"]
_ADMINISTER = ["fleet.apply_fix", "fleet.acknowledge_xid", "fleet.run_dcgm_diag", "auth.view_user", "auth.add_user", "auth.change_user", "auth.delete_user", "auth.view_group",
               "sso.view_identity"]
# Teams and who is in them: the admin role's.
_ADMINISTER += [f"teams.{verb}_{model}" for model in ("team", "membership") for verb in ("view", "add", "change", "delete")]
# Channels (whose URLs hold secrets), rules and silences: the admin role's.
_ADMINISTER += [f"alerts.{verb}_{model}" for model in ("channel", "rule", "silence") for verb in ("add", "change", "delete")]

ROLE_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _READ,
    OPERATOR: _READ + _OPERATE,
    ADMIN: _READ + _OPERATE + _ADMINISTER,
}


def ensure_roles(app_config=None, **kwargs) -> None:
    """post_migrate handler: create the groups and give them exactly their permissions.
    Django sends post_migrate once per app (after every migrate and every test flush);
    the roles are made once, for the last app, when every app's permissions exist."""
    from django.apps import apps
    from django.contrib.auth.models import Group, Permission

    with_models = [config for config in apps.get_app_configs() if config.models_module is not None]
    if app_config is not None and with_models and app_config.label != with_models[-1].label:
        return

    for role, names in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        wanted = []
        for name in names:
            app_label, codename = name.split(".")
            perm = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if perm is not None:
                wanted.append(perm)
        group.permissions.set(wanted)
