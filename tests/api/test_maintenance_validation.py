"""Validation after maintenance through the API, as the node page's form has it: the PUT of
a node's maintenance takes the form's "afterwards" choice (`validate`: 1 or 2), the GET
says whether the node is in validation, and the admin role ends it without a run at
`/maintenance/validation/` (docs/api.md, docs/diagnostics.md)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.audit.models import AuditEntry
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Maintenance, Validation
from tests.api.test_token_auth import bearer
from tests.claims.helpers import make_node

pytestmark = pytest.mark.django_db

URL = "/api/nodes/alpha/maintenance/"
VALIDATION_URL = "/api/nodes/alpha/maintenance/validation/"


@pytest.fixture
def alpha():
    return make_node("alpha", 4)


def _put(client, validate=None, reason="swap a GPU", hours=2):
    body = {"until": (timezone.now() + timedelta(hours=hours)).isoformat(), "reason": reason}
    if validate is not None:
        body["validate"] = validate
    return client.put(URL, json.dumps(body), content_type="application/json")


def test_it_puts_the_node_in_validation_for_after_the_maintenance(operator_client, viewer_client, alpha):
    response = _put(operator_client, validate=2)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["in_maintenance"] is True and body["in_validation"] is True
    row = Validation.objects.get(node=alpha)
    assert body["validation"] == {"level": 2, "since": row.since.isoformat(), "reason": "after maintenance: swap a GPU",
                                  "author": "otto"}
    actions = list(AuditEntry.objects.filter(node_name="alpha").order_by("id").values_list("action", "username"))
    assert actions == [("maintenance.start", "otto"), ("validation.start", "otto")]
    assert viewer_client.get(URL).json() == response.json()


def test_without_validate_the_node_is_back_in_service_afterwards(operator_client, viewer_client, alpha):
    assert _put(operator_client).status_code == 200
    body = viewer_client.get(URL).json()
    assert body["in_validation"] is False and body["validation"] is None
    assert not Validation.objects.exists()


def test_it_refuses_a_level_dcgm_is_not_run_at_and_writes_nothing(operator_client, alpha):
    for level in (0, 3, "two"):
        response = _put(operator_client, validate=level)
        assert response.status_code == 422, (level, response.content)
        assert response.json()["error"]["code"] == "invalid"
    assert _put(operator_client, validate="two").json()["error"]["field"] == "validate"
    # A misspelt choice is refused, not read as "back in service".
    body = {"until": (timezone.now() + timedelta(hours=1)).isoformat(), "reason": "x", "validation": 1}
    misspelt = operator_client.put(URL, json.dumps(body), content_type="application/json")
    assert misspelt.status_code == 422 and misspelt.json()["error"]["field"] == "validation"
    assert _put(operator_client, validate=3).json()["error"] == {
        "code": "invalid", "message": "A validating diagnostic is of level 1 or 2."}
    assert not Maintenance.objects.exists() and not Validation.objects.exists() and not AuditEntry.objects.exists()


def test_a_node_in_validation_refuses_a_claim_once_its_maintenance_ended(operator_client, viewer_client, alpha):
    assert _put(operator_client, validate=1).status_code == 200
    assert operator_client.delete(URL).status_code == 204
    body = viewer_client.get(URL).json()
    assert body["in_maintenance"] is False and body["in_validation"] is True and body["validation"]["level"] == 1
    refused = operator_client.post("/api/nodes/alpha/claims/", {"name": "train", "count": 1},
                                   content_type="application/json")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "validation"
    assert "until a DCGM diagnostic -r 1 passes" in refused.json()["error"]["message"]


def test_only_the_admin_role_ends_validation_and_it_is_audited(viewer_client, operator_client, admin_role_client,
                                                                admin_user, alpha):
    maintenance.start_validation(alpha, 2, "new GPU", admin_user)
    for client in (viewer_client, operator_client):
        refused = client.delete(VALIDATION_URL)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert operator_client.delete(VALIDATION_URL).json()["error"]["message"] == \
        "your role may not end a node's validation without a run"
    assert Validation.objects.filter(node=alpha).exists()
    assert admin_role_client.delete(VALIDATION_URL).status_code == 204
    assert not Validation.objects.exists()
    end = AuditEntry.objects.get(action="validation.end")
    assert (end.username, end.node_name, end.after) == ("ada", "alpha", {"why": "ended by hand"})
    again = admin_role_client.delete(VALIDATION_URL)
    assert again.status_code == 409
    assert again.json()["error"] == {"code": "not_in_validation", "message": "Node alpha is not in validation."}
    claimed = operator_client.post("/api/nodes/alpha/claims/", {"name": "train", "count": 1},
                                   content_type="application/json")
    assert claimed.status_code == 201


def test_a_read_token_reads_validation_but_never_sets_or_ends_it(admin_user, alpha):
    maintenance.start_validation(alpha, 1, "new GPU", admin_user)
    reader = bearer(admin_user, "read")
    assert reader.get(URL).json()["in_validation"] is True
    for response in (_put(reader, validate=2), reader.delete(VALIDATION_URL)):
        assert response.status_code == 403
        assert response.json()["error"] == {"code": "forbidden", "message": "this API token may only read"}
    assert Validation.objects.get(node=alpha).level == 1 and not Maintenance.objects.exists()
    # The admin's read-write token may.
    assert bearer(admin_user).delete(VALIDATION_URL).status_code == 204
    assert AuditEntry.objects.filter(action="validation.end", username="ada").exists()


def test_an_unknown_node_is_404(viewer_client, operator_client, admin_role_client, alpha):
    for response in (viewer_client.get("/api/nodes/nobody/maintenance/"),
                     operator_client.put("/api/nodes/nobody/maintenance/",
                                         json.dumps({"until": "2999-01-01T00:00:00Z", "reason": "x", "validate": 1}),
                                         content_type="application/json"),
                     admin_role_client.delete("/api/nodes/nobody/maintenance/validation/")):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert not Validation.objects.exists()
