"""`up` stopped with snapshots queued in its private Redis (the consumer stopped first, a
backlog waiting) and started again, as the README's demo asks: every queued snapshot
is stored, and Redis, replaying its append-only file, logs no CRITICAL line, nor the
ingest a trim that never happened."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import HANG_S, missing_service
from tests.integration.test_up import _query, _started_pid, _wait
from tests.integration.workers import REPO
from tests.receivers import free_port

pytestmark = pytest.mark.integration

BACKLOG = 30

QUEUE = textwrap.dedent(f"""
    from datetime import datetime, timezone
    from gpufleet.core import broker
    from tests.factories import agent_entry, snapshot
    for n in range({BACKLOG}):
        broker.append(agent_entry(snapshot(f"queued-{{n}}", gpus=1, at=datetime(2026, 1, 1, tzinfo=timezone.utc))))
""")


def _up(env, port, log) -> subprocess.Popen:
    with open(log, "ab") as output:
        return subprocess.Popen([sys.executable, "manage.py", "up", "--bind", f"127.0.0.1:{port}"], cwd=REPO,
                                env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(up: subprocess.Popen) -> None:
    up.send_signal(signal.SIGTERM)
    try:
        up.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        raise


def test_snapshots_queued_when_up_stops_are_stored_after_its_restart_without_critical_lines(fake_host, tmp_path):
    data = tmp_path / "data"
    env = {**os.environ, **fake_host.env(), "GPUFLEET_DATA_DIR": str(data), "GPUFLEET_NODE_NAME": "this-host",
           "GPUFLEET_COLLECT_INTERVAL": "2", "PYTHONUNBUFFERED": "1"}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    if shutil.which("redis-server", path=env["PATH"]) is None:
        missing_service("redis-server is not installed (apt-get install redis-server)")
    db, log, port = data / "gpufleet.sqlite3", tmp_path / "up.log", free_port()
    up = _up(env, port, log)
    try:
        # Running: the agent's snapshots read, stored and acknowledged, a few times.
        _wait(lambda: _query(db, "select count(*) from fleet_devicesample")[0][0] >= 3 * 8, HANG_S, "snapshots", up)
        consumer = _started_pid(log, "ingest")
        os.kill(consumer, signal.SIGSTOP)
        queued = subprocess.run([sys.executable, "manage.py", "shell", "-c", QUEUE], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert queued.returncode == 0, queued.stderr
        # up stopping (it starts nothing again now), the consumer gone before it read the backlog.
        up.send_signal(signal.SIGTERM)
        os.kill(consumer, signal.SIGKILL)
        up.wait(60)
        assert not _query(db, "select count(*) from fleet_node where name like 'queued-%'")[0][0]

        up = _up(env, port, log)
        try:
            _wait(lambda: _query(db, "select count(*) from fleet_node where name like 'queued-%'")[0][0] == BACKLOG,
                  HANG_S, "the queued snapshots stored", up)
        except AssertionError as failed:
            stored = _query(db, "select count(*) from fleet_node where name like 'queued-%'")[0][0]
            tail = "\n".join(log.read_text().splitlines()[-80:])
            raise AssertionError(f"{failed}: {stored} of {BACKLOG}; up's log ends:\n{tail}") from None
    finally:
        _stop(up)
    output = log.read_text()
    assert output.count("broker private redis,") == 2
    redis_log = (data / "logs" / "redis.log").read_text()
    assert "DB loaded from append only file" in redis_log
    assert "CRITICAL" not in redis_log and "CRITICAL" not in output
    assert "trimmed" not in output
