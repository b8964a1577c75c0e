"""`up`'s supervisor on small real processes: a killed child is started again and what
it started is stopped with it, a crash loop ends with exit code 1, logs land in files,
SIGTERM stops everything. (tests/integration/test_up.py runs the real `up`.)"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from honcho.environ import parse_procfile

from gpufleet.core import broker_acl, launch

REPO = Path(__file__).resolve().parents[2]

# Runs the supervisor in a process of its own (it owns SIGTERM and SIGINT there), with
# short delays so a crash loop is over in a second.
RUNNER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import django
    django.setup()
    from gpufleet.core.management.commands import up
    up.RESTART_DELAYS = (0.1, 0.2, 0.3)
    procfile, logs = Path(sys.argv[1]), Path(sys.argv[2])
    sys.exit(up.Supervisor(procfile, dict(os.environ), cwd=procfile.parent, log_dir=logs).run())
""")

SLEEPER = f"{sys.executable} -c \"import os, time; print('pid', os.getpid(), flush=True); time.sleep(300)\""
# A program that starts a child of its own and waits, as gunicorn and celery -B do.
FAMILY = "sh -c 'sleep 300 & echo child $!; wait'"
CRASHER = f"{sys.executable} -c \"import sys; print('boom', flush=True); sys.exit(3)\""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes (its parent has not reaped it yet).
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _wait(predicate, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _supervise(tmp_path: Path, procfile: str) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "Procfile").write_text(procfile)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path / "Procfile"), str(tmp_path / "logs")],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, tmp_path / "logs"


def _pids(log: Path, word: str) -> list[int]:
    """The pids in the log's lines "<date> <time> <word> <pid>"."""
    pattern = rf"^\S+ \S+ {word} (\d+)\)?$"
    return [int(p) for p in re.findall(pattern, log.read_text(), re.M)] if log.exists() else []


def test_it_restarts_a_killed_child_with_what_it_started_and_stops_all_on_sigterm(tmp_path):
    proc, logs = _supervise(tmp_path, f"sleeper: {SLEEPER}\nfamily: {FAMILY}\n")
    try:
        [first] = _wait(lambda: _pids(logs / "sleeper.log", "pid"), "the sleeper")
        [child] = _wait(lambda: _pids(logs / "family.log", "child"), "the family's child")
        [leader] = _pids(logs / "family.log", r"\[up\] started \(pid")

        os.kill(first, signal.SIGKILL)
        pids = _wait(lambda: _pids(logs / "sleeper.log", "pid")[1:] and _pids(logs / "sleeper.log", "pid"),
                     "the sleeper started again")
        second = pids[1]
        assert second != first and _pid_alive(second)
        assert "[up] exited with code -9" in (logs / "sleeper.log").read_text()

        os.kill(leader, signal.SIGKILL)
        _wait(lambda: len(_pids(logs / "family.log", "child")) == 2, "the family started again")
        _wait(lambda: not _pid_alive(child), "the dead leader's child stopped")
        new_child = _pids(logs / "family.log", "child")[1]
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0, output
    assert "SIGTERM received; stopping" in output
    assert not _pid_alive(second) and not _pid_alive(new_child)
    # The console has every child's lines, each under its name.
    assert re.search(rf"sleeper +\| pid {second}$", output, re.M)
    assert re.search(rf"family +\| child {new_child}$", output, re.M)


def test_it_gives_up_on_a_crash_loop_and_stops_the_others(tmp_path):
    proc, logs = _supervise(tmp_path, f"crasher: {CRASHER}\nsleeper: {SLEEPER}\n")
    try:
        output = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, output
    log = (logs / "crasher.log").read_text()
    assert log.count("boom") == 4  # the first start and three restarts
    assert "restarting in 0.3 s (restart 3 of at most 3 in a row)" in log
    assert "exited with code 3, 4 times in a row within 30 s of starting" in log and "giving up and stopping everything" in output
    [sleeper] = _pids(logs / "sleeper.log", "pid")
    assert not _pid_alive(sleeper)
    assert "[up] stopped" in (logs / "sleeper.log").read_text()


def test_it_writes_a_procfile_with_one_entry_per_agent():
    entries = parse_procfile(launch.up_procfile(["demo-1", "demo-2"])).processes
    assert list(entries) == ["web", "ingest", "beat", "agent", "agent-demo-1", "agent-demo-2"]
    # Each a manage.py command, as the deploy's units run them; its settings come with the environment.
    for name in ("web", "ingest", "beat", "agent"):
        assert entries[name] == f"{launch.PYTHON} manage.py {name}"
    assert entries["agent-demo-2"] == f"env GPUFLEET_NODE_NAME=demo-2 {launch.PYTHON} manage.py agent"


