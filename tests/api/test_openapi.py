"""The OpenAPI schema (/api/openapi.json) and its docs page (/api/docs): behind the same
login as the API, and the page loads nothing from another host (fleets are air-gapped).
The schema documents every answer each operation gives, and the answers keep to it."""

from __future__ import annotations

import re
from datetime import timedelta

import django_filters
import pytest
from django.test import Client
from django.utils import timezone

from gpufleet.api.models import ApiToken
from gpufleet.claims.filters import ClaimFilter
from gpufleet.fleet import maintenance
from gpufleet.fleet.filters import NodeFilter
from tests.claims.helpers import claim, make_node, shrink_node
from tests.factories import ingest

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
    "/api/availability/": {"get"},
    "/api/events/": {"get"},
    "/api/channels/": {"get", "post"},
    "/api/channels/{pk}/": {"get", "put", "delete"},
    "/api/channels/{pk}/test": {"post"},
    "/api/rules/": {"get", "post"},
    "/api/rules/{pk}/": {"get", "put", "delete"},
    "/api/silences/": {"get", "post"},
    "/api/silences/{pk}/": {"get", "delete"},
    "/api/nodes/{name}/maintenance/": {"get", "put", "delete"},
    "/api/nodes/{name}/maintenance/validation/": {"delete"},
    "/api/deliveries/": {"get"},
    "/api/usage/": {"get"},
    "/api/calendar/": {"get"},
    "/api/teams/": {"get", "post"},
    "/api/teams/{name}/": {"get", "patch", "delete"},
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
        "name", "count", "device_ids", "owner", "team", "contact", "starts_at", "ends_at", "repeat",
        "quota_override_reason",
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


# What each operation can answer: every one needs a login (401) and a role (403); a
# list refuses a bad filter or page (400) and a page past the end (404); a write can
# also meet unreadable JSON (400), another media type (415), an invalid body (422), a
# conflict with the ledger or a newer version (409), and a missing version (428).
ANSWERS = {
    ("/api/nodes/", "get"): {200, 400, 401, 403, 404},
    ("/api/nodes/{name}/", "get"): {200, 401, 403, 404},
    ("/api/nodes/{name}/devices/", "get"): {200, 401, 403, 404},
    ("/api/nodes/{name}/findings/", "get"): {200, 401, 403, 404},
    ("/api/nodes/{name}/claims/", "get"): {200, 401, 403, 404},
    ("/api/nodes/{name}/claims/", "post"): {201, 400, 401, 403, 404, 409, 415, 422},
    ("/api/claims/", "get"): {200, 400, 401, 403, 404},
    ("/api/claims/{pk}/", "get"): {200, 401, 403, 404},
    ("/api/claims/{pk}/", "put"): {200, 400, 401, 403, 404, 409, 415, 422, 428},
    ("/api/claims/{pk}/", "delete"): {204, 401, 403, 404, 409, 428},
    ("/api/placement", "get"): {200, 400, 401, 403},
    ("/api/availability/", "get"): {200, 400, 401, 403},
    ("/api/events/", "get"): {200, 400, 401, 403, 404},
    # Alerts (gpufleet/api/alerts.py): writes need no version, so never 409 or 428.
    ("/api/channels/", "get"): {200, 400, 401, 403, 404},
    ("/api/channels/", "post"): {201, 400, 401, 403, 415, 422},
    ("/api/channels/{pk}/", "get"): {200, 401, 403, 404},
    ("/api/channels/{pk}/", "put"): {200, 400, 401, 403, 404, 415, 422},
    ("/api/channels/{pk}/", "delete"): {204, 401, 403, 404},
    ("/api/channels/{pk}/test", "post"): {200, 401, 403, 404},
    ("/api/rules/", "get"): {200, 400, 401, 403, 404},
    ("/api/rules/", "post"): {201, 400, 401, 403, 415, 422},
    ("/api/rules/{pk}/", "get"): {200, 401, 403, 404},
    ("/api/rules/{pk}/", "put"): {200, 400, 401, 403, 404, 415, 422},
    ("/api/rules/{pk}/", "delete"): {204, 401, 403, 404},
    ("/api/silences/", "get"): {200, 400, 401, 403, 404},
    ("/api/silences/", "post"): {201, 400, 401, 403, 415, 422},
    ("/api/silences/{pk}/", "get"): {200, 401, 403, 404},
    ("/api/silences/{pk}/", "delete"): {204, 401, 403, 404},
    ("/api/nodes/{name}/maintenance/", "get"): {200, 401, 403, 404},
    ("/api/nodes/{name}/maintenance/", "put"): {200, 400, 401, 403, 404, 415, 422},
    ("/api/nodes/{name}/maintenance/", "delete"): {204, 401, 403, 404, 409},
    ("/api/nodes/{name}/maintenance/validation/", "delete"): {204, 401, 403, 404, 409},
    ("/api/deliveries/", "get"): {200, 400, 401, 403, 404},
    # Usage (gpufleet/api/usage.py): one report, not a list, so no page to be past.
    ("/api/usage/", "get"): {200, 400, 401, 403},
    ("/api/calendar/", "get"): {200, 401, 403},
    # Teams (gpufleet/api/teams.py): members read their own, admins write.
    ("/api/teams/", "get"): {200, 400, 401, 403},
    ("/api/teams/", "post"): {201, 400, 401, 403, 415, 422},
    ("/api/teams/{name}/", "get"): {200, 401, 403, 404},
    ("/api/teams/{name}/", "patch"): {200, 400, 401, 403, 404, 415, 422},
    ("/api/teams/{name}/", "delete"): {204, 401, 403, 404, 409},
}
ERROR = {"$ref": "#/components/schemas/Error"}


