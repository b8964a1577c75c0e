"""Every URL pattern of the site × every role, generated from the URLconf: a new
page without an entry in REQUIRED fails here until someone says who may use it.

Anonymous requests go to the login page (401 JSON on the API); a role that lacks
the action gets 403; a role that has it gets through (no 401/403, no 500)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLResolver, get_resolver, reverse
from django.utils import timezone

from gpufleet.alerts.models import Channel, Rule, Silence
from gpufleet.core.access import (
    ACKNOWLEDGE_XID,
    APPLY_FIX,
    DIAGNOSE,
    EDIT_CLAIMS,
    MAINTAIN,
    MANAGE_ALERTS,
    RUN_DCGM_DIAG,
    VIEW,
)
from gpufleet.jobs.models import Job, JobKind
from tests.claims.helpers import claim
from tests.factories import ingest

# Booking and changing claims follow the claims rights (gpufleet/claims/rights.py, tested
# as their own matrix in tests/claims/test_rights.py): by role alone, in no team, only
# admins have them; the people probing here are in no team.
BOOK = "book"

# url name -> (action it needs, method to probe it with)
REQUIRED = {
    "fleet:overview": (VIEW, "get"),
    "fleet:summary": (VIEW, "get"),
    "fleet:report": (VIEW, "get"),
    "fleet:node_detail": (VIEW, "get"),
    "fleet:node_findings": (VIEW, "get"),
    "fleet:node_report": (VIEW, "get"),
    "fleet:acknowledge_xid": (ACKNOWLEDGE_XID, "post"),
    "fleet:set_maintenance": (MAINTAIN, "post"),
    "fleet:end_maintenance": (MAINTAIN, "post"),
    "fleet:end_validation": (RUN_DCGM_DIAG, "post"),
    "jobs:diagnose": (DIAGNOSE, "post"),
    "jobs:fix": (APPLY_FIX, "get"),
    "jobs:dcgm_diag": (RUN_DCGM_DIAG, "get"),
    "jobs:status": (VIEW, "get"),
    "audit:log": (VIEW, "get"),
    "events:list": (VIEW, "get"),
    "events:export": (VIEW, "get"),
    "events:open_count": (VIEW, "get"),
    "claims:list": (VIEW, "get"),
    "claims:find": (VIEW, "get"),
    "claims:availability": (VIEW, "get"),
    "claims:slots": (VIEW, "get"),
    "claims:calendar": (VIEW, "get"),
    "claims:panel": (VIEW, "get"),
    "claims:use": (VIEW, "get"),
    "claims:use_export": (VIEW, "get"),
    "claims:add": (BOOK, "get"),
    "claims:validate_new": (BOOK, "post"),
    "claims:edit": (BOOK, "get"),
    "claims:validate": (BOOK, "post"),
    "claims:delete": (BOOK, "get"),
    "teams:list": (VIEW, "get"),
    "teams:detail": (VIEW, "get"),
    "api:teams": (VIEW, "get"),
    "api:team": (VIEW, "get"),
    "api:nodes": (VIEW, "get"),
    "api:node": (VIEW, "get"),
    "api:node_devices": (VIEW, "get"),
    "api:node_findings": (VIEW, "get"),
    "api:node_claims": (VIEW, "get"),
    "api:claims": (VIEW, "get"),
    "api:claim": (VIEW, "get"),
    "api:api-root": (VIEW, "get"),
    "api:openapi-json": (VIEW, "get"),
    "api:docs": (VIEW, "get"),
    "api:placement": (VIEW, "get"),
    "api:availability": (VIEW, "get"),
    "api:events": (VIEW, "get"),
    # A scraper's page: a token or an allowed address, or a session that may view.
    "metrics": (VIEW, "get"),
    "tokens:list": (VIEW, "get"),
    "tokens:revoke": (VIEW, "post"),
    # Who may revoke which feed beyond that: tests/api/test_calendar_feeds.py.
    "tokens:revoke_feed": (VIEW, "post"),
    "tokens:reissue_feed": (VIEW, "post"),
    "api:calendar": (VIEW, "get"),
    "alerts:channels": (VIEW, "get"),
    "alerts:channel_edit": (MANAGE_ALERTS, "get"),
    "alerts:channel_delete": (MANAGE_ALERTS, "get"),
    "alerts:channel_test": (MANAGE_ALERTS, "post"),
    "alerts:rules": (VIEW, "get"),
    "alerts:rule_edit": (MANAGE_ALERTS, "get"),
    "alerts:rule_delete": (MANAGE_ALERTS, "get"),
    "alerts:silences": (VIEW, "get"),
    "alerts:silence_end": (MANAGE_ALERTS, "post"),
    "alerts:deliveries": (VIEW, "get"),
    "api:channels": (VIEW, "get"),
    "api:channel": (VIEW, "get"),
    "api:channel_test": (MANAGE_ALERTS, "post"),
    "api:rules": (VIEW, "get"),
    "api:rule": (VIEW, "get"),
    "api:silences": (VIEW, "get"),
    "api:silence": (VIEW, "get"),
    "api:node_maintenance": (VIEW, "get"),
    "api:node_validation": (RUN_DCGM_DIAG, "delete"),
    "api:deliveries": (VIEW, "get"),
    "api:usage": (VIEW, "get"),
    "usage:page": (VIEW, "get"),
    "usage:export": (VIEW, "get"),
    "usage:node_month": (VIEW, "get"),
    "usage:claim_month": (VIEW, "get"),
}
# Django's own views, with their own access rules (tested by Django), and the two open to
# anyone: the health check, the site icon (tests/core/test_favicon.py) and the page single
# sign-on sends a refused person to, with its "try again" (tests/sso/test_sign_in.py),
# OpenID Connect login's button and callback (tests/sso/test_oidc_login.py), and a calendar
# feed, whose secret URL is its credential (tests/api/test_calendar_feeds.py).
NOT_OURS = {"login", "logout", "healthz", "favicon", "sso:no-access", "sso:try-again", "oidc:login", "oidc:callback",
            "calendar_feed"}
ROLES = {
    None: set(),
    "viewer": {VIEW},
    "operator": {VIEW, EDIT_CLAIMS, DIAGNOSE, MAINTAIN},
    "admin": {VIEW, EDIT_CLAIMS, BOOK, DIAGNOSE, MAINTAIN, APPLY_FIX, ACKNOWLEDGE_XID, MANAGE_ALERTS, RUN_DCGM_DIAG},
}


def test_every_url_pattern_says_who_may_use_it():
    names = {p.name for p in _all_patterns()} - NOT_OURS
    assert names == set(REQUIRED)


# Patterns without a name, which REQUIRED cannot list: the API's JSON 404 for any other
# path under /api/ (gpufleet/api/urls.py). Any other must get a name, and an entry above.
UNNAMED = {"api/^.*/$"}


def test_every_url_pattern_outside_the_admin_has_a_name():
    unnamed = set()

    def walk(patterns, prefix=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                if p.app_name != "admin":
                    walk(p.url_patterns, prefix + str(p.pattern))
            elif not p.name:
                unnamed.add(prefix + str(p.pattern))

    walk(get_resolver().url_patterns)
    assert unnamed == UNNAMED


@pytest.fixture
def objects(db):
    node = ingest("alpha", 2, fixes=["cdi"])
    held = claim(node, "train", count=1)
    job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE)
    # A channel whose test fails at once: nothing listens on the discard port.
    channel = Channel.objects.create(name="ops", url="json://127.0.0.1:9/hook", redacted="json://…")
    silence = Silence.objects.create(nodes="alpha", ends_at=timezone.now() + timedelta(hours=1), reason="test")
    return {"name": node.name, "pk_claim": held.pk, "pk_job": job.pk, "pk_channel": channel.pk,
            "pk_rule": Rule.objects.get().pk, "pk_silence": silence.pk}


def _url(name: str, objects: dict) -> str:
    kwargs = {}
    pattern = {p.name: p for p in _all_patterns()}[name]
    route = str(pattern.pattern)
    if "name" in route:
        kwargs["name"] = objects["name"]
    if "fmt" in route:
        kwargs["fmt"] = "json"
    if "index" in route:
        kwargs["index"] = 0
    if "code" in route:
        kwargs["code"] = "cdi"
    if "level" in route:
        kwargs["level"] = 1
    if "node_id" in route:
        kwargs["node_id"] = 1
    if "claim_id" in route:
        kwargs["claim_id"] = objects["pk_claim"]
    if "pk" in route:
        kwargs["pk"] = objects["pk_job"] if name.startswith("jobs:") else objects["pk_claim"]
        for model in ("channel", "rule", "silence"):
            if name.startswith((f"alerts:{model}_", f"api:{model}")) and not name.endswith("s"):
                kwargs["pk"] = objects[f"pk_{model}"]
    return reverse(name, kwargs=kwargs)


def _all_patterns():
    """(full name, pattern) pairs, as a list of objects with .name and .pattern."""

    class Named:
        def __init__(self, name, pattern):
            self.name, self.pattern = name, pattern.pattern

    found = []

    def walk(patterns, namespace=""):
        for p in patterns:
            if isinstance(p, URLResolver):
                if p.app_name != "admin":
                    walk(p.url_patterns, f"{namespace}{p.namespace}:" if p.namespace else namespace)
            elif p.name:
                found.append(Named(f"{namespace}{p.name}", p))

    walk(get_resolver().url_patterns)
    return found


def _client(django_user_model, role: str | None) -> Client:
    user = django_user_model.objects.create_user(username=f"user-{role or 'none'}", password="x")
    if role:
        user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_anonymous_requests_never_get_through(client, objects, name):
    action, method = REQUIRED[name]
    response = getattr(client, method)(_url(name, objects))
    if name.startswith("api:") or name == "metrics":
        assert response.status_code == 401
    else:
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("role", list(ROLES), ids=lambda r: r or "no-role")
@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_each_role_gets_exactly_its_actions(django_user_model, objects, sent_tasks, name, role):
    action, method = REQUIRED[name]
    response = getattr(_client(django_user_model, role), method)(_url(name, objects))
    if action in ROLES[role]:
        assert response.status_code not in (401, 403) and response.status_code < 500, response.status_code
    else:
        assert response.status_code == 403
