"""The silences page as a person reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import time_machine
from django.utils import timezone

from gpufleet.alerts.models import Silence


def test_a_two_hour_silence_reads_two_hours_from_now(admin_role_client):
    now = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)
    with time_machine.travel(now, tick=False):
        # The form takes minutes: made now, from 10:00 to 12:00, it has 1 h 59 min 30 s left.
        start = timezone.localtime().replace(second=0)
        response = admin_role_client.post("/alerts/silences/", {
            "nodes": "rack4-*", "starts_at": start.strftime("%Y-%m-%dT%H:%M"),
            "ends_at": (start + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"), "reason": "PDU swap"})
        assert response.status_code == 302 and Silence.objects.get().is_active()
        page = admin_role_client.get("/alerts/silences/").content.decode()
    assert "2 hours from now" in page and "an hour from now" not in page