def _resolve(schema: dict, components: dict) -> dict:
    while "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _conforms(value, schema: dict, components: dict, where: str = "body") -> None:
    """`value` has the documented shape: each object exactly the documented keys (the
    required ones at least), each list's items their schema, each value a documented type."""
    schema = _resolve(schema, components)
    if "anyOf" in schema:
        options = [_resolve(s, components) for s in schema["anyOf"]]
        if value is None:
            assert {"type": "null"} in options, f"{where}: null is not documented"
            return
        # Of several objects (a claim, or a repeating booking's series), the one whose required keys it has.
        schema = next(s for s in options if s != {"type": "null"}
                      and (not isinstance(value, dict) or set(s.get("required", ())) <= set(value)))
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}
    if "type" in schema:
        assert isinstance(value, types[schema["type"]]), f"{where}: {value!r} is no {schema['type']}"
    if isinstance(value, dict) and "properties" in schema:
        assert set(schema.get("required", ())) <= set(value), f"{where}: lacks {set(schema['required']) - set(value)}"
        assert set(value) <= set(schema["properties"]), f"{where}: undocumented {set(value) - set(schema['properties'])}"
        for key, item in value.items():
            _conforms(item, schema["properties"][key], components, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _conforms(item, schema["items"], components, f"{where}[{i}]")


def test_every_operation_documents_a_schema_for_each_answer_it_gives(viewer_client):
    schema = viewer_client.get("/api/openapi.json").json()
    components = schema["components"]["schemas"]
    operations = {(path, method): op for path, ops in schema["paths"].items() for method, op in ops.items()}
    assert set(operations) == set(ANSWERS)
    for key, op in operations.items():
        responses = op["responses"]
        assert {int(status) for status in responses} == ANSWERS[key], key
        for status, response in responses.items():
            if status == "204":
                assert "content" not in response, key
                continue
            body = response["content"]["application/json"]["schema"]
            if int(status) >= 400:
                assert body == ERROR, (key, status)
            else:
                body = _resolve(body, components)
                options = [_resolve(s, components) for s in body.get("anyOf", [body])]
                assert all(option.get("properties") for option in options), (key, status)


def test_the_answers_have_the_documented_shapes(client, viewer_client, operator_client, operator):
    """Each endpoint's real answer, errors included, holds exactly the keys its schema
    documents: the schema cannot drift from what the API sends."""
    alpha = make_node("alpha", 4)
    train = claim(alpha, "train", operator, device_ids=["2"])
    delta = make_node("delta", 1)
    maintenance.start(delta, timezone.now() + timedelta(hours=1), "swap a GPU", operator, validate_level=2)
    make_node("beta", 0)
    shrink_node(ingest("gamma", 2), 1)
    schema = viewer_client.get("/api/openapi.json").json()
    components = schema["components"]["schemas"]

    def check(response, path: str, method: str) -> None:
        documented = schema["paths"][path][method]["responses"][str(response.status_code)]
        _conforms(response.json(), documented["content"]["application/json"]["schema"], components)

    for url, path in [
        ("/api/nodes/", "/api/nodes/"),
        ("/api/nodes/?health=purple", "/api/nodes/"),
        ("/api/nodes/?page=9", "/api/nodes/"),
        ("/api/nodes/alpha/", "/api/nodes/{name}/"),
        ("/api/nodes/gamma/devices/", "/api/nodes/{name}/devices/"),
        ("/api/nodes/beta/findings/", "/api/nodes/{name}/findings/"),
        ("/api/nodes/alpha/claims/", "/api/nodes/{name}/claims/"),
        ("/api/nodes/nope/", "/api/nodes/{name}/"),
        ("/api/claims/", "/api/claims/"),
        (f"/api/claims/{train.pk}/", "/api/claims/{pk}/"),
        ("/api/placement?count=2", "/api/placement"),
        ("/api/placement?count=x", "/api/placement"),
        ("/api/availability/?count=2", "/api/availability/"),
        ("/api/availability/?after=tuesday", "/api/availability/"),
        ("/api/events/", "/api/events/"),
        ("/api/events/?state=ajar", "/api/events/"),
        ("/api/usage/?by=claim", "/api/usage/"),
        ("/api/usage/?by=colour", "/api/usage/"),
        ("/api/calendar/", "/api/calendar/"),
        ("/api/nodes/alpha/maintenance/", "/api/nodes/{name}/maintenance/"),
        ("/api/nodes/delta/maintenance/", "/api/nodes/{name}/maintenance/"),
    ]:
        check(viewer_client.get(url), path, "get")
    body = {"name": "x", "count": 1}
    check(operator_client.post("/api/nodes/alpha/claims/", body, content_type="application/json"), "/api/nodes/{name}/claims/", "post")
    check(operator_client.post("/api/nodes/alpha/claims/", {"count": -1}, content_type="application/json"), "/api/nodes/{name}/claims/", "post")
    check(viewer_client.post("/api/nodes/alpha/claims/", body, content_type="application/json"), "/api/nodes/{name}/claims/", "post")
    check(operator_client.put(f"/api/claims/{train.pk}/", {"name": "t"}, content_type="application/json"), "/api/claims/{pk}/", "put")
    check(operator_client.post("/api/nodes/alpha/claims/", {"name": "y", "count": 9}, content_type="application/json"),
          "/api/nodes/{name}/claims/", "post")
    check(operator_client.post("/api/nodes/alpha/claims/", "name=z", content_type="text/plain"), "/api/nodes/{name}/claims/", "post")
    start = timezone.now() + timedelta(days=1)
    lab = {"name": "lab", "device_ids": ["3"], "starts_at": start.isoformat(), "ends_at": (start + timedelta(hours=8)).isoformat(),
           "repeat": "FREQ=WEEKLY;COUNT=2"}
    for name in ("lab", "lab2"):  # a series made, then one refused for every occurrence
        check(operator_client.post("/api/nodes/alpha/claims/", {**lab, "name": name}, content_type="application/json"),
              "/api/nodes/{name}/claims/", "post")
    check(client.get("/api/claims/"), "/api/claims/", "get")
    check(operator_client.delete("/api/nodes/delta/maintenance/validation/"),
          "/api/nodes/{name}/maintenance/validation/", "delete")


# The node list's page size is the API's own (its paginator), not the overview's `per`.
NOT_IN_API = {"per"}


@pytest.mark.parametrize("path, filters", [("/api/nodes/", NodeFilter), ("/api/claims/", ClaimFilter)])
def test_a_list_documents_its_filter_set_s_filters_as_query_parameters(viewer_client, path, filters):
    schema = viewer_client.get("/api/openapi.json").json()
    params = {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}
    assert all(p["in"] == "query" and not p["required"] for p in params.values())
    assert set(params) - {"page"} == set(filters.base_filters) - NOT_IN_API
    for name in set(params) - {"page"}:
        declared = filters().filters[name]
        documented = params[name]["schema"]
        if isinstance(declared, django_filters.ChoiceFilter):
            assert documented["enum"] == [value for value, _ in declared.extra["choices"]], name
        assert documented["type"] == "string"
        assert params[name]["description"] == str(declared.label), name
