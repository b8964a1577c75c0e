"""Nodes made the way production makes them (a snapshot through ingest) and claims
saved through the services, so every test goes through the real ledger."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from html import unescape

import pytest

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.teams.models import Team
from tests.factories import gpu_uuid, later, snapshot

HTMX = {"HTTP_HX_REQUEST": "true"}

# The bookings' tests run on a Monday noon and book the Tuesday after.
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
TUESDAY_9 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
TUESDAY_17 = datetime(2026, 12, 8, 17, 0, tzinfo=UTC)


def post_claim(client, body: dict, node: str = "alpha"):
    return client.post(f"/api/nodes/{node}/claims/", json.dumps(body), content_type="application/json")


def make_node(name: str = "alpha", gpus: int = 8, **kwargs) -> Node:
    result = ingest_snapshot(snapshot(name, gpus, **kwargs))
    assert result.outcome == "accepted", result
    return Node.objects.get(name=name)


def shrink_node(node: Node, gpus: int) -> Node:
    """A later snapshot with fewer GPUs: the rest vanish and claims on them are flagged."""
    first = snapshot(node.name, gpus)
    result = ingest_snapshot(snapshot(node.name, gpus, at=later(first, 60)))
    assert result.outcome == "accepted", result
    return Node.objects.get(pk=node.pk)


def lab_team() -> Team:
    """The team "lab" (tests/conftest.py's `lab`), made on first use."""
    return Team.objects.get_or_create(name="lab")[0]


def claim(node: Node, name: str, user=None, count: int = 0, device_ids=(), team: Team | None = None) -> Claim:
    """Saved by `user` for `team` (None: the user's only team; the system's: "lab")."""
    if team is None and user is None:
        team = lab_team()
    terms = services.Terms(owner=user, team=team) if team is not None else None
    return services.save_claim(node, gpu.Claim(name=name, count=count, device_ids=tuple(device_ids)), user, terms=terms)


@pytest.fixture(name="booked")
def booked_fixture(operator) -> Claim:
    """Two GPUs of alpha booked Tuesday 9-17 by `operator` for the team vision, whose quota
    is 2 GPUs at once: any more is over it. Import it where used (the quota's API and form)."""
    team = Team.objects.create(name="vision", max_gpus=2)
    team.memberships.create(user=operator)
    return services.save_claim(make_node("alpha", 8), gpu.Claim("train", count=2), operator,
                               terms=services.Terms(owner=operator, starts_at=TUESDAY_9, ends_at=TUESDAY_17, team=team))


def save_owned(node: Node, proposed: gpu.Claim, owner) -> Claim:
    """`proposed` saved by the system for the team lab, owned by `owner`: the set-up of tests
    about what an owner is told or charged, not about who may book (tests/claims/test_rights.py)."""
    return services.save_claim(node, proposed, None, terms=services.Terms(owner=owner, team=lab_team()))


def uuid(node: Node, index: int) -> str:
    return gpu_uuid(node.name, index)


def field_errors(html: str, field: str) -> list[str]:
    """The error sentences shown at a form field ("form" for those above the form)."""
    slot = "err-form" if field == "form" else f"id_{field}_error"
    match = re.search(rf'<div id="{slot}"[^>]*>(.*?)</div>', html, re.S)
    assert match, f"no error slot {slot} in the page"
    return [unescape(p).strip() for p in re.findall(r"<p>(.*?)</p>", match.group(1), re.S)]


def all_errors(html: str) -> dict[str, list[str]]:
    """Every error slot that holds something, by field."""
    found = {}
    for field in ("form", "name", "mode", "count", "devices", "starts_at", "ends_at", "repeat"):
        if field == "repeat" and 'id="id_repeat_error"' not in html:
            continue  # a new claim's only
        errors = field_errors(html, field)
        if errors:
            found[field] = errors
    return found


def summary(html: str) -> dict[str, str]:
    """The ledger summary figures as shown (total, reserved, free, holders)."""
    return {k: unescape(v).strip() for k, v in re.findall(r'<dd data-field="(\w+)">(.*?)</dd>', html, re.S)}


def hidden_version(html: str) -> str:
    match = re.search(r'<input type="hidden" name="updated_at" value="([^"]*)">', html)
    assert match, "no updated_at field in the form"
    return unescape(match.group(1))
