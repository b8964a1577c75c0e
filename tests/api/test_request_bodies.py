"""A write whose body is not JSON (a form post, multipart or urlencoded) gets the API's
JSON error, 415 naming the media type it takes, never Django's HTML 500; nothing is saved."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.test.client import encode_multipart

from gpufleet.claims.models import Claim
from tests.api.test_token_auth import bearer
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(operator):
    """A logged-in operator with CSRF checks on, and the token a script sends back."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    client.get("/api/nodes/")
    return client, client.cookies["csrftoken"].value


def _multipart(data: dict) -> tuple[bytes, str]:
    boundary = "fuzzboundary"
    return encode_multipart(boundary, data), f"multipart/form-data; boundary={boundary}"


def _assert_unsupported(response):
    assert response.status_code == 415
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "application/json" in response.json()["error"]["message"]


def test_a_multipart_claim_is_refused_in_json(session):
    client, token = session
    make_node("alpha", 2)
    body, content_type = _multipart({"name": "train", "count": "1", "csrfmiddlewaretoken": token})
    _assert_unsupported(client.post("/api/nodes/alpha/claims/", body, content_type=content_type))
    assert not Claim.objects.exists()


def test_a_multipart_claim_with_the_csrf_header_is_refused_in_json(session):
    client, token = session
    make_node("alpha", 2)
    body, content_type = _multipart({"name": "train", "count": "1"})
    _assert_unsupported(client.post("/api/nodes/alpha/claims/", body, content_type=content_type, HTTP_X_CSRFTOKEN=token))
    assert not Claim.objects.exists()


def test_a_form_encoded_replacement_is_refused_in_json(session):
    client, token = session
    train = claim(make_node("alpha", 2), "train", count=1)
    response = client.put(
        f"/api/claims/{train.pk}/",
        "name=train&count=2",
        content_type="application/x-www-form-urlencoded",
        HTTP_X_CSRFTOKEN=token,
    )
    _assert_unsupported(response)
    assert Claim.objects.get(pk=train.pk).count == 1


def test_json_with_a_charset_is_still_json(session):
    client, token = session
    make_node("alpha", 2)
    response = client.post(
        "/api/nodes/alpha/claims/",
        '{"name": "train", "count": 1}',
        content_type="application/json; charset=utf-8",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 201


def test_a_token_caller_gets_the_same_answer_for_a_form_post(operator):
    make_node("alpha", 2)
    client = bearer(operator)
    body, content_type = _multipart({"name": "train", "count": "1"})
    _assert_unsupported(client.post("/api/nodes/alpha/claims/", body, content_type=content_type))
    _assert_unsupported(client.post("/api/nodes/alpha/claims/", "name=train&count=1", content_type="application/x-www-form-urlencoded"))
    assert not Claim.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"name": "train", "count": 1, "owner": "a\x00b"},
        {"name": "train", "device_ids": ["GPU-\x00"]},
        {"name": "train", "count": 1, "a\x00b": 1},
    ],
)
def test_a_nul_anywhere_in_a_json_body_is_a_bad_request(session, body):
    client, token = session
    make_node("alpha", 2)
    response = client.post("/api/nodes/alpha/claims/", json.dumps(body), content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "bad_request", "message": "the request body holds a NUL character"}
    assert not Claim.objects.exists()
