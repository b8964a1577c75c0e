"""Claims that end: owner, contact and end; the list's time left, badge and
filters; and the central beat's release of ended claims (only when enabled)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services, tasks
from gpufleet.claims.models import Claim
from gpufleet.claims.templatetags.claims_tags import time_left
from gpufleet.fleet.models import Node
from tests.claims.helpers import claim, field_errors, make_node

pytestmark = pytest.mark.django_db


def ending(node: Node, name: str, user, ends_at, **terms) -> Claim:
    return services.save_claim(
        node, gpu.Claim(name, count=1), user, terms=services.Terms(owner=user, ends_at=ends_at, **terms)
    )


def past(node: Node, name: str, user, hours: float = 2) -> Claim:
    """A claim that ended `hours` ago, after three hours (an end can only be set in the future)."""
    saved = ending(node, name, user, timezone.now() + timedelta(hours=1))
    Claim.objects.filter(pk=saved.pk).update(starts_at=timezone.now() - timedelta(hours=hours + 3),
                                             ends_at=timezone.now() - timedelta(hours=hours))
    return Claim.objects.get(pk=saved.pk)


def test_a_new_claim_is_owned_by_its_creator_starts_now_and_never_ends(operator):
    saved = claim(make_node("alpha", 4), "train", operator, count=1)
    assert (saved.owner, saved.contact, saved.ends_at, saved.ended) == (operator, "", None, False)
    assert saved.in_force() and saved.starts_at <= timezone.now()


def test_the_form_saves_owner_contact_and_end(operator_client, operator, viewer, lab):
    lab.memberships.create(user=viewer)  # an owner is a member of the claim's team
    make_node("alpha", 4)
    response = operator_client.post(
        "/claims/nodes/alpha/new/",
        {"name": "train", "mode": "count", "count": "1", "owner": viewer.username, "contact": "#ml-team",
         "ends_at": (timezone.localtime() + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")},
    )
    assert response.status_code == 302
    saved = Claim.objects.get(name="train")
    assert (saved.owner, saved.contact, saved.created_by) == (viewer, "#ml-team", operator)
    assert timedelta(days=1, hours=23) < saved.ends_at - timezone.now() <= timedelta(days=2)
    assert AuditEntry.objects.get().after["owner"] == "vera"


def test_the_add_form_offers_the_user_as_owner_and_lists_no_other_user(operator_client, operator, viewer):
    html = operator_client.get("/claims/nodes/" + make_node("alpha", 4).name + "/new/").content.decode()
    owner_input = re.search(r'<input[^>]*name="owner"[^>]*>', html).group(0)
    assert 'type="text"' in owner_input and f'value="{operator.username}"' in owner_input
    # A user name typed, not every user of the site drawn as an option.
    assert "<select name=\"owner\"" not in html and viewer.username not in html
    assert 'type="datetime-local"' in html


def test_an_owner_who_is_not_an_active_user_is_refused_at_its_field(operator_client, viewer):
    make_node("alpha", 4)
    viewer.is_active = False
    viewer.save()
    for name in (viewer.username, "nobody-here"):
        response = operator_client.post("/claims/nodes/alpha/new/",
                                        {"name": "train", "mode": "count", "count": "1", "owner": name})
        assert "No active user has that user name." in response.content.decode()
    assert not Claim.objects.exists()


@pytest.mark.parametrize("contact", ["ops\u202etxt", "line\nbreak"])
def test_an_unreadable_contact_is_refused_at_its_field_and_nothing_is_saved(operator_client, contact):
    make_node("alpha", 4)
    response = operator_client.post(
        "/claims/nodes/alpha/new/", {"name": "train", "mode": "count", "count": "1", "contact": contact}
    )
    assert field_errors(response.content.decode(), "contact") == [
        "The contact may not hold control or text-direction characters."
    ]
    assert not Claim.objects.exists()


def test_an_end_already_past_is_refused(operator_client):
    make_node("alpha", 4)
    response = operator_client.post(
        "/claims/nodes/alpha/new/",
        {"name": "train", "mode": "count", "count": "1", "ends_at": "2001-01-01T00:00"},
    )
    assert field_errors(response.content.decode(), "ends_at") == [
        "The end is already past; leave it empty for a claim with no end."
    ]
    assert not Claim.objects.exists()


def test_an_ended_claim_can_be_edited_keeping_its_window(operator_client, operator):
    old = past(make_node("alpha", 4), "train", operator)
    edit = operator_client.get(f"/claims/{old.pk}/edit/").content.decode()
    start = re.search(r'name="starts_at" value="([^"]+)"', edit).group(1)
    end = re.search(r'name="ends_at" value="([^"]+)"', edit).group(1)
    response = operator_client.post(
        f"/claims/{old.pk}/edit/",
        {"name": "train", "mode": "count", "count": "2", "owner": operator.username, "starts_at": start,
         "ends_at": end, "updated_at": old.updated_at.isoformat()},
    )
    # The form shows the window to the minute; sent back unchanged, it is kept.
    assert response.status_code == 302
    saved = Claim.objects.get(pk=old.pk)
    assert (saved.count, saved.ended) == (2, True)
    assert saved.ends_at.replace(second=0, microsecond=0) == old.ends_at.replace(second=0, microsecond=0)


@pytest.mark.parametrize(
    "delta, text",
    [(timedelta(hours=3, minutes=5), "3 h left"), (timedelta(days=-2, hours=-1), "ended 2 d ago"),
     (timedelta(minutes=12, seconds=3), "12 min left"), (timedelta(seconds=-30), "ended 30 s ago")],
)
def test_time_left_in_words(delta, text):
    now = timezone.now()
    assert time_left(Claim(starts_at=now - timedelta(days=3), ends_at=now + delta), now) == text


def test_time_left_of_a_claim_that_never_ends_is_empty_and_of_a_booking_when_it_starts():
    now = timezone.now()
    assert time_left(Claim(starts_at=now), now) == ""
    assert time_left(Claim(starts_at=now + timedelta(days=2, hours=1)), now) == "starts in 2 d"


def test_the_list_shows_time_left_and_flags_ended_claims(viewer_client, operator):
    node = make_node("alpha", 4)
    past(node, "old", operator, hours=50)
    ending(node, "new", operator, timezone.now() + timedelta(hours=3, minutes=30))
    html = viewer_client.get("/claims/").content.decode()
    rows = {name: row for row in re.findall(r"<tr.*?</tr>", html, re.S) for name in re.findall(r'<th scope="row">(\w+)</th>', row)}
    assert "ended 2 d ago" in rows["old"] and "claims-ended" in rows["old"]
    assert "3 h left" in rows["new"] and "claims-ended" not in rows["new"]


def test_the_node_page_flags_ended_claims(viewer_client, operator):
    node = make_node("alpha", 4)
    past(node, "old", operator)
    html = viewer_client.get("/nodes/alpha/").content.decode()
    row = re.search(r'<tr id="claim-\d+".*?</tr>', html, re.S).group(0)
    assert "claims-ended" in row


def test_the_list_filters_by_owner_and_by_state(viewer_client, operator, viewer, lab):
    lab.memberships.create(user=viewer)  # who books "new" for the team
    node = make_node("alpha", 4)
    past(node, "old", operator)
    ending(node, "new", viewer, timezone.now() + timedelta(hours=3))
    claim(node, "forever", operator, count=1)

    def listed(**params) -> set[str]:
        html = viewer_client.get("/claims/", params).content.decode()
        return set(re.findall(r'<th scope="row">(\w+)</th>', html))

    assert listed(owner="otto") == {"old", "forever"}
    assert listed(owner="vera") == {"new"}
    assert listed(state="ended") == {"old"}
    assert listed(state="now") == {"new", "forever"}
    assert listed(owner="otto", state="now") == {"forever"}
    assert listed(owner="nobody") == set()


def test_a_bad_state_value_lists_nothing_and_says_so(viewer_client, operator):
    claim(make_node("alpha", 4), "train", operator, count=1)
    html = viewer_client.get("/claims/", {"state": "maybe"}).content.decode()
    assert "0 claims" in html
    assert "Select a valid choice" in html


def test_the_beat_leaves_ended_claims_alone_unless_enabled(settings, operator):
    settings.GPUFLEET_RELEASE_EXPIRED = False
    past(make_node("alpha", 4), "old", operator)
    assert tasks.release_expired() == []
    assert Claim.objects.filter(name="old").exists()


def test_the_beat_releases_ended_claims_through_the_delete_path(settings, operator):
    settings.GPUFLEET_RELEASE_EXPIRED = True
    node = make_node("alpha", 4)
    past(node, "old", operator)
    ending(node, "new", operator, timezone.now() + timedelta(hours=1))
    claim(node, "forever", operator, count=1)
    assert tasks.release_expired() == ["old on alpha"]
    assert set(Claim.objects.values_list("name", flat=True)) == {"new", "forever"}
    assert Node.objects.get(pk=node.pk).gpus_reserved == 2
    entry = AuditEntry.objects.get(action="claim.delete")
    # No user: the audit log shows it as "system".
    assert (entry.user, entry.username, entry.target, str(entry).split()[2]) == (None, "", "old", "system")


def test_a_claim_given_a_new_end_meanwhile_is_not_released(settings, operator):
    settings.GPUFLEET_RELEASE_EXPIRED = True
    old = past(make_node("alpha", 4), "old", operator)
    assert services.release_expired(now=old.ends_at - timedelta(minutes=1)) == []
    assert Claim.objects.filter(name="old").exists()


def test_the_task_is_on_the_central_beat_and_a_queue_a_worker_reads(settings):
    from django.conf import settings as live

    entry = next(e for e in live.CELERY_BEAT_SCHEDULE.values() if e["task"] == "gpufleet.claims.tasks.release_expired")
    assert entry["schedule"] > 0
    # Read by the central beat's own worker (tests/core/test_deploy_units.py).
    assert live.CELERY_TASK_ROUTES["gpufleet.claims.tasks.*"] == {"queue": "housekeeping"}
