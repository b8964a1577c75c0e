"""The web's defences: a Content-Security-Policy without inline code, login throttling
that locks out and says so (audited), the admin role kept below superuser in the admin
site, styled error pages, and production refusing unsafe settings."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from gpufleet.audit.models import AuditEntry
from gpufleet.env import estimated_bits

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def test_every_page_has_a_policy_without_inline_code(viewer_client, alpha):
    policy = viewer_client.get("/")["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_no_template_carries_inline_styles_or_event_handlers():
    import re

    offending = []
    for path in (ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        if re.search(r"\sstyle=|\son(?:click|load|submit|change|input|error|focus|blur|key\w+|mouse\w+)=|hx-on", text):
            offending.append(path.name)
    assert offending == []


def test_wrong_passwords_lock_the_user_out_with_a_message_and_an_audit_row(viewer, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        response = client.post("/accounts/login/", {"username": "vera", "password": "wrong"})
        assert response.status_code == 200 and "didn" in response.content.decode()
    # The last wrong one allowed locks the pair (this user name from this address).
    assert client.post("/accounts/login/", {"username": "vera", "password": "wrong"}).status_code == 429
    # Locked: even the right password is refused now, and the page says why.
    response = client.post("/accounts/login/", {"username": "vera", "password": "pw-vera"})
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert AuditEntry.objects.filter(action="login.lockout", target="vera").exists()


def test_a_lockout_is_one_audit_row_that_counts_its_attempts(viewer, settings):
    client = Client()
    for _ in range(100):
        client.post("/accounts/login/", {"username": "vera", "password": "wrong"})
    # The locking attempt and every one refused while locked, in one row.
    [entry] = AuditEntry.objects.filter(action="login.lockout")
    assert entry.target == "vera" and entry.username == ""
    assert entry.after["ip_address"] == "127.0.0.1"
    assert entry.after["attempts"] == 100 - (settings.AXES_FAILURE_LIMIT - 1)
    # The same user name locked out from another address is another lockout.
    elsewhere = Client(REMOTE_ADDR="192.0.2.9")
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        elsewhere.post("/accounts/login/", {"username": "vera", "password": "wrong"})
    assert AuditEntry.objects.filter(action="login.lockout").count() == 2
    assert AuditEntry.objects.get(action="login.lockout", after__ip_address="192.0.2.9").after["attempts"] == 2


def test_a_lockout_after_the_last_one_ended_gets_a_row_of_its_own(viewer, settings):
    from datetime import timedelta

    from axes.models import AccessAttempt

    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "vera", "password": "wrong"})
    [first] = AuditEntry.objects.filter(action="login.lockout")
    # The cool-off passes: django-axes forgets the attempts, and the row's last one is that old.
    AccessAttempt.objects.all().delete()
    ended = first.at - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    AuditEntry.objects.filter(pk=first.pk).update(at=ended, after={**first.after, "last_attempt_at": ended.isoformat()})
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/accounts/login/", {"username": "vera", "password": "wrong"})
    rows = list(AuditEntry.objects.filter(action="login.lockout").order_by("at").values_list("after", flat=True))
    assert [row["attempts"] for row in rows] == [1, 1]


def test_the_admin_role_cannot_make_itself_superuser(admin_role_client, admin_user):
    page = admin_role_client.get(f"/admin/auth/user/{admin_user.pk}/change/")
    assert page.status_code == 200
    form = {"username": admin_user.username, "is_active": "on", "is_superuser": "on", "is_staff": "on",
            "groups": [Group.objects.get(name="admin").pk], "last_login_0": "", "last_login_1": "",
            "date_joined_0": "2026-12-03", "date_joined_1": "12:00:00"}
    admin_role_client.post(f"/admin/auth/user/{admin_user.pk}/change/", form)
    admin_user.refresh_from_db()
    assert not admin_user.is_superuser and not admin_user.is_staff
    # A superuser is out of its reach altogether.
    root = User.objects.create_superuser("root", password="x")
    assert admin_role_client.get(f"/admin/auth/user/{root.pk}/change/").status_code in (302, 404)


def test_missing_pages_get_the_styled_404(viewer_client):
    response = viewer_client.get("/nodes/no-such-node/")
    assert response.status_code == 404 and "Not found" in response.content.decode()


def test_the_500_page_renders_without_a_request():
    from django.template.loader import render_to_string

    assert "Server error" in render_to_string("500.html")


def test_a_server_error_is_logged_with_its_traceback_and_answered_with_the_styled_page(viewer, alpha, monkeypatch,
                                                                                       caplog, settings):
    from django.test import Client

    from gpufleet.fleet import views

    def broken(node):
        raise RuntimeError("boom in the node page")

    monkeypatch.setattr(views.node_page, "findings_worst_first", broken)
    client = Client(raise_request_exception=False)
    client.force_login(viewer)
    response = client.get("/nodes/alpha/")
    assert response.status_code == 500 and "Server error" in response.content.decode()
    [record] = [r for r in caplog.records if r.name == "django.request" and r.levelname == "ERROR"]
    assert record.exc_info and "RuntimeError: boom in the node page" in caplog.text
    # And in production the records go somewhere: django's logger passes them up to the
    # root, whose one handler is the console.
    assert settings.LOGGING["loggers"]["django"].get("propagate", True)
    assert settings.LOGGING["root"]["handlers"] == ["console"]


def _settings_in_production(**env) -> subprocess.CompletedProcess:
    # The browser tests set DJANGO_ALLOW_ASYNC_UNSAFE in this process: a deployment must not.
    # The tests' own signing key is no production one.
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SECRET_KEY", "DEBUG", "DJANGO_ALLOW_ASYNC", "GPUFLEET_SIGNING_KEY"))}
    base.update(DJANGO_SETTINGS_MODULE="gpufleet.settings", GPUFLEET_PRODUCTION="true", **env)
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)


def test_production_refuses_a_missing_secret_key():
    done = _settings_in_production()
    assert done.returncode != 0 and "SECRET_KEY must be set in production" in done.stderr


# What the start-up's refusal says to run for a good key.
KEY_COMMAND = re.compile(r"make one with: (python3 -c '[^']+')")


def _good_key() -> str:
    return secrets.token_urlsafe(50)


@pytest.mark.parametrize(("variable", "value"), [
    ("SECRET_KEY", "Sh0rt-but-varied-Key-of-40-characters-xy"),  # under 50 characters
    ("SECRET_KEY", "ab12" * 20),  # long, but of 4 different characters
    ("SECRET_KEY", "changeme-" * 6),  # 54 characters, 8 different ones, a few guesses
    ("SECRET_KEY", "x" * 60 + "Y7#kq"),  # long, varied at its end alone
    ("SECRET_KEY", "correct-horse-battery-staple-" * 2),  # a passphrase said twice
    ("GPUFLEET_SIGNING_KEY", "node-keys-from-a-short-one"),  # the node keys' own key, when set
])
def test_production_refuses_a_weak_key_naming_the_command_that_makes_one(variable, value, tmp_path):
    env = {"SECRET_KEY": _good_key(), "GPUFLEET_DATA_DIR": str(tmp_path), variable: value}
    done = _settings_in_production(**env)
    assert done.returncode != 0
    assert f"{variable} is too weak for production" in done.stderr
    assert KEY_COMMAND.search(done.stderr)
    assert value not in done.stderr  # the message never shows the secret


def test_production_starts_with_a_key_the_named_command_makes(tmp_path):
    refused = _settings_in_production(SECRET_KEY="changeme-" * 6, GPUFLEET_DATA_DIR=str(tmp_path))
    command = KEY_COMMAND.search(refused.stderr).group(1)
    made = subprocess.run(command, shell=True, capture_output=True, text=True, check=True).stdout.strip()
    done = _settings_in_production(SECRET_KEY=made, GPUFLEET_SIGNING_KEY=made[::-1],
                                   ALLOWED_HOSTS="gpufleet.example.com", GPUFLEET_DATA_DIR=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_key_estimate_counts_repetition_and_few_different_characters():
    assert estimated_bits(secrets.token_urlsafe(50)) > 256
    assert estimated_bits(secrets.token_hex(32)) >= 128
    assert estimated_bits("changeme-" * 6) < 64
    assert estimated_bits("a" * 200) < 16
    assert estimated_bits("ab12" * 20) < 32
    assert estimated_bits("Tr0ub4dor&3") < 128
    assert estimated_bits("") == 0


def test_check_deploy_is_clean_in_production_settings(tmp_path):
    done = _settings_in_production(SECRET_KEY=_good_key(), ALLOWED_HOSTS="gpufleet.example.com",
                                   GPUFLEET_DATA_DIR=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout
