"""The alerts in the API: the admin role manages channels, rules and silences with a
read-write token (or the session), every role reads them and the deliveries, and a
channel's URL goes in but never comes out."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Rule, Silence
from gpufleet.api.models import ApiToken
from gpufleet.audit.models import AuditEntry
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Node
from tests.alerts.conftest import T0, gpu_a01_failing
from tests.api.test_openapi import _conforms
from tests.receivers import WEBHOOK_PASSWORD, WEBHOOK_TOKEN

pytestmark = pytest.mark.django_db
JSON = "application/json"


def _token_client(user, scope: str = ApiToken.Scope.READ_WRITE) -> Client:
    _, secret = ApiToken.issue(user, f"t-{scope}", scope)
    return Client(headers={"authorization": f"Bearer {secret}"})


@pytest.fixture
def admin_api(admin_user):
    return _token_client(admin_user)


def test_an_admin_adds_a_channel_whose_url_never_comes_back(admin_api, viewer_client, webhook):
    response = admin_api.post("/api/channels/", {"name": "hook", "url": webhook.url}, content_type=JSON)
    assert response.status_code == 201
    body = response.json()
    assert body == {"id": body["id"], "name": "hook", "redacted": "json://…", "format": "apprise", "failing": False,
                    "failing_since": None, "last_error": "", "last_sent_at": None}
    assert Channel.objects.get().url == webhook.url
    listed = viewer_client.get("/api/channels/").json()
    assert listed["count"] == 1 and listed["results"][0]["redacted"] == "json://…"
    assert WEBHOOK_TOKEN not in json.dumps(listed) and WEBHOOK_PASSWORD not in json.dumps(listed)


def test_a_channel_can_be_renamed_keeping_its_url_given_a_new_one_tested_and_deleted(admin_api, webhook, inbox):
    channel = services.save_channel(None, "hook", webhook.url)
    url = f"/api/channels/{channel.pk}/"
    assert admin_api.put(url, {"name": "ops"}, content_type=JSON).json()["name"] == "ops"
    channel.refresh_from_db()
    assert channel.url == webhook.url
    assert admin_api.put(url, {"name": "ops", "url": inbox.url}, content_type=JSON).json()["redacted"] == "mailto://…"
    assert admin_api.post(f"{url}test").json() == {"sent": True, "error": ""}
    assert inbox.subjects() == ["gpufleet: test notification"]
    assert admin_api.delete(url).status_code == 204 and not Channel.objects.exists()
    assert [a for a, in AuditEntry.objects.filter(action__startswith="channel.").order_by("id").values_list("action")] \
        == ["channel.create", "channel.update", "channel.update", "channel.delete"]


def test_a_bad_url_or_a_taken_name_is_refused(admin_api, webhook):
    bad = admin_api.post("/api/channels/", {"name": "x", "url": "nosuch://tok-abc123456"}, content_type=JSON)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "url"
    assert "tok-abc123456" not in bad.content.decode()
    services.save_channel(None, "hook", webhook.url)
    taken = admin_api.post("/api/channels/", {"name": "hook", "url": webhook.url}, content_type=JSON)
    assert taken.status_code == 422 and taken.json()["error"]["field"] == "name"


def test_only_the_admin_role_writes_and_a_read_token_never(admin_user, operator, viewer, webhook):
    body = {"name": "hook", "url": webhook.url}
    assert _token_client(admin_user, "read").post("/api/channels/", body, content_type=JSON).status_code == 403
    assert _token_client(operator).post("/api/channels/", body, content_type=JSON).status_code == 403
    assert _token_client(viewer).post("/api/rules/", {"name": "r"}, content_type=JSON).status_code == 403
    assert _token_client(viewer).get("/api/rules/").status_code == 200
    assert not Channel.objects.exists()


def test_rules_through_the_api(admin_api, viewer_client, webhook):
    services.save_channel(None, "hook", webhook.url)
    response = admin_api.post("/api/rules/", {
        "name": "GPU racks", "channels": ["hook"], "kinds": ["offline", "finding"], "min_severity": "warn",
        "nodes": "gpu-*", "wait_minutes": 2, "repeat_hours": 6, "notify_resolved": False}, content_type=JSON)
    assert response.status_code == 201
    rule = response.json()
    assert rule == {"id": rule["id"], "name": "GPU racks", "channels": ["hook"], "kinds": ["finding", "offline"],
                    "min_severity": "warn", "nodes": "gpu-*", "gpu_model": "", "wait_minutes": 2, "repeat_hours": 6,
                    "notify_resolved": False, "enabled": True}
    shipped = viewer_client.get("/api/rules/").json()["results"][0]
    assert shipped["name"] == "Failing or offline" and shipped["channels"] == [] and shipped["wait_minutes"] == 5
    changed = admin_api.put(f"/api/rules/{rule['id']}/", {"name": "GPU racks", "channels": []}, content_type=JSON)
    assert changed.json()["channels"] == [] and changed.json()["min_severity"] == "fail"
    for wrong, field in [({"name": "x", "kinds": ["nope"]}, "kinds"), ({"name": "x", "channels": ["gone"]}, "channels"),
                         ({"name": "x", "min_severity": "dire"}, "min_severity"), ({"name": "GPU racks"}, "name")]:
        answer = admin_api.post("/api/rules/", wrong, content_type=JSON)
        assert answer.status_code == 422 and answer.json()["error"]["field"] == field, wrong
    assert admin_api.delete(f"/api/rules/{rule['id']}/").status_code == 204
    assert Rule.objects.count() == 1


def test_silences_through_the_api(admin_api, viewer_client):
    ends = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    response = admin_api.post("/api/silences/", {"nodes": "rack4-*", "ends_at": ends, "reason": "PDU swap"},
                              content_type=JSON)
    assert response.status_code == 201
    silence = response.json()
    assert silence["active"] and silence["author"] == "ada" and silence["nodes"] == "rack4-*"
    assert viewer_client.get("/api/silences/?active=true").json()["count"] == 1
    past = admin_api.post("/api/silences/", {"nodes": "*", "ends_at": "2020-01-01T00:00:00Z", "reason": "x"},
                          content_type=JSON)
    assert past.status_code == 422 and past.json()["error"]["field"] == "ends_at"
    assert admin_api.delete(f"/api/silences/{silence['id']}/").status_code == 204
    assert not Silence.objects.get().is_active()
    assert viewer_client.get("/api/silences/?active=true").json()["count"] == 0
    assert list(AuditEntry.objects.filter(action__startswith="silence.").values_list("action", flat=True)
                .order_by("id")) == ["silence.create", "silence.end"]


def test_deliveries_are_read_with_their_events(viewer_client, alert_settings, rule, webhook, inbox):
    gpu_a01_failing()
    t0 = T0
    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        services.run_once()
    listed = viewer_client.get("/api/deliveries/?channel=hook").json()
    assert listed["count"] == 1
    delivery = listed["results"][0]
    assert (delivery["rule"], delivery["channel"], delivery["notice"], delivery["status"], delivery["tries"]) == (
        "Failing or offline", "hook", "opened", "sent", 1)
    assert delivery["events"] == [e["id"] for e in viewer_client.get("/api/events/").json()["results"]]
    assert viewer_client.get("/api/deliveries/?status=nope").status_code == 400


def test_the_answers_have_the_documented_shapes(viewer_client, admin_api, alert_settings, rule, webhook):
    schema = viewer_client.get("/api/openapi.json").json()
    components = schema["components"]["schemas"]
    channel = Channel.objects.get(name="hook")
    silence = services.save_silence(None, "*", datetime.now(UTC), datetime.now(UTC) + timedelta(hours=1), "x")
    node = Node.objects.create(name="gpu-a01")
    events.observe([Kind.OFFLINE], [node.pk], [events.Condition(node.pk, Kind.OFFLINE, "", Severity.FAIL)],
                   datetime.now(UTC) - timedelta(hours=1))
    services.run_once()

    def check(response, path: str, method: str) -> None:
        documented = schema["paths"][path][method]["responses"][str(response.status_code)]
        _conforms(response.json(), documented["content"]["application/json"]["schema"], components)

    for url, path in [("/api/channels/", "/api/channels/"), (f"/api/channels/{channel.pk}/", "/api/channels/{pk}/"),
                      ("/api/channels/99/", "/api/channels/{pk}/"), ("/api/rules/", "/api/rules/"),
                      (f"/api/rules/{rule.pk}/", "/api/rules/{pk}/"), ("/api/silences/", "/api/silences/"),
                      (f"/api/silences/{silence.pk}/", "/api/silences/{pk}/"), ("/api/deliveries/", "/api/deliveries/"),
                      ("/api/deliveries/?status=x", "/api/deliveries/")]:
        check(viewer_client.get(url), path, "get")
    check(admin_api.post(f"/api/channels/{channel.pk}/test"), "/api/channels/{pk}/test", "post")
    check(admin_api.post("/api/rules/", {"name": "r"}, content_type=JSON), "/api/rules/", "post")
    check(admin_api.post("/api/rules/", {"kinds": 1}, content_type=JSON), "/api/rules/", "post")
    check(admin_api.put(f"/api/channels/{channel.pk}/", {"name": "c"}, content_type=JSON), "/api/channels/{pk}/", "put")


def test_the_url_never_appears_in_pages_api_audit_or_logs(admin_role_client, admin_api, viewer_client, alert_settings,
                                                          webhook, caplog):
    """The whole life of a channel whose URL holds a password and a token: added on the
    page, used by a rule, failing and then sending, tested, renamed and given a new URL
    through the API. Nothing shown, answered, audited or logged carries either."""
    caplog.set_level(logging.DEBUG)
    admin_role_client.post("/alerts/channels/", {"name": "hook", "url": webhook.url})
    channel = Channel.objects.get(name="hook")
    Rule.objects.get(name="Failing or offline").channels.set([channel])
    gpu_a01_failing()
    t0 = T0
    webhook.status = 500
    for minutes in (5, 6, 8):
        with time_machine.travel(t0 + timedelta(minutes=minutes), tick=False):
            services.run_once()
    webhook.status = 200
    admin_role_client.post(f"/alerts/channels/{channel.pk}/test/")
    admin_api.post(f"/api/channels/{channel.pk}/test")
    new_url = webhook.url.replace(WEBHOOK_TOKEN, WEBHOOK_TOKEN + "-2")
    admin_api.put(f"/api/channels/{channel.pk}/", {"name": "hook-2", "url": new_url}, content_type=JSON)
    assert len(webhook.posts) == 5 and Channel.objects.get().url == new_url

    shown = [client.get(url).content.decode() for client in (admin_role_client, viewer_client) for url in (
        "/alerts/channels/", f"/alerts/channels/{channel.pk}/edit/", "/alerts/rules/", "/alerts/deliveries/",
        "/audit/", "/api/channels/", f"/api/channels/{channel.pk}/", "/api/deliveries/", "/api/rules/")]
    audited = json.dumps(list(AuditEntry.objects.values("target", "before", "after")))
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "mail.log")
    for text in [*shown, audited, logged]:
        assert WEBHOOK_PASSWORD not in text and WEBHOOK_TOKEN not in text
    assert "URL changed" in audited and "500" in logged


# Each part of each URL a marker that must never be shown: hosts (PagerDuty's routing key
# sits there), users, passwords, paths, query values.
MARKED_URLS = {
    "pager": "pagerduty://intkeymarkera1@routekeymarkerb2/sourcemarkerc3/componentmarkerd4",
    "hook": "json://usermarkere5:passmarkerf6@hostmarkerg7.invalid/pathmarkerh8?:headermarkeri9=valuemarkerj0",
    "mail": "mailto://usermarkerk1:passmarkerl2@mailhostmarkerm3.invalid?to=tomarkern4@example.com",
}


def test_no_part_of_a_failing_channels_url_is_shown_after_it_failed(admin_role_client, admin_api, viewer_client,
                                                                     alert_settings, monkeypatch):
    """Three channels failing every try (no name of theirs resolves: the tests never reach
    the internet), then tested on the page and in the API: neither the answers nor any page
    or API list a viewer reads carries a part of their URLs."""
    import socket

    resolve = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *args, **kwargs: (
        resolve(host, *args, **kwargs) if host in ("localhost", "127.0.0.1") else _no_such_host()))
    for name, url in MARKED_URLS.items():
        assert admin_role_client.post("/alerts/channels/", {"name": name, "url": url}).status_code == 302
    channels = list(Channel.objects.all())
    Rule.objects.get(name="Failing or offline").channels.set(channels)
    gpu_a01_failing()
    t0 = T0
    for minutes in (5, 6, 8):
        with time_machine.travel(t0 + timedelta(minutes=minutes), tick=False):
            services.run_once()
    assert all(channel.failing for channel in Channel.objects.all())
    shown = []
    for channel in channels:
        shown.append(admin_role_client.post(f"/alerts/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true"))
        shown.append(admin_role_client.post(f"/alerts/channels/{channel.pk}/test/", follow=True))
        shown.append(admin_api.post(f"/api/channels/{channel.pk}/test"))
        shown.append(admin_role_client.get(f"/alerts/channels/{channel.pk}/edit/"))
        shown.append(viewer_client.get(f"/api/channels/{channel.pk}/"))
    shown += [viewer_client.get(url) for url in ("/", "/alerts/channels/", "/alerts/deliveries/", "/api/deliveries/",
                                                 "/api/channels/")]
    texts = [response.content.decode().lower() for response in shown]
    assert all(response.status_code == 200 for response in shown)
    assert "connection error" in texts[-2]  # the reason is there, without the URL
    for text in texts:
        found = [marker for marker in re.findall(r"[a-z]+marker[a-z]\d", " ".join(MARKED_URLS.values()))
                 if marker in text]
        assert not found, found


def _no_such_host():
    import socket

    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
