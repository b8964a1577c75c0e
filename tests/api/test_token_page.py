"""The "API tokens" page: a user creates a token (its secret shown once, stored only as
a digest; the POST redirects, so a reload makes nothing twice) and revokes it after a
confirmation; only their own; every action audited."""

from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import AuditEntry

pytestmark = pytest.mark.django_db

URL = "/tokens/"


def _create(client, name="ci", scope="read"):
    return client.post(URL, {"name": name, "scope": scope})


def _created_secret(client, name="ci", scope="read") -> str:
    response = _create(client, name, scope)
    assert response.status_code == 302 and response["Location"] == URL
    return client.get(URL).context["secret"]


def test_it_shows_a_new_token_once_and_stores_only_its_digest(viewer_client, viewer):
    response = _create(viewer_client, "nightly report", "read_write")
    assert response.status_code == 302 and response["Location"] == URL  # redirect after POST
    assert "gpf_" not in response.content.decode()
    response = viewer_client.get(URL)
    secret = response.context["secret"]
    assert secret.startswith("gpf_") and len(secret) > 40
    assert secret in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.scope) == (viewer, "nightly report", "read_write")
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    stored = [str(value) for value in ApiToken.objects.values().get().values()]
    assert secret not in stored
    again = viewer_client.get(URL).content.decode()
    assert "nightly report" in again and token.hint in again
    assert secret not in again


def test_it_audits_creating_a_token_without_the_secret(viewer_client, viewer):
    secret = _created_secret(viewer_client, "ci")
    # The page's visits issue the user's calendar feed too (tests/api/test_calendar_feeds.py).
    entry = AuditEntry.objects.get(action="token.create")
    assert (entry.user, entry.action, entry.target, entry.before) == (viewer, "token.create", "ci", None)
    assert entry.after == {"name": "ci", "scope": "read", "hint": secret[:10]}
    assert secret not in str(entry.after)


def test_it_rerenders_an_invalid_form_with_its_errors(viewer_client):
    response = _create(viewer_client, "", "everything")
    assert response.status_code == 200
    assert response.context["form"].errors.keys() == {"name", "scope"}
    assert response.context["secret"] is None
    assert not ApiToken.objects.exists() and not AuditEntry.objects.filter(action__startswith="token.").exists()


def test_it_keeps_the_csrf_check_on_the_page(viewer):
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    assert _create(client).status_code == 403
    page = client.get(URL)
    response = client.post(URL, {"name": "ci", "scope": "read", "csrfmiddlewaretoken": page.context["csrf_token"]})
    assert response.status_code == 302 and ApiToken.objects.count() == 1


def test_a_reload_after_creating_makes_no_second_token(viewer_client, viewer):
    secret = _created_secret(viewer_client, "nightly")
    again = viewer_client.get(URL)  # the reload: a GET, since the POST redirected
    assert again.status_code == 200 and again.context["secret"] is None and secret not in again.content.decode()
    assert ApiToken.objects.filter(user=viewer).count() == 1


def test_it_refuses_a_second_live_token_of_the_same_name(viewer_client, viewer, operator):
    ApiToken.issue(viewer, "nightly", "read")
    ApiToken.issue(operator, "deploy", "read")  # another user's name is no clash
    response = _create(viewer_client, "nightly", "read_write")  # a resubmitted form, say
    assert response.status_code == 200
    assert response.context["form"].errors == {
        "name": ["You already have a token named “nightly”: revoke it first, or pick another name."]
    }
    assert "You already have a token named" in response.content.decode()
    assert ApiToken.objects.filter(user=viewer).count() == 1
    assert _create(viewer_client, "deploy").status_code == 302


def test_a_revoked_tokens_name_may_be_used_again(viewer_client, viewer):
    old, _ = ApiToken.issue(viewer, "nightly", "read")
    old.revoke(viewer)
    assert _create(viewer_client, "nightly").status_code == 302
    assert ApiToken.objects.filter(user=viewer, name="nightly").count() == 2


def test_revoking_asks_for_a_confirmation_first(viewer_client, viewer):
    token, _ = ApiToken.issue(viewer, "old script", "read")
    listing = viewer_client.get(URL).content.decode()
    # The list only leads to the confirmation: no form there revokes at once.
    assert f'href="/tokens/{token.pk}/revoke/"' in listing
    assert f'action="/tokens/{token.pk}/revoke/"' not in listing
    page = viewer_client.get(f"/tokens/{token.pk}/revoke/")
    html = page.content.decode()
    assert page.status_code == 200 and "Revoke token old script?" in html
    assert f'<form method="post" action="/tokens/{token.pk}/revoke/"' in html
    assert '<input type="hidden" name="confirm" value="yes">' in html and f'href="{URL}"' in html
    assert "<script>" not in html and " style=" not in html  # works without inline code (CSP)
    assert viewer_client.post(f"/tokens/{token.pk}/revoke/").status_code == 200  # unconfirmed: asks again
    token.refresh_from_db()
    assert token.revoked_at is None and not AuditEntry.objects.filter(action="token.revoke").exists()


def test_it_revokes_a_token_and_audits_it(viewer_client, viewer):
    token, _ = ApiToken.issue(viewer, "old script", "read")
    response = viewer_client.post(f"/tokens/{token.pk}/revoke/", {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == URL
    token.refresh_from_db()
    assert token.revoked_at is not None
    entry = AuditEntry.objects.get(action="token.revoke")
    assert (entry.user, entry.target, entry.before, entry.after) == (
        viewer,
        "old script",
        {"name": "old script", "scope": "read", "hint": token.hint},
        None,
    )
    page = viewer_client.get(URL)
    assert "Token old script revoked" in page.content.decode()
    assert list(page.context["tokens"]) == []
    assert viewer_client.post(f"/tokens/{token.pk}/revoke/", {"confirm": "yes"}).status_code == 404
    assert viewer_client.get(f"/tokens/{token.pk}/revoke/").status_code == 404


def test_it_lists_and_revokes_only_the_users_own_tokens(viewer_client, operator):
    theirs, _ = ApiToken.issue(operator, "otto's deploy", "read_write")
    assert "otto&#x27;s deploy" not in viewer_client.get(URL).content.decode()
    assert viewer_client.post(f"/tokens/{theirs.pk}/revoke/", {"confirm": "yes"}).status_code == 404
    assert viewer_client.get(f"/tokens/{theirs.pk}/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert not AuditEntry.objects.filter(action="token.revoke").exists()


def test_it_revokes_by_post_only(viewer_client, viewer):
    token, _ = ApiToken.issue(viewer, "ci", "read")
    assert viewer_client.get(f"/tokens/{token.pk}/revoke/?confirm=yes").status_code == 200
    assert viewer_client.put(f"/tokens/{token.pk}/revoke/").status_code == 405
    token.refresh_from_db()
    assert token.revoked_at is None


def test_it_sends_anonymous_visitors_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_it_is_linked_from_the_navigation(viewer_client):
    page = viewer_client.get(URL).content.decode()
    assert '<a href="/tokens/" aria-current="page">API tokens</a>' in page