class _Started:
    """up's Supervisor, recording what it was given to start (and the metrics folder then)."""

    seen: dict = {}

    def __init__(self, procfile, env, cwd, log_dir):
        from django.conf import settings

        _Started.seen = {"procfile": procfile.read_text(), "env": env,
                         "metrics": sorted(p.name for p in settings.GPUFLEET_METRICS_DIR.iterdir())}

    def run(self):
        return 0


@pytest.mark.django_db
def test_it_empties_the_metrics_folder_before_it_starts_anything_and_passes_its_web_settings_on(
        monkeypatch, settings, tmp_path):
    from gpufleet.core.management.commands import up

    settings.DATA_DIR, settings.GPUFLEET_METRICS_DIR = tmp_path, tmp_path / "metrics"
    settings.GPUFLEET_METRICS_DIR.mkdir()
    # Left by an earlier run: a process of it that is long gone, and a metric since renamed.
    (settings.GPUFLEET_METRICS_DIR / "histogram_4242.db").write_bytes(b"\0" * 16)
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # no private Redis
    monkeypatch.setattr(up, "Supervisor", _Started)
    call_command("up", "--bind", "127.0.0.1:9000", "--web-workers", "3")
    assert _Started.seen["metrics"] == []
    assert _Started.seen["procfile"] == launch.up_procfile()
    assert (_Started.seen["env"]["GPUFLEET_BIND"], _Started.seen["env"]["GPUFLEET_WEB_WORKERS"]) == ("127.0.0.1:9000", "3")


@pytest.mark.parametrize("name", ["demo.1", "demo 1", ""])
def test_it_refuses_an_agent_name_that_is_no_queue_name(name):
    with pytest.raises(CommandError, match="letters, digits"):
        call_command("up", "--agent", name)


def test_it_puts_the_private_redis_first_without_tcp_append_only_and_with_its_aclfile(tmp_path):
    redis = launch.redis_server("/usr/bin/redis-server", tmp_path / "redis.sock", tmp_path / "users.acl")
    entries = parse_procfile(launch.up_procfile(redis=redis)).processes
    assert list(entries)[:2] == ["redis", "web"]
    assert f"--port 0 --unixsocket {tmp_path}/redis.sock --unixsocketperm 700 --save '' --appendonly yes" \
        " --appendfsync everysec" in entries["redis"]
    assert entries["redis"].endswith(f"--aclfile {tmp_path}/users.acl")


def _broker(monkeypatch, tmp_path, *, url: str | None, redis_installed: bool):
    from django.conf import settings

    from gpufleet.core.management.commands.up import Command

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if redis_installed:
        (bin_dir / "redis-server").write_text("#!/bin/sh\n")
        (bin_dir / "redis-server").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(settings, "PRIVATE_REDIS_PASSWORD_FILE", tmp_path / "redis-centre.password")
    monkeypatch.setattr(settings, "PRIVATE_REDIS_ACLFILE", tmp_path / "redis-users.acl")
    if url is None:
        monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    else:
        monkeypatch.setenv("CELERY_BROKER_URL", url)
    return Command()._broker()


def test_it_runs_a_private_redis_when_no_broker_is_set_and_redis_is_installed(monkeypatch, tmp_path, settings):
    url, redis = _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    password = (tmp_path / "redis-centre.password").read_text()
    assert url == f"redis+socket://gpufleet-centre:{password}@{settings.DATA_DIR / 'redis.sock'}"
    assert redis[0] == str(tmp_path / "bin" / "redis-server")


def test_its_private_redis_has_no_default_user_and_the_centre_keeps_its_password(monkeypatch, tmp_path):
    acl = tmp_path / "redis-users.acl"
    url, _ = _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    password_file = tmp_path / "redis-centre.password"
    assert oct(password_file.stat().st_mode & 0o777) == "0o600" and oct(acl.stat().st_mode & 0o777) == "0o600"
    lines = acl.read_text().splitlines()
    digest = hashlib.sha256(password_file.read_text().encode()).hexdigest()
    # Off, with rights: Redis replays its file's transactions as the default user.
    assert lines[0] == "user default reset off ~* &* +@all -@dangerous " + " ".join(
        f"+{c}" for c in broker_acl.CENTRE_ADMIN_COMMANDS)
    assert lines[1].startswith(f"user gpufleet-centre reset on #{digest} ~* &* +@all -@dangerous ")
    # A node enroll saved stays; the centre's password stays the same at the next start.
    acl.write_text(acl.read_text() + "user node:gpu-017 on #ab ~gpufleet:node:gpu-017:* -@all\n")
    (tmp_path / "bin").rename(tmp_path / "bin-before")
    again, _ = _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    assert again == url
    assert acl.read_text().splitlines() == [*lines, "user node:gpu-017 on #ab ~gpufleet:node:gpu-017:* -@all"]


