"""A JSON webhook gets a body a machine can route on (docs/alerts.md): firing, then
resolved once the event closes, its events with node, GPU and code, beside apprise's own
title, message and type. Sent to a real receiver on loopback (tests/receivers.py)."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest

from gpufleet.alerts.models import Delivery, Status
from gpufleet.events.models import Event
from gpufleet.fleet.models import Node
from tests.alerts.conftest import T0, gpu3, tick
from tests.receivers import WEBHOOK_PASSWORD, WEBHOOK_TOKEN

pytestmark = pytest.mark.django_db


def test_the_json_webhook_gets_firing_then_resolved_with_its_events(alert_settings, rule, webhook):
    node = Node.objects.create(name="gpu-a01")
    gpu3(node, T0)
    tick(T0 + timedelta(minutes=5))
    event = Event.objects.get()
    fired = webhook.posts[0]
    link = "https://fleet.example.com/events/?node=gpu-a01&kind=finding&severity=fail&state=open"
    assert fired["version"] == "1" and fired["status"] == "firing"
    assert fired["severity"] == "fail" and fired["kind"] == "finding"
    assert fired["group_key"] == f"rule-{rule.pk}/finding"
    assert fired["labels"] == {} and fired["url"].startswith(link)
    assert fired["events"] == [{
        "id": event.pk, "node": "gpu-a01", "gpu_index": 3, "pci_bus_id": "", "code": "gpu3.xid",
        "message": "GPU 3 fell off the bus (Xid 79)", "opened_at": "2026-03-02T03:00:00+00:00",
        "closed_at": None, "url": fired["events"][0]["url"]}]
    assert fired["events"][0]["url"].startswith(link)
    # apprise's own keys stay, for the receivers that read them today.
    assert fired["title"] == "gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)" and fired["type"] == "failure"
    assert "GPU 3 fell off the bus" in fired["message"]
    # The URL's path and its user and password (basic auth) are honoured.
    assert fired["path"] == f"/hooks/{WEBHOOK_TOKEN}"
    assert fired["authorization"] == "Basic " + base64.b64encode(f"ops:{WEBHOOK_PASSWORD}".encode()).decode()

    gpu3(node, T0 + timedelta(hours=1), failing=False)
    tick(T0 + timedelta(hours=1))
    resolved = webhook.posts[1]
    assert resolved["status"] == "resolved" and resolved["type"] == "success"
    assert resolved["group_key"] == fired["group_key"]
    assert resolved["events"][0]["id"] == event.pk
    assert resolved["events"][0]["closed_at"] == "2026-03-02T04:00:00+00:00"
    assert "state=closed" in resolved["url"]


def test_headers_and_query_arguments_of_the_url_are_sent(alert_settings, rule, webhook):
    hook = rule.channels.get(name="hook")
    hook.url = f"{webhook.url}?+X-Team=gpu-ops&-source=fleet"
    hook.save()
    gpu3(Node.objects.create(name="gpu-a01"), T0)
    tick(T0 + timedelta(minutes=5))
    assert webhook.posts[0]["x-team"] == "gpu-ops"
    assert webhook.posts[0]["path"] == f"/hooks/{WEBHOOK_TOKEN}?source=fleet"


def test_a_form_webhook_gets_the_same_fields(alert_settings, rule, webhook):
    hook = rule.channels.get(name="hook")
    hook.url = webhook.url.replace("json://", "form://")
    hook.save()
    gpu3(Node.objects.create(name="gpu-a01"), T0)
    tick(T0 + timedelta(minutes=5))
    form = webhook.posts[0]
    assert form["status"] == "firing" and form["type"] == "failure" and form["kind"] == "finding"
    assert form["events"][0]["node"] == "gpu-a01" and form["labels"] == {}


def test_a_failed_post_keeps_the_secrets_out_of_its_error(alert_settings, rule, webhook):
    webhook.status = 503
    gpu3(Node.objects.create(name="gpu-a01"), T0)
    tick(T0 + timedelta(minutes=5))
    delivery = Delivery.objects.get(channel__name="hook")
    assert delivery.status == Status.PENDING and "503" in delivery.error
    assert WEBHOOK_TOKEN not in delivery.error and WEBHOOK_PASSWORD not in delivery.error


def test_a_private_destination_is_refused_when_private_ones_are_off(alert_settings, rule, webhook):
    alert_settings.GPUFLEET_ALERT_ALLOW_PRIVATE = False
    alert_settings.GPUFLEET_ALERT_ALLOW_HOSTS = []
    gpu3(Node.objects.create(name="gpu-a01"), T0)
    tick(T0 + timedelta(minutes=5))
    assert webhook.posts == []
    delivery = Delivery.objects.get(channel__name="hook")
    assert "GPUFLEET_ALERT_ALLOW_PRIVATE" in delivery.error and "loopback" in delivery.error
