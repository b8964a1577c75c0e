"""The OpenAPI schema (/api/openapi.json) and its docs page (/api/docs): behind the same
login as the API, and the page loads nothing from another host (fleets are air-gapped)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from gpufleet.api.models import ApiToken

pytestmark = pytest.mark.django_db

ENDPOINTS = {
    "/api/nodes/": {"get"},
    "/api/nodes/{name}/": {"get"},
    "/api/nodes/{name}/devices/": {"get"},
    "/api/nodes/{name}/findings/": {"get"},
    "/api/nodes/{name}/claims/": {"get", "post"},
    "/api/claims/": {"get"},
    "/api/claims/{pk}/": {"get", "put", "delete"},
    "/api/placement": {"get"},
}


def test_it_serves_the_schema_listing_every_endpoint(viewer_client):
    response = viewer_client.get("/api/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert {path: set(ops) for path, ops in schema["paths"].items()} == ENDPOINTS
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))
    assert set(schema["components"]["securitySchemes"]) == {"TokenAuth", "SessionAuth"}
    assert schema["components"]["securitySchemes"]["TokenAuth"] == {"type": "http", "scheme": "bearer"}
    post = schema["paths"]["/api/nodes/{name}/claims/"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ClaimIn"}
    assert set(schema["components"]["schemas"]["ClaimIn"]["properties"]) == {
        "name", "count", "device_ids", "owner", "contact", "expires_at"
    }
    assert "page" in {p["name"] for p in schema["paths"]["/api/nodes/"]["get"]["parameters"]}
    placement = {p["name"] for p in schema["paths"]["/api/placement"]["get"]["parameters"]}
    assert placement == {"count", "model", "min_free_vram_mib"}


def test_it_needs_a_login_for_the_schema_and_the_docs(client, outsider, viewer):
    for url in ["/api/openapi.json", "/api/docs", "/api/"]:
        assert client.get(url).status_code == 401, url
        assert client.get(url).json()["error"]["code"] == "login_required"
    refused = Client()
    refused.force_login(outsider)
    assert refused.get("/api/openapi.json").status_code == 403
    _, secret = ApiToken.issue(viewer, "docs", "read")
    with_token = Client(headers={"authorization": f"Bearer {secret}"})
    assert with_token.get("/api/openapi.json").status_code == 200


def test_it_sends_the_api_root_to_the_docs(viewer_client):
    response = viewer_client.get("/api/")
    assert response.status_code == 302 and response["Location"] == "/api/docs"


def test_the_docs_page_loads_only_our_own_static_files(viewer_client):
    response = viewer_client.get("/api/docs")
    assert response.status_code == 200
    page = response.content.decode()
    assert "swagger-ui" in page
    assert not re.search(r"(https?:)?//[a-z0-9]", page, re.IGNORECASE), "the page names another host"
    assert '"validatorUrl": null' in page  # Swagger UI would otherwise call validator.swagger.io
    assets = re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="([^"]+)"', page)
    assert assets and all(a.startswith("/static/") for a in assets), assets
    for asset in assets:
        assert viewer_client.get(asset).status_code == 200, asset


def test_the_docs_page_hands_swagger_the_csrf_token_for_session_writes(viewer_client):
    page = viewer_client.get("/api/docs").content.decode()
    assert 'data-api-csrf="true"' in page
    assert re.search(r'data-csrf-token="\w{32,}"', page)
