"""The admin site shows, and never adds, changes or deletes, the rows that only a
service may write (it writes the audit row, takes the node's lock, keeps the
ledger and the node's figures right): claims, audit rows, jobs, node credentials,
GPUs, findings, history, Xid acknowledgements, API tokens, the hourly usage rows and
the nodes themselves. Not for the admin role, not for a superuser. A model added to that
list gets its line in MODELS."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.forms.models import model_to_dict
from django.test import Client, RequestFactory
from django.utils import timezone

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import AuditEntry, record
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import (
    Device,
    DeviceSample,
    Finding,
    Node,
    NodeCredential,
    NodeRollup1h,
    NodeRollup5m,
    XidAcknowledgement,
)
from gpufleet.gpu import rollups
from gpufleet.jobs.models import Job, JobKind
from gpufleet.sso.models import Identity
from gpufleet.usage.models import UsageHour
from tests.factories import ingest

pytestmark = pytest.mark.django_db


def _sample(node: Node) -> DeviceSample:
    return DeviceSample.objects.create(device=node.devices.first(), collected_at=timezone.now(), vram_used_mib=1)


def _rollup(model) -> Callable[[Node], object]:
    return lambda node: model.objects.create(node=node, bucket=timezone.now(),
                                             figures=rollups.pack([(node.devices.first().pk, 1, [1.0] * 12)]))


# model -> a row of it on `node`, made as its service would leave it.
MODELS: dict[type, Callable[[Node], object]] = {
    Claim: lambda node: Claim.objects.create(node=node, name="train", count=1),
    AuditEntry: lambda node: record(None, "node.diagnose", node=node, target=node.name),
    Job: lambda node: Job.objects.create(node=node, kind=JobKind.DIAGNOSE),
    NodeCredential: lambda node: NodeCredential.objects.create(name=node.name),
    Node: lambda node: node,
    Device: lambda node: node.devices.first(),
    Finding: lambda node: node.findings.first(),
    DeviceSample: _sample,
    NodeRollup5m: _rollup(NodeRollup5m),
    NodeRollup1h: _rollup(NodeRollup1h),
    XidAcknowledgement: lambda node: XidAcknowledgement.objects.create(node=node, device_uuid="GPU-1"),
    ApiToken: lambda node: ApiToken.issue(User.objects.create_user("tokenowner"), "ci", "read")[0],
    UsageHour: lambda node: UsageHour.objects.create(bucket=timezone.now(), node_id=node.pk, node=node.name, key="k",
                                                     seen_s=3600),
    Identity: lambda node: Identity.objects.create(user=User.objects.create_user("dana"), source="ldap",
                                                   subject="uid=dana,ou=people,dc=example,dc=org", role="viewer"),
}


AXES = ("axes.AccessAttempt", "axes.AccessLog", "axes.AccessFailureLog")


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.org", "pw-root")


@pytest.fixture(params=["admin role", "superuser"])
def who(request, admin_user, root):
    return admin_user if request.param == "admin role" else root


@pytest.fixture
def as_who(who) -> Client:
    client = Client()
    client.force_login(who)
    return client


@pytest.fixture
def node() -> Node:
    return ingest("alpha", 2)


def _url(model, tail: str = "") -> str:
    return f"/admin/{model._meta.app_label}/{model._meta.model_name}/{tail}"


def _state(model, pk) -> dict | None:
    row = model.objects.filter(pk=pk).first()
    return None if row is None else model_to_dict(row)


def _names(model) -> list[str]:
    return [f.name for f in model._meta.fields if f.editable and not f.primary_key]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_the_change_view_has_nothing_to_save(model, as_who, who, node):
    obj = MODELS[model](node)
    response = as_who.get(_url(model, f"{obj.pk}/change/"))
    # The admin role may be refused the page altogether (no view permission): also no save.
    assert response.status_code == 200 if who.is_superuser else response.status_code in (200, 403)
    page = response.content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page and 'name="_addanother"' not in page
    assert "deletelink" not in page and "/delete/" not in page and "-DELETE" not in page


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_a_post_to_change_delete_or_add_is_refused_and_changes_nothing(model, as_who, node):
    obj = MODELS[model](node)
    before, count = _state(model, obj.pk), model.objects.count()
    # Every editable field sent with a value: a form that saved would change something.
    tampered = {name: "1" for name in _names(model)}
    assert as_who.post(_url(model, f"{obj.pk}/change/"), tampered).status_code == 403
    assert as_who.post(_url(model, f"{obj.pk}/delete/"), {"post": "yes"}).status_code == 403
    assert as_who.post(_url(model, "add/"), tampered).status_code == 403
    assert _state(model, obj.pk) == before
    assert model.objects.count() == count


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_the_changelist_offers_no_delete_selected(model, as_who, who, node):
    obj = MODELS[model](node)
    changelist = _url(model)
    page = as_who.get(changelist)
    assert "delete_selected" not in page.content.decode()
    request = RequestFactory().get(changelist)
    request.user = who
    assert "delete_selected" not in admin.site._registry[model].get_actions(request)
    # The bulk action sent anyway deletes nothing.
    as_who.post(changelist, {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"})
    assert model.objects.filter(pk=obj.pk).exists()


def test_nodes_with_claims_cannot_be_deleted_to_take_the_claims_along(as_who, node):
    Claim.objects.create(node=node, name="train", count=1)
    assert as_who.post(f"/admin/fleet/node/{node.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Claim.objects.filter(node=node).exists()


def test_a_future_model_is_covered_by_adding_it_to_models():
    """Every model registered in the admin site is either here or one that is edited
    in the admin on purpose: users and groups (audited by gpufleet/core/admin.py), and
    django-axes' login attempts, whose deletion is how an admin lifts a lockout, and teams
    (audited by gpufleet/teams/admin.py)."""
    edited_on_purpose = {"auth.User", "auth.Group", "teams.Team", *AXES}
    registered = {model._meta.label for model in admin.site._registry}
    assert registered - edited_on_purpose == {model._meta.label for model in MODELS}



def test_a_superuser_forgets_vanished_gpus_through_an_audited_action(root):
    first = ingest("alpha", 2)
    ingest("alpha", 1, at=first.last_seen + timedelta(seconds=30))  # GPU 1 vanished
    node = Node.objects.get(name="alpha")
    assert node.gpus_lost == 1
    gone, kept = node.devices.get(index=1), node.devices.get(index=0)
    client = Client()
    client.force_login(root)
    response = client.post(_url(Device), {"action": "forget_vanished_gpus", "_selected_action": [gone.pk, kept.pk]})
    assert response.status_code == 302
    assert list(node.devices.values_list("index", flat=True)) == [0]  # the reported GPU stays
    assert Node.objects.get(pk=node.pk).gpus_lost == 0
    entry = AuditEntry.objects.get(action="gpu.forget")
    assert entry.username == "root" and entry.node_name == "alpha" and entry.target == "GPU 1"
    assert entry.before["gpus"][0]["uuid"] == gone.uuid


def test_the_admin_role_is_not_offered_to_forget_gpus(admin_user, node):
    request = RequestFactory().get(_url(Device))
    request.user = admin_user
    assert "forget_vanished_gpus" not in admin.site._registry[Device].get_actions(request)
