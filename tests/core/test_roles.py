"""The three roles are made by the post_migrate handler, once per migrate (or test
flush) rather than once per app, and hold exactly their permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from gpufleet.core import roles

pytestmark = pytest.mark.django_db


def _held() -> dict[str, set[str]]:
    return {group.name: {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all()}
            for group in Group.objects.prefetch_related("permissions__content_type")}


def test_each_role_holds_exactly_its_permissions_after_a_migrate():
    Group.objects.all().delete()
    call_command("migrate", verbosity=0)
    assert _held() == {role: set(names) for role, names in roles.ROLE_PERMISSIONS.items()}


def test_the_roles_are_made_once_per_migrate_not_once_per_app(monkeypatch):
    # Django sends post_migrate once per app, after every migrate and every test flush.
    made = []
    original = Group.objects.get_or_create

    def counting(**names):
        made.append(names["name"])
        return original(**names)

    monkeypatch.setattr(Group.objects, "get_or_create", counting)
    call_command("migrate", verbosity=0)
    assert made == list(roles.ROLE_PERMISSIONS)