def test_without_redis_server_it_says_what_to_install_and_stops(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        _broker(monkeypatch, tmp_path, url=None, redis_installed=False)
    assert stopped.value.code == 2
    assert "sudo apt-get install redis-server" in capsys.readouterr().err


def test_it_clears_a_dead_socket_left_by_a_killed_run(monkeypatch, tmp_path, settings):
    settings.PRIVATE_REDIS_SOCKET = tmp_path / "redis.sock"
    settings.PRIVATE_REDIS_SOCKET.write_text("")  # nothing answers on it
    url, redis = _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    assert url.endswith(f"@{settings.PRIVATE_REDIS_SOCKET}") and redis
    assert not settings.PRIVATE_REDIS_SOCKET.exists()


def test_a_data_dir_too_deep_for_a_unix_socket_is_refused_with_the_way_out(monkeypatch, tmp_path, settings, capsys):
    settings.PRIVATE_REDIS_SOCKET = tmp_path / ("d" * 120) / "redis.sock"
    with pytest.raises(SystemExit):
        _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    assert "set GPUFLEET_DATA_DIR to a shorter directory" in capsys.readouterr().err


def test_it_keeps_the_broker_that_is_set(monkeypatch, tmp_path):
    url = "redis://redis.example.internal:6379/0"
    assert _broker(monkeypatch, tmp_path, url=url, redis_installed=True) == (url, None)


def test_a_command_beside_up_finds_its_private_redis(tmp_path):
    env = {**os.environ, "GPUFLEET_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("CELERY_BROKER_URL", None)
    url = subprocess.run([sys.executable, "-c", "from gpufleet import settings; print(settings.CELERY_BROKER_URL)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert url == f"redis+socket://{tmp_path}/redis.sock"  # before up made the centre's password
    (tmp_path / "redis-centre.password").write_text("pw")
    url = subprocess.run([sys.executable, "-c", "from gpufleet import settings; print(settings.CELERY_BROKER_URL)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert url == f"redis+socket://gpufleet-centre:pw@{tmp_path}/redis.sock"


def test_it_refuses_to_start_beside_another_up_on_the_same_data_dir(monkeypatch, tmp_path, settings):
    import socket

    settings.PRIVATE_REDIS_SOCKET = tmp_path / "redis.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(settings.PRIVATE_REDIS_SOCKET))
        listening.listen()
        with pytest.raises(SystemExit) as stopped:
            _broker(monkeypatch, tmp_path, url=None, redis_installed=True)
    assert stopped.value.code == 2


def test_its_agents_log_in_as_their_own_nodes_users(monkeypatch, tmp_path, settings):
    import gpufleet.agent.management.commands.agent as agent_command

    monkeypatch.setattr(settings, "DATA_DIR", tmp_path)
    _broker(monkeypatch, tmp_path, url=None, redis_installed=True)  # no agents: none made
    assert not list(tmp_path.glob("agent-*.broker"))
    from gpufleet.core.management.commands.up import Command

    Command()._broker(["this-host", "demo-1"])
    acl = (tmp_path / "redis-users.acl").read_text()
    url = (tmp_path / "agent-demo-1.broker").read_text()
    assert url.startswith("redis+socket://node%3Ademo-1:") and url.endswith(f"@{settings.PRIVATE_REDIS_SOCKET}")
    assert "user node:demo-1 reset on #" in acl and "~gpufleet:node:demo-1:* " in acl and "user node:this-host " in acl
    # `manage.py agent` runs the worker with that URL, not the centre's that up's children inherit.
    ran = {}
    monkeypatch.setattr(settings, "GPUFLEET_NODE_NAME", "demo-1")
    monkeypatch.setattr(agent_command.os, "execve", lambda path, argv, env: ran.update(env))
    monkeypatch.setenv("CELERY_BROKER_URL", "redis+socket://gpufleet-centre:pw@/x.sock")
    call_command("agent")
    assert ran["CELERY_BROKER_URL"] == url and ran["GPUFLEET_NODE_NAME"] == "demo-1" and "DJANGO_SETTINGS_MODULE" not in ran
    # With a broker of its own choosing, up leaves none of those behind.
    Command()._broker(["this-host", "demo-1"])
    assert not list(tmp_path.glob("agent-*.broker"))
