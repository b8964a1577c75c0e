"""`manage.py enroll NODE` also makes the node's own broker user (gpufleet/fleet/
broker_users.py), against a real redis-server of the test's own: the agent's settings
lines carry it in CELERY_BROKER_URL; --rotate gives it a new password and closes the
old one out; --revoke removes it; a broker that cannot be reached leaves the key
enrolled and says the user was not made and how to try again."""

from __future__ import annotations

from io import StringIO

import pytest
import redis
from django.core.management import CommandError, call_command

from gpufleet.core import broker
from gpufleet.fleet.models import NodeCredential
from tests.acl_redis import STREAM, running
from tests.factories import agent_entry, snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def acl_redis(settings):
    for server in running():
        settings.CELERY_BROKER_URL = server.url()
        settings.GPUFLEET_INGEST_STREAM = STREAM
        yield server


def _enroll(*args) -> dict[str, str]:
    out = StringIO()
    call_command("enroll", *args, stdout=out, stderr=StringIO())
    return dict(line.split("=", 1) for line in out.getvalue().splitlines())


def _login(url: str) -> redis.Redis:
    return redis.Redis.from_url(broker.redis_url(url), socket_timeout=5)


def test_it_prints_a_broker_url_whose_user_may_only_append_and_use_its_own_queue(acl_redis):
    lines = _enroll("gpu-017")
    assert list(lines) == ["GPUFLEET_NODE_NAME", "GPUFLEET_AGENT_KEY", "CELERY_BROKER_URL"]
    url = lines["CELERY_BROKER_URL"]
    assert url.startswith("redis+socket://node%3Agpu-017:") and url.endswith(f"@{acl_redis.socket}")
    agent = _login(url)
    # enroll loaded the append function, through which alone the agent appends.
    broker.append(agent_entry(snapshot("gpu-017", gpus=1)), agent)
    agent.lpush("gpufleet:node:gpu-017:node.gpu-017", "task")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.xadd(STREAM, {"node": "gpu-017"})
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.xrange(broker.ingest_key())
    assert acl_redis.centre().xlen(broker.ingest_key()) == 1
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.lrange("gpufleet:node:gpu-018:node.gpu-018", 0, -1)
    # Saved in the server's aclfile: it survives a restart.
    assert "user node:gpu-017 " in acl_redis.aclfile.read_text()


def test_enrolling_again_keeps_the_password_and_rotating_closes_it_out(acl_redis):
    first = _enroll("gpu-017")["CELERY_BROKER_URL"]
    err = StringIO()
    call_command("enroll", "gpu-017", stdout=StringIO(), stderr=err)
    assert "keeps its password" in err.getvalue() and "--rotate" in err.getvalue()
    assert _login(first).ping()
    rotated = _enroll("gpu-017", "--rotate")
    assert rotated["CELERY_BROKER_URL"] != first
    assert _login(rotated["CELERY_BROKER_URL"]).ping()
    with pytest.raises(redis.AuthenticationError):
        _login(first).ping()


def test_enrolling_again_gives_an_existing_user_todays_rules_and_keeps_its_password(acl_redis):
    url = _enroll("gpu-017")["CELERY_BROKER_URL"]
    centre = acl_redis.centre()
    # Rules of before: its own XADD to the stream's name, Lua of its own, no FCALL.
    centre.execute_command("ACL", "SETUSER", "node:gpu-017", "resetkeys", "clearselectors", "-@all", "+xadd",
                           "+script|load", "~gpufleet:*")
    assert _login(url).xadd(STREAM, {"node": "gpu-017"})
    call_command("enroll", "gpu-017", stdout=StringIO(), stderr=StringIO())
    agent = _login(url)
    broker.append(agent_entry(snapshot("gpu-017", gpus=1)), agent)
    for refused in (lambda: agent.xadd(STREAM, {"node": "gpu-017"}), lambda: agent.script_load("return 1")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    assert "+fcall" in acl_redis.aclfile.read_text()


def test_revoking_removes_the_broker_user(acl_redis):
    url = _enroll("gpu-017")["CELERY_BROKER_URL"]
    call_command("enroll", "gpu-017", "--revoke", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(redis.AuthenticationError):
        _login(url).ping()
    assert "node:gpu-017" not in acl_redis.aclfile.read_text()


def test_the_agent_gets_the_broker_as_it_reaches_it(acl_redis):
    url = _enroll("gpu-017", "--broker-url", "rediss://centre:secret@broker.example:6380/2")["CELERY_BROKER_URL"]
    assert url.startswith("rediss://node%3Agpu-017:") and url.endswith("@broker.example:6380/2")
    assert "centre" not in url and "secret" not in url


def test_without_a_broker_the_key_is_enrolled_and_it_says_how_to_make_the_user(settings, tmp_path):
    settings.CELERY_BROKER_URL = f"redis+socket://{tmp_path / 'nothing.sock'}"
    out = StringIO()
    with pytest.raises(CommandError, match=r"broker user was NOT made .* run `manage.py enroll gpu-017` again"):
        call_command("enroll", "gpu-017", stdout=out, stderr=StringIO())
    assert out.getvalue().startswith("GPUFLEET_NODE_NAME=gpu-017\nGPUFLEET_AGENT_KEY=")
    assert "CELERY_BROKER_URL" not in out.getvalue()
    assert NodeCredential.objects.filter(name="gpu-017", revoked_at__isnull=True).exists()


def test_it_warns_when_the_broker_cannot_keep_the_user_past_a_restart(settings, caplog):
    for server in running(with_aclfile=False):
        settings.CELERY_BROKER_URL = server.url()
        assert _login(_enroll("gpu-017")["CELERY_BROKER_URL"]).ping()
    assert "the broker has no aclfile: the change to node:gpu-017 lasts until Redis restarts" in caplog.text
