"""A login with a username longer than any account's (django-axes keeps the name tried
in a 255-character column, the audit log in 200): the login form again with its error,
never a 500, and the attempts still lock the pair out."""

from __future__ import annotations

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client

from gpufleet.audit.models import AuditEntry

pytestmark = pytest.mark.django_db

LONG = "x" * 300


def test_a_username_too_long_for_any_account_gets_the_form_with_its_error():
    response = Client().post("/accounts/login/", {"username": LONG, "password": "wrong"})
    assert response.status_code == 200
    assert response.context["form"].non_field_errors()
    # What django-axes stores fits its column (and PostgreSQL's refusal is a 500 otherwise).
    [attempt] = AccessAttempt.objects.all()
    assert len(attempt.username) <= get_user_model()._meta.get_field("username").max_length


def test_too_long_usernames_still_lock_the_pair_out(settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post("/accounts/login/", {"username": LONG, "password": "wrong"}).status_code == 200
    assert client.post("/accounts/login/", {"username": LONG, "password": "wrong"}).status_code == 429
    assert client.post("/accounts/login/", {"username": LONG, "password": "wrong"}).status_code == 429
    [entry] = AuditEntry.objects.filter(action="login.lockout")
    assert entry.target == LONG[: len(entry.target)] and len(entry.target) <= 150


def test_a_long_username_locks_out_only_its_own_pair(viewer, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        Client().post("/accounts/login/", {"username": LONG, "password": "wrong"})
    client = Client()
    assert client.post("/accounts/login/", {"username": "vera", "password": "pw-vera"}).status_code == 302
