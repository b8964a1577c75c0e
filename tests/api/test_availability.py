"""GET /api/availability/: the earliest windows N GPUs of one node are free, as "find a
slot" gives them, and a window answered is one the claims API then takes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet import gpu
from gpufleet.claims import services
from tests.claims.helpers import NOW, TUESDAY_9, TUESDAY_17, make_node, post_claim, uuid
from tests.factories import gpu_uuid

pytestmark = pytest.mark.django_db


def book(node, name, user, start, end, gpus):
    proposed = gpu.Claim(name=name, device_ids=tuple(uuid(node, i) for i in gpus))
    return services.save_claim(node, proposed, user, terms=services.Terms(owner=user, starts_at=start, ends_at=end))


def test_it_answers_the_earliest_windows_best_first(viewer_client, operator, monday):
    busy = make_node("busy", 2)
    book(busy, "train", operator, None, TUESDAY_9, gpus=(0, 1))
    make_node("roomy", 4)
    response = viewer_client.get("/api/availability/", {"count": "2", "duration_hours": "3", "model": "H200"})
    assert response.status_code == 200
    body = response.json()
    assert {k: v for k, v in body.items() if k != "windows"} == {
        "count": 2, "model": "H200", "min_free_vram_mib": 0, "duration_hours": 3.0, "after": NOW.isoformat()}
    assert body["windows"] == [
        {"node": "roomy", "gpus": [{"index": 0, "uuid": gpu_uuid("roomy", 0)}, {"index": 1, "uuid": gpu_uuid("roomy", 1)}],
         "starts_at": NOW.isoformat(), "ends_at": (NOW + timedelta(hours=3)).isoformat()},
        {"node": "busy", "gpus": [{"index": 0, "uuid": gpu_uuid("busy", 0)}, {"index": 1, "uuid": gpu_uuid("busy", 1)}],
         "starts_at": TUESDAY_9.isoformat(), "ends_at": "2026-12-08T12:00:00+00:00"},
    ]


def test_a_window_after_a_time_is_taken_by_the_claims_api(operator_client, operator, monday):
    node = make_node("alpha", 2)
    book(node, "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
    body = operator_client.get("/api/availability/", {
        "count": "2", "duration_hours": "1.5", "after": "2026-12-08T10:00:00+01:00", "min_free_vram_mib": "100000"}).json()
    assert body["after"] == "2026-12-08T09:00:00+00:00"
    [slot] = body["windows"]
    assert (slot["starts_at"], slot["ends_at"]) == (TUESDAY_17.isoformat(), "2026-12-08T18:30:00+00:00")
    made = post_claim(operator_client, {"name": "eval", "device_ids": [g["uuid"] for g in slot["gpus"]],
                                        "starts_at": slot["starts_at"], "ends_at": slot["ends_at"]})
    assert made.status_code == 201, made.json()


def test_no_window_when_no_node_has_the_gpus(viewer_client, monday):
    make_node("alpha", 2)
    for query in ({"count": "3"}, {"min_free_vram_mib": "200000"}, {"model": "b200"}):
        assert viewer_client.get("/api/availability/", query).json()["windows"] == []


@pytest.mark.parametrize("param, value, says", [
    ("count", "0", "count must be a whole number from 1"),
    ("count", "two", "count must be a whole number from 0"),
    ("min_free_vram_mib", "-1", "min_free_vram_mib must be a whole number from 0"),
    ("duration_hours", "0", "duration_hours must be a number of hours above 0 and at most 720 (GPUFLEET_MAX_RESERVATION_DAYS)"),
    ("duration_hours", "nan", "duration_hours must be a number of hours above 0 and at most 720 (GPUFLEET_MAX_RESERVATION_DAYS)"),
    ("duration_hours", "721", "duration_hours must be a number of hours above 0 and at most 720 (GPUFLEET_MAX_RESERVATION_DAYS)"),
    ("after", "tuesday", "after must be a time as ISO 8601, e.g. 2026-12-08T09:00:00+01:00"),
    ("after", "2026-12-08T09:00:00", "after: give the time with its time zone, e.g. 2026-12-08T09:00:00+01:00"),
])
def test_bad_input_is_a_400_naming_it(viewer_client, param, value, says):
    response = viewer_client.get("/api/availability/", {param: value})
    assert response.status_code == 400
    assert response.json() == {"error": {"code": "bad_parameter", "message": says, "field": param}}


def test_it_needs_a_login_and_a_role(client, outsider):
    assert client.get("/api/availability/").status_code == 401
    client.force_login(outsider)
    assert client.get("/api/availability/").status_code == 403


def test_it_reads_the_fleet_in_a_fixed_number_of_queries(viewer_client, operator, monday):
    counts = []
    for size in (1, 6):
        for i in range(size):
            book(make_node(f"n{size}-{i}", 2), "train", operator, TUESDAY_9, TUESDAY_17, gpus=(0,))
        with CaptureQueriesContext(connection) as queries:
            assert len(viewer_client.get("/api/availability/", {"count": "2"}).json()["windows"]) == 1 + (size == 6) * 6
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_it_is_in_the_openapi_schema(viewer_client):
    schema = viewer_client.get("/api/openapi.json").json()
    operation = schema["paths"]["/api/availability/"]["get"]
    assert [p["name"] for p in operation["parameters"]] == ["count", "model", "min_free_vram_mib", "duration_hours", "after"]
    assert "400" in operation["responses"]
