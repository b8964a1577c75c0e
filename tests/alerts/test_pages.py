"""The alert pages: the admin role sets up channels, rules and silences (audited); every
role reads them and the deliveries; a channel's URL is never shown once saved."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Delivery, Rule, Silence, Status
from gpufleet.audit.models import AuditEntry
from gpufleet.events.models import Kind, Severity
from tests.alerts.conftest import T0, gpu_a01_failing
from tests.factories import hx
from tests.receivers import WEBHOOK_PASSWORD, WEBHOOK_TOKEN

pytestmark = pytest.mark.django_db


def test_an_admin_adds_a_channel_whose_url_is_never_shown_again(admin_role_client, viewer_client, webhook):
    response = admin_role_client.post("/alerts/channels/", {"name": "ops hook", "url": webhook.url})
    assert response.status_code == 302 and response["Location"] == "/alerts/channels/"
    channel = Channel.objects.get(name="ops hook")
    assert channel.url == webhook.url and channel.redacted == "json://…"
    for client in (admin_role_client, viewer_client):
        page = client.get("/alerts/channels/").content.decode()
        assert "ops hook" in page and "json://…" in page
        assert WEBHOOK_PASSWORD not in page and WEBHOOK_TOKEN not in page and "127.0.0.1" not in page
    edit = admin_role_client.get(f"/alerts/channels/{channel.pk}/edit/").content.decode()
    assert WEBHOOK_PASSWORD not in edit and WEBHOOK_TOKEN not in edit and "Now json://…" in edit
    entry = AuditEntry.objects.get(action="channel.create")
    assert entry.after == {"name": "ops hook", "url": "json://…", "format": "apprise"} and entry.username == "ada"


def test_editing_a_channel_keeps_its_url_unless_a_new_one_is_typed_and_the_audit_says_url_changed(
        admin_role_client, webhook, inbox):
    channel = services.save_channel(None, "ops", webhook.url)
    admin_role_client.post(f"/alerts/channels/{channel.pk}/edit/", {"name": "ops-renamed", "url": ""})
    channel.refresh_from_db()
    assert (channel.name, channel.url) == ("ops-renamed", webhook.url)
    admin_role_client.post(f"/alerts/channels/{channel.pk}/edit/", {"name": "ops-renamed", "url": inbox.url})
    channel.refresh_from_db()
    assert channel.url == inbox.url and channel.redacted == "mailto://…"
    rows = list(AuditEntry.objects.filter(action="channel.update").order_by("id").values_list("before", "after"))
    am = {"format": "apprise"}
    assert rows == [({"name": "ops", "url": "json://…", **am}, {"name": "ops-renamed", "url": "json://…", **am}),
                    ({"name": "ops-renamed", "url": "json://…", **am}, {"name": "ops-renamed", "url": "URL changed", **am})]
    assert WEBHOOK_TOKEN not in str(list(AuditEntry.objects.values()))


def test_a_url_apprise_cannot_use_is_refused_without_echoing_it(admin_role_client):
    response = admin_role_client.post("/alerts/channels/", {"name": "bad", "url": "nosuchservice://secret-x1y2z3"})
    page = response.content.decode()
    assert response.status_code == 200 and not Channel.objects.exists()
    assert "apprise cannot use this nosuchservice://… URL" in page and "secret-x1y2z3" not in page
    response = admin_role_client.post("/alerts/channels/", {"name": "bad", "url": "just text"})
    assert "An apprise URL starts with its service" in response.content.decode()


def test_send_a_test_shows_the_result_in_place(admin_role_client, webhook):
    channel = services.save_channel(None, "ops", webhook.url)
    response = admin_role_client.post(f"/alerts/channels/{channel.pk}/test/", **hx())
    assert response.status_code == 200 and "test sent" in response.content.decode()
    assert webhook.titles() == ["gpufleet: test notification"]
    webhook.status = 503
    answer = admin_role_client.post(f"/alerts/channels/{channel.pk}/test/", **hx()).content.decode()
    assert "test failed" in answer and "503" in answer
    assert WEBHOOK_TOKEN not in answer and WEBHOOK_PASSWORD not in answer
    assert answer.startswith(f'<span id="test-result-{channel.pk}"')
    # Without JavaScript: back to the page, with the result as a message.
    response = admin_role_client.post(f"/alerts/channels/{channel.pk}/test/", follow=True)
    assert "The test to ops failed" in response.content.decode()


def test_a_successful_test_shows_the_channel_working_on_the_channels_page(admin_role_client, webhook, inbox):
    hook = services.save_channel(None, "hook", webhook.url)
    email = services.save_channel(None, "email", inbox.url)
    Channel.objects.filter(pk=email.pk).update(failing_since=timezone.now(), last_error="error=500")
    assert "nothing sent yet" in admin_role_client.get("/alerts/channels/").content.decode()
    admin_role_client.post(f"/alerts/channels/{hook.pk}/test/", **hx())
    admin_role_client.post(f"/alerts/channels/{email.pk}/test/")
    page = admin_role_client.get("/alerts/channels/").content.decode()
    # Both reached their receiver: the one that was failing works again.
    assert "nothing sent yet" not in page and "failing" not in page
    assert page.count('<span class="badge badge-green">working</span> last sent') == 2
    webhook.status = 503
    admin_role_client.post(f"/alerts/channels/{hook.pk}/test/", **hx())
    # A failed test says so where it was pressed; the last send that worked stays shown.
    assert admin_role_client.get("/alerts/channels/").content.decode().count("working</span> last sent") == 2


def test_viewers_read_but_never_change(viewer_client, operator_client, webhook):
    channel = services.save_channel(None, "ops", webhook.url)
    for client in (viewer_client, operator_client):
        for url in ("/alerts/channels/", "/alerts/rules/", "/alerts/silences/", "/alerts/deliveries/"):
            page = client.get(url)
            assert page.status_code == 200 and "<form method=\"post\"" not in page.content.decode(), url
        assert client.post("/alerts/channels/", {"name": "x", "url": "json://h/x"}).status_code == 403
        assert client.post("/alerts/rules/", {"name": "x"}).status_code == 403
        assert client.post("/alerts/silences/", {"nodes": "*"}).status_code == 403
        assert client.post(f"/alerts/channels/{channel.pk}/test/").status_code == 403
    assert Channel.objects.count() == 1 and webhook.posts == []


def test_an_admin_adds_edits_and_deletes_a_rule(admin_role_client, webhook):
    hook = services.save_channel(None, "hook", webhook.url)
    response = admin_role_client.post("/alerts/rules/", {
        "name": "H100 racks", "channels": [hook.pk], "kinds": [Kind.FINDING, Kind.OFFLINE],
        "min_severity": Severity.WARN, "nodes": "rack4-*", "gpu_model": "H100", "wait_minutes": 2,
        "repeat_hours": 4, "notify_resolved": "on", "enabled": "on"})
    assert response.status_code == 302
    rule = Rule.objects.get(name="H100 racks")
    assert (rule.kinds, rule.nodes, rule.wait_minutes, list(rule.channels.all())) == (
        ["finding", "offline"], "rack4-*", 2, [hook])
    page = admin_role_client.get("/alerts/rules/").content.decode()
    assert "rack4-* with H100 GPUs" in page and "every 4 h" in page and "none: sends nothing" in page  # shipped rule
    admin_role_client.post(f"/alerts/rules/{rule.pk}/edit/", {
        "name": "H100 racks", "min_severity": Severity.FAIL, "wait_minutes": 5, "repeat_hours": 0})
    rule.refresh_from_db()
    assert (rule.min_severity, rule.enabled, list(rule.channels.all())) == ("fail", False, [])
    assert admin_role_client.post(f"/alerts/rules/{rule.pk}/delete/", {"confirm": "yes"}).status_code == 302
    assert list(AuditEntry.objects.filter(action__startswith="rule.").order_by("id").values_list("action", flat=True)) \
        == ["rule.create", "rule.update", "rule.delete"]
    created = AuditEntry.objects.get(action="rule.create").after
    assert created["channels"] == ["hook"] and created["kinds"] == ["finding", "offline"]


def test_an_admin_silences_nodes_and_ends_the_silence_early(admin_role_client, viewer_client):
    start = timezone.localtime().replace(second=0, microsecond=0)
    response = admin_role_client.post("/alerts/silences/", {
        "nodes": "rack4-*", "starts_at": start.strftime("%Y-%m-%dT%H:%M"),
        "ends_at": (start + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M"), "reason": "PDU swap"})
    assert response.status_code == 302
    silence = Silence.objects.get()
    assert silence.author_name == "ada" and silence.is_active()
    assert "PDU swap" in viewer_client.get("/alerts/silences/").content.decode()
    admin_role_client.post(f"/alerts/silences/{silence.pk}/end/")
    silence.refresh_from_db()
    assert not silence.is_active()
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "target"))
    assert actions == [("silence.create", "rack4-*"), ("silence.end", "rack4-*")]


def test_a_silence_must_end_after_it_starts(admin_role_client):
    response = admin_role_client.post("/alerts/silences/", {
        "nodes": "*", "starts_at": "2026-03-02T10:00", "ends_at": "2026-03-02T09:00", "reason": "x"})
    assert "A silence ends after it starts." in response.content.decode() and not Silence.objects.exists()


def test_the_deliveries_page_lists_notifications_and_filters_them(viewer_client, alert_settings, rule, webhook, inbox):
    gpu_a01_failing()
    t0 = T0
    webhook.status = 500
    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        services.run_once()
    page = viewer_client.get("/alerts/deliveries/").content.decode()
    assert page.count("gpufleet: Failing: gpu-a01 GPU 0 Xid 79") == 2 and "sent" in page and "pending" in page
    table = viewer_client.get("/alerts/deliveries/?status=pending", **hx()).content.decode()
    assert table.strip().startswith('<div id="deliveries-table"') and "500" in table
    assert table.count("<tr>") == 2  # the head and one delivery
    assert WEBHOOK_TOKEN not in page and WEBHOOK_PASSWORD not in page
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT, Status.PENDING}


def test_the_link_in_a_notification_shows_its_events_on_the_events_page(viewer_client, alert_settings, rule, inbox,
                                                                         webhook):
    gpu_a01_failing()
    t0 = T0
    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        services.run_once()
    link = next(line for line in inbox.text(0).splitlines() if line.startswith("Events: "))
    path = link.removeprefix("Events: https://fleet.example.com")
    page = viewer_client.get(path)
    assert page.status_code == 200 and "GPU 0 Xid 79" in page.content.decode()


def test_the_navigation_links_the_alert_pages(viewer_client):
    page = viewer_client.get("/alerts/rules/").content.decode()
    assert 'href="/alerts/channels/"' in page and 'href="/alerts/silences/"' in page
    assert 'href="/alerts/deliveries/"' in page and "Failing or offline" in page


def test_a_failing_channel_is_a_fleet_finding_on_the_overview_until_a_send_works(viewer_client):
    quiet = Channel.objects.create(name="pager", url="json://127.0.0.1:9/", redacted="json://…")
    assert "alert channel" not in viewer_client.get("/").content.decode()
    Channel.objects.filter(pk=quiet.pk).update(failing_since=timezone.now(),
                                               last_error='error=503 <b>"down"</b>')
    page = viewer_client.get("/").content.decode()
    assert "1 alert channel failing: notifications do not reach anyone there" in page
    # The channel links to the Channels page; its error is shown escaped, never its URL.
    assert '<a href="/alerts/channels/">pager: error=503 &lt;b&gt;&quot;down&quot;&lt;/b&gt;</a>' in page
    assert "127.0.0.1:9" not in page
    Channel.objects.filter(pk=quiet.pk).update(failing_since=None, last_error="")
    assert "alert channel" not in viewer_client.get("/").content.decode()


def test_the_channels_page_lists_them_by_name(admin_role_client):
    # Made in the other order: the page's query counts rules with a GROUP BY, which drops
    # the model's own ordering.
    for name in ("zulu", "alpha", "mike"):
        Channel.objects.create(name=name, url="json://127.0.0.1:9/", redacted="json://…")
    page = admin_role_client.get("/alerts/channels/").content.decode()
    assert [page.index(name) for name in ("alpha", "mike", "zulu")] == sorted(page.index(n) for n in ("alpha", "mike", "zulu"))
