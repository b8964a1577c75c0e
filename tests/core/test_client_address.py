"""Who the client is (core.security.client_ip), for the login throttle and /metrics:
X-Forwarded-For is read only from a peer in GPUFLEET_TRUSTED_PROXIES, so a client that
writes the header itself cannot dodge a lockout, lock out someone else's address or
pass for an address that may scrape /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, RequestFactory

from gpufleet.core.security import client_ip

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def _login(client: Client, password: str, forwarded: str | None = None) -> int:
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client.post("/accounts/login/", {"username": "vera", "password": password}, **extra).status_code


def _address(remote: str, forwarded: str | None = None) -> str:
    extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client_ip(RequestFactory().get("/", REMOTE_ADDR=remote, **extra))


def test_rotating_x_forwarded_for_from_loopback_does_not_dodge_the_lockout(viewer, settings):
    client = Client(REMOTE_ADDR="127.0.0.1")
    codes = [_login(client, "wrong", f"198.51.100.{n}") for n in range(settings.AXES_FAILURE_LIMIT + 3)]
    assert codes[: settings.AXES_FAILURE_LIMIT - 1] == [200] * (settings.AXES_FAILURE_LIMIT - 1)
    assert set(codes[settings.AXES_FAILURE_LIMIT - 1:]) == {429}
    # Still locked with the right password and yet another address in the header.
    assert _login(client, "pw-vera", "198.51.100.250") == 429


def test_a_forged_x_forwarded_for_cannot_lock_out_the_victims_address(viewer, settings):
    attacker = Client(REMOTE_ADDR="127.0.0.1")
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        _login(attacker, "wrong", "203.0.113.7")
    victim = Client(REMOTE_ADDR="203.0.113.7")
    assert _login(victim, "pw-vera") == 302


def test_a_forged_x_forwarded_for_does_not_open_metrics(settings):
    settings.GPUFLEET_METRICS_ALLOWED_ADDRESSES = ["10.0.0.0/8"]
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics", HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 401
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200


def test_it_trusts_no_proxy_by_default(settings):
    assert settings.GPUFLEET_TRUSTED_PROXIES == []
    assert _address("127.0.0.1", "192.0.2.1") == "127.0.0.1"
    assert _address("::1", "192.0.2.1") == "::1"


def test_it_takes_the_right_most_address_that_is_not_a_trusted_proxy(settings):
    settings.GPUFLEET_TRUSTED_PROXIES = ["127.0.0.1", "10.0.0.0/24"]
    # What the client wrote (left) is never read past the first untrusted hop.
    assert _address("127.0.0.1", "6.6.6.6, 203.0.113.9, 10.0.0.5") == "203.0.113.9"
    assert _address("127.0.0.1", "203.0.113.9") == "203.0.113.9"
    # A forged entry that is no address stops nothing: the hop after it is the client.
    assert _address("127.0.0.1", "not-an-address, 203.0.113.9") == "203.0.113.9"
    # Every hop trusted (a request from the proxy's own host): the farthest of them.
    assert _address("127.0.0.1", "10.0.0.7, 10.0.0.5") == "10.0.0.7"
    # No header, or a peer that is not a proxy: its own address.
    assert _address("127.0.0.1") == "127.0.0.1"
    assert _address("192.0.2.50", "203.0.113.9") == "192.0.2.50"
    # An IPv6 proxy handing on an IPv4-mapped client.
    settings.GPUFLEET_TRUSTED_PROXIES = ["::1"]
    assert _address("::1", "::ffff:203.0.113.9") == "203.0.113.9"


def test_behind_a_trusted_proxy_a_rotated_header_still_locks_the_real_client_out(viewer, settings):
    settings.GPUFLEET_TRUSTED_PROXIES = ["127.0.0.1"]
    proxy = Client(REMOTE_ADDR="127.0.0.1")
    # nginx's $proxy_add_x_forwarded_for keeps what the client wrote and appends its address.
    for n in range(settings.AXES_FAILURE_LIMIT):
        _login(proxy, "wrong", f"198.51.100.{n}, 203.0.113.9")
    assert _login(proxy, "pw-vera", "198.51.100.99, 203.0.113.9") == 429
    # Another client behind the same proxy is not locked out.
    assert _login(proxy, "pw-vera", "203.0.113.10") == 302


def test_start_up_refuses_a_trusted_proxy_that_is_no_address(tmp_path):
    env = {**os.environ, "GPUFLEET_TRUSTED_PROXIES": "127.0.0.1,nginx.local", "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    assert "GPUFLEET_TRUSTED_PROXIES: 'nginx.local' is not an IP address or CIDR" in done.stderr
