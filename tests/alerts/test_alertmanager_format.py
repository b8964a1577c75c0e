"""A channel in Alertmanager's webhook format (version 4) posts what Alertmanager would,
so a receiver made for Alertmanager takes gpufleet's notices unchanged: added through
the API with `format`, checked field by field on a real receiver on loopback."""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta

import pytest
from django.test import Client

from gpufleet.alerts.models import Channel, Rule
from gpufleet.api.models import ApiToken
from gpufleet.events.models import Event
from gpufleet.fleet.models import Node
from tests.alerts.conftest import T0, gpu3, tick
from tests.receivers import WEBHOOK_PASSWORD, WEBHOOK_TOKEN

pytestmark = pytest.mark.django_db
JSON = "application/json"
FIRING_ENDS = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing


@pytest.fixture
def admin_api(admin_user):
    _, secret = ApiToken.issue(admin_user, "t", ApiToken.Scope.READ_WRITE)
    return Client(headers={"authorization": f"Bearer {secret}"})


def test_an_alertmanager_channel_posts_version_4_firing_then_resolved(alert_settings, admin_api, webhook):
    added = admin_api.post("/api/channels/", {"name": "am", "url": webhook.url, "format": "alertmanager"},
                           content_type=JSON)
    assert added.status_code == 201 and added.json()["format"] == "alertmanager"
    assert admin_api.get(f"/api/channels/{added.json()['id']}/").json()["format"] == "alertmanager"
    rule = Rule.objects.get(name="Failing or offline")
    rule.channels.set([Channel.objects.get(name="am")])
    node = Node.objects.create(name="gpu-a01")
    gpu3(node, T0)
    tick(T0 + timedelta(minutes=5))
    event = Event.objects.get()

    fired = webhook.posts[0]
    assert fired.pop("path") == f"/hooks/{WEBHOOK_TOKEN}"
    assert fired.pop("authorization") == "Basic " + base64.b64encode(f"ops:{WEBHOOK_PASSWORD}".encode()).decode()
    fired.pop("x-team")
    assert set(fired) == {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
                          "commonLabels", "commonAnnotations", "externalURL", "alerts"}
    assert fired["version"] == "4" and fired["status"] == "firing" and fired["receiver"] == "am"
    assert fired["truncatedAlerts"] == 0 and fired["externalURL"] == "https://fleet.example.com"
    assert fired["groupKey"] == '{}:{kind="finding", rule="Failing or offline"}'
    assert fired["groupLabels"] == {"rule": "Failing or offline", "kind": "finding"}
    [alert] = fired["alerts"]
    labels = {"alertname": "GPU 3 Xid 79", "kind": "finding", "severity": "fail", "node": "gpu-a01",
              "gpu_index": "3", "code": "gpu3.xid", "event_id": str(event.pk)}
    assert alert["labels"] == labels and fired["commonLabels"] == labels
    assert alert["annotations"] == {"summary": "gpu-a01: GPU 3 Xid 79",
                                    "description": "GPU 3 fell off the bus (Xid 79)"}
    assert fired["commonAnnotations"] == alert["annotations"]
    assert alert["status"] == "firing"
    assert alert["startsAt"] == "2026-03-02T03:00:00Z" and alert["endsAt"] == FIRING_ENDS
    assert alert["generatorURL"].startswith("https://fleet.example.com/events/?node=gpu-a01&kind=finding")
    assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    # No apprise keys: a receiver for Alertmanager sees Alertmanager's body alone.
    assert "title" not in fired and "type" not in fired

    gpu3(node, T0 + timedelta(hours=1), failing=False)
    tick(T0 + timedelta(hours=1))
    resolved = webhook.posts[1]
    assert resolved.pop("path") == f"/hooks/{WEBHOOK_TOKEN}"
    assert resolved["status"] == "resolved" and resolved["groupKey"] == fired["groupKey"]
    [again] = resolved["alerts"]
    assert again["status"] == "resolved" and again["fingerprint"] == alert["fingerprint"]
    assert again["startsAt"] == "2026-03-02T03:00:00Z" and again["endsAt"] == "2026-03-02T04:00:00Z"
    assert json.dumps(resolved).count(WEBHOOK_TOKEN) == 0


def test_a_plain_http_url_serves_alertmanager_format_and_apprise_format_is_the_default(alert_settings, admin_api,
                                                                                       webhook):
    url = webhook.url.replace("json://", "http://")
    assert admin_api.post("/api/channels/", {"name": "plain", "url": url}, content_type=JSON).status_code == 422
    added = admin_api.post("/api/channels/", {"name": "am", "url": url, "format": "alertmanager"}, content_type=JSON)
    assert added.status_code == 201 and added.json()["redacted"] == "http://…"
    assert admin_api.post(f"/api/channels/{added.json()['id']}/test").json() == {"sent": True, "error": ""}
    [test] = webhook.posts
    assert test["version"] == "4" and test["receiver"] == "am" and test["path"] == f"/hooks/{WEBHOOK_TOKEN}"
    assert test["alerts"][0]["labels"] == {"alertname": "gpufleet test notification", "severity": "info"}
    assert admin_api.post("/api/channels/", {"name": "mail", "url": "mailto://a@example.com", "format": "alertmanager"},
                          content_type=JSON).status_code == 422
    assert admin_api.post("/api/channels/", {"name": "hook", "url": webhook.url}, content_type=JSON).json()["format"] \
        == "apprise"
    changed = admin_api.put(f"/api/channels/{added.json()['id']}/", {"name": "am", "format": "apprise"},
                            content_type=JSON)
    assert changed.status_code == 422


def test_the_channel_form_offers_the_format(admin_role_client, webhook):
    page = admin_role_client.get("/alerts/channels/").content.decode()
    assert 'name="format"' in page and "Alertmanager" in page
    response = admin_role_client.post("/alerts/channels/", {"name": "am", "url": webhook.url, "format": "alertmanager"})
    assert response.status_code == 302 and Channel.objects.get(name="am").format == "alertmanager"


def test_an_alertmanager_channel_is_refused_a_private_destination_too(alert_settings, webhook):
    alert_settings.GPUFLEET_ALERT_ALLOW_PRIVATE = False
    alert_settings.GPUFLEET_ALERT_ALLOW_HOSTS = []
    channel = Channel.objects.create(name="am", url=webhook.url, redacted="json://…", format="alertmanager")
    Rule.objects.get(name="Failing or offline").channels.set([channel])
    gpu3(Node.objects.create(name="gpu-a01"), T0)
    tick(T0 + timedelta(minutes=5))
    assert webhook.posts == []
    channel.refresh_from_db()
    assert "GPUFLEET_ALERT_ALLOW_PRIVATE" in channel.last_error and WEBHOOK_TOKEN not in channel.last_error
