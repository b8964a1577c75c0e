"""Where a channel may send: by default never to a loopback, link-local, private or
reserved address, checked on the address each connection goes to (so a name that
resolves there is refused too), unless GPUFLEET_ALERT_ALLOW_PRIVATE is on or the host is
in GPUFLEET_ALERT_ALLOW_HOSTS. The receivers are real, on loopback (tests/receivers.py)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Delivery, Status
from tests.alerts.conftest import T0, gpu_a01_failing
from tests.factories import hx
from tests.receivers import free_port

pytestmark = pytest.mark.django_db
REFUSED = "GPUFLEET_ALERT_ALLOW_PRIVATE"


@pytest.fixture
def private_refused(settings):
    settings.GPUFLEET_ALERT_ALLOW_PRIVATE = False
    settings.GPUFLEET_ALERT_ALLOW_HOSTS = []
    return settings


def _test(client, url: str) -> str:
    channel = services.save_channel(None, f"c{free_port()}", url)
    response = client.post(f"/alerts/channels/{channel.pk}/test/", **hx())
    assert response.status_code == 200
    return response.content.decode()


def test_a_test_to_a_loopback_webhook_is_refused_naming_the_address_and_the_setting(
        admin_role_client, private_refused, webhook):
    answer = _test(admin_role_client, webhook.url)
    assert "test failed" in answer and "127.0.0.1" in answer and REFUSED in answer
    assert "GPUFLEET_ALERT_ALLOW_HOSTS" in answer and "loopback" in answer
    assert webhook.posts == []


def test_an_open_port_and_a_closed_one_answer_alike(admin_role_client, private_refused, webhook):
    port = webhook.url.rsplit(":", 1)[1].split("/")[0]
    open_port = _test(admin_role_client, f"json://127.0.0.1:{port}/hooks").split(">", 1)[1]
    closed = _test(admin_role_client, f"json://127.0.0.1:{free_port()}/hooks").split(">", 1)[1]
    assert open_port == closed and REFUSED in closed


def test_a_name_that_resolves_to_loopback_is_refused_too(admin_role_client, private_refused, webhook):
    answer = _test(admin_role_client, webhook.url.replace("@127.0.0.1:", "@localhost:"))
    assert "test failed" in answer and REFUSED in answer and "loopback" in answer
    assert webhook.posts == []


def test_email_to_a_loopback_smtp_server_is_refused(admin_role_client, private_refused, inbox):
    answer = _test(admin_role_client, inbox.url)
    assert "test failed" in answer and REFUSED in answer
    assert inbox.messages == []


def test_syslog_over_udp_to_loopback_is_refused(admin_role_client, private_refused):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(0.5)
        answer = _test(admin_role_client, f"rsyslog://localhost:{receiver.getsockname()[1]}")
        assert "test failed" in answer and REFUSED in answer
        with pytest.raises(TimeoutError):
            receiver.recv(4096)


def test_the_setting_lets_a_test_reach_loopback(admin_role_client, private_refused, webhook):
    private_refused.GPUFLEET_ALERT_ALLOW_PRIVATE = True
    assert "test sent" in _test(admin_role_client, webhook.url)
    assert webhook.titles() == ["gpufleet: test notification"]


@pytest.mark.parametrize("allowed", ["localhost", "127.0.0.1", "127.0.0.0/8"])
def test_a_host_on_the_allow_list_is_reached_and_no_other(admin_role_client, private_refused, webhook, inbox,
                                                          allowed):
    private_refused.GPUFLEET_ALERT_ALLOW_HOSTS = [allowed]
    assert "test sent" in _test(admin_role_client, inbox.url.replace("//127.0.0.1:", "//localhost:"))
    assert len(inbox.messages) == 1
    private_refused.GPUFLEET_ALERT_ALLOW_HOSTS = ["relay.example.com", "10.0.0.0/8"]
    assert REFUSED in _test(admin_role_client, webhook.url)
    assert webhook.posts == []


def test_a_notification_to_loopback_fails_with_the_refusal_on_the_deliveries_page(
        viewer_client, private_refused, alert_settings, rule, webhook, inbox):
    gpu_a01_failing()
    t0 = T0
    with time_machine.travel(t0 + timedelta(minutes=5), tick=False):
        services.run_once()
    assert webhook.posts == [] and inbox.messages == []
    assert {d.status for d in Delivery.objects.all()} == {Status.PENDING}
    assert all(REFUSED in d.error for d in Delivery.objects.all())
    assert REFUSED in viewer_client.get("/alerts/deliveries/").content.decode()
