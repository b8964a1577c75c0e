"""The claim editor and quotas: a change over the team's quota is refused above the form;
admins alone get "Over quota, because", and the reason they give shows on the claim."""

from __future__ import annotations

import pytest

from gpufleet.claims.models import Claim
from tests.claims.helpers import HTMX, booked_fixture, field_errors, hidden_version  # noqa: F401 (the booked fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]

FIELD = 'name="quota_override_reason"'


def _post(client, claim: Claim, **extra):
    version = hidden_version(client.get(f"/claims/{claim.pk}/edit/").content.decode())
    data = {"name": "train", "mode": "count", "count": "4", "owner": "otto", "updated_at": version,
            "starts_at": "2026-12-08T09:00", "ends_at": "2026-12-08T17:00", **extra}
    return client.post(f"/claims/{claim.pk}/edit/", data)


def test_only_admins_are_offered_the_over_quota_reason(operator_client, admin_role_client, booked):
    assert FIELD not in operator_client.get("/nodes/alpha/").content.decode()
    assert FIELD not in operator_client.get(f"/claims/{booked.pk}/edit/").content.decode()
    assert FIELD in admin_role_client.get("/nodes/alpha/").content.decode()
    assert "Over quota, because" in admin_role_client.get(f"/claims/{booked.pk}/edit/").content.decode()


def test_a_change_over_quota_is_refused_above_the_form(operator_client, booked):
    response = _post(operator_client, booked)
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "form") == [
        "The booking is over the team's quota of 2 GPUs at once: from Tue 8 Dec 09:00 UTC the team holds 0 and the"
        " booking asks 4 more; an admin may book over the quota, saying why."]
    assert Claim.objects.get(pk=booked.pk).count == 2


def test_a_reason_typed_into_the_post_by_an_operator_is_not_taken(operator_client, booked):
    _post(operator_client, booked, quota_override_reason="please")  # the form has no such field for them
    assert Claim.objects.get(pk=booked.pk).count == 2


def test_an_admins_reason_books_over_quota_and_shows_on_the_claim(admin_role_client, viewer_client, booked):
    response = _post(admin_role_client, booked, quota_override_reason="the <b>deadline</b>")
    assert response.status_code == 302, field_errors(response.content.decode(), "form")
    assert Claim.objects.get(pk=booked.pk).quota_override_reason == "the <b>deadline</b>"
    for page in ("/nodes/alpha/", "/claims/"):
        html = viewer_client.get(page).content.decode()
        assert "over quota: the &lt;b&gt;deadline&lt;/b&gt;" in html
    panel = viewer_client.get("/claims/nodes/alpha/panel/", **HTMX).content.decode()
    assert "over quota: the &lt;b&gt;deadline&lt;/b&gt;" in panel
