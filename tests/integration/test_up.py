"""The README's first command on embedded defaults: `manage.py up` with SQLite and
its private Redis, on a
fake GPU host, with one more agent for a demo node. Then
the real mix under load: both beats ticking, the agents collecting, while a burst of
snapshots and "diagnose now" requests, sent by a command started beside `up` with
the same data dir, goes through that broker.
Then children killed: each is started again and the site carries on; every process
logs to a file under the data dir; SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import requests

from tests.conftest import missing_service
from tests.integration.workers import REPO
from tests.receivers import free_port
from tests.test_readme import readme_command, readme_commands

pytestmark = pytest.mark.integration

BURST_NODES, SNAPSHOTS_PER_NODE, DIAGNOSES = 200, 5, 5



def _query(db, sql, *args):
    with sqlite3.connect(db, timeout=20) as conn:
        return conn.execute(sql, args).fetchall()


def _wait(predicate, timeout, what, up):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except sqlite3.OperationalError:  # tables not there yet
            value = None
        if value:
            return value
        if up.poll() is not None:
            raise AssertionError(f"up exited with {up.returncode} while waiting for {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


BURST = textwrap.dedent(f"""
    from datetime import datetime, timedelta, timezone
    from gpufleet.core import broker
    from gpufleet.fleet.models import Node
    from gpufleet.jobs.services import request_diagnosis
    from django.contrib.auth import get_user_model
    from tests.factories import agent_entry, snapshot
    t0 = datetime.now(timezone.utc) - timedelta(minutes=1)
    node = Node.objects.get(name="this-host")
    admin = get_user_model().objects.get(username="admin")
    jobs = []
    for k in range({SNAPSHOTS_PER_NODE}):
        for n in range({BURST_NODES}):
            snap = snapshot(f"burst-{{n}}", gpus=1, at=t0 + timedelta(seconds=k))
            broker.append(agent_entry(snap))
        if k < {DIAGNOSES}:
            jobs.append(request_diagnosis(node, admin).pk)
    print("jobs", jobs)
""")


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as page:
            return page.status == 200
    except OSError:
        return False


def _started_pid(log: Path, name: str) -> int:
    return int(re.findall(rf"\| {name} started \(pid (\d+)\)", log.read_text())[-1])


def test_up_lists_this_host_and_survives_the_real_mix(fake_host, tmp_path):
    port = free_port()
    data = tmp_path / "data"
    env = {**os.environ, **fake_host.env(), "GPUFLEET_DATA_DIR": str(data), "GPUFLEET_NODE_NAME": "this-host",
           "GPUFLEET_COLLECT_INTERVAL": "2", "PYTHONUNBUFFERED": "1",
           # The burst sends each node SNAPSHOTS_PER_NODE snapshots within one interval.
           "GPUFLEET_INGEST_CAP_PER_INTERVAL": str(2 * SNAPSHOTS_PER_NODE)}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    if shutil.which("redis-server", path=env["PATH"]) is None:
        missing_service("redis-server is not installed (apt-get install redis-server)")
    killed_ones = ("web", "ingest", "redis")
    db = data / "gpufleet.sqlite3"
    # up writes through a description of its own, opened to append, and the test reads the
    # file anew each time: with one shared description (and so one offset) a seek of the
    # reader's moved up's next writes back over the start of the log.
    log = tmp_path / "up.log"
    started = time.monotonic()
    with open(log, "ab") as up_output:
        up = subprocess.Popen([sys.executable, "manage.py", "up", "--bind", f"127.0.0.1:{port}", "--agent", "demo-1"],
                              cwd=REPO, env=env, stdout=up_output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(lambda: _query(db, "select gpu_count from fleet_node where name='this-host'"), 60, "this host", up)
        listed_after = time.monotonic() - started
        print(f"this host listed {listed_after:.1f} s after start")
        assert _query(db, "select gpu_count, attach from fleet_node where name='this-host'") == [(8, "cdi")]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=10) as page:
            assert page.status == 200
        output = log.read_text()
        assert re.search(r"Admin login \(shown once\): admin / \S+", output)
        assert "broker private redis," in output

        burst = subprocess.run([sys.executable, "manage.py", "shell", "-c", BURST], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=120)
        assert burst.returncode == 0, burst.stderr
        jobs = [int(j) for j in re.findall(r"\d+", burst.stdout.split("jobs", 1)[1])]

        expected = BURST_NODES * SNAPSHOTS_PER_NODE
        samples = "select count(*) from fleet_devicesample s join fleet_device d on s.device_id=d.id " \
                  "join fleet_node n on d.node_id=n.id where n.name like 'burst-%'"
        _wait(lambda: _query(db, samples)[0][0] >= expected, 120, f"{expected} burst snapshots", up)
        assert _query(db, samples)[0][0] == expected  # none lost, none twice
        placeholders = ",".join("?" * len(jobs))
        done = f"select count(*) from jobs_job where id in ({placeholders}) and status='done'"
        try:
            _wait(lambda: _query(db, done, *jobs)[0][0] == len(set(jobs)), 60, "every diagnose-now job done", up)
        except AssertionError as exc:
            states = _query(db, f"select id, status, output, error from jobs_job where id in ({placeholders})", *jobs)
            raise AssertionError(f"{exc}: {states}") from None
        assert " exited with code " not in log.read_text(), "a process of up died under load"
        _wait(lambda: _query(db, "select gpu_count from fleet_node where name='demo-1'") == [(8,)], 30, "demo-1", up)

        # Kill the web, the ingest consumer and the Redis outright.
        seen = _query(db, "select max(last_seen) from fleet_node where name='this-host'")[0][0]
        pids = {name: _started_pid(log, name) for name in killed_ones}
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        _wait(lambda: _started_pid(log, "web") != pids["web"], 30, "the web started again", up)
        _wait(lambda: _healthz(port), 60, "the web answering again", up)
        print(f"web answering again {time.monotonic() - killed:.1f} s after the kill")
        _wait(lambda: _query(db, "select max(last_seen) from fleet_node where name='this-host'")[0][0] > seen,
              60, "a snapshot stored by the restarted ingest consumer", up)
        print(f"ingest storing again {time.monotonic() - killed:.1f} s after the kill")
        restarts = re.findall(r"\| (\w+) exited with code -9 .*; restarting in 1 s", log.read_text())
        assert sorted(restarts) == sorted(killed_ones)
    finally:
        up.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        try:
            up.wait(30)
            print(f"up stopped {time.monotonic() - stopping:.1f} s after SIGTERM")
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
        output = log.read_text()
    assert "Unrecoverable error" not in output
    assert up.returncode == 0, output[-3000:]
    for name in ("web", "ingest", "agent", "agent-demo-1"):
        assert re.search(rf"\| {name} +stopped \(exit code", output), name
    assert "GET /healthz HTTP/1.1\" 200" in (data / "logs" / "web.log").read_text()
    assert "ingest consumer" in (data / "logs" / "ingest.log").read_text()
    assert "agent.demo-1@" in (data / "logs" / "agent-demo-1.log").read_text()
    assert "agent-demo-1: env GPUFLEET_NODE_NAME=demo-1 " in (data / "Procfile").read_text()


def _as_the_shell_runs(line: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """A README command line as argv and environment: its leading NAME=value words set
    variables ($PWD and $PATH expanded), and .venv/bin/python is this interpreter."""
    words, env = shlex.split(line), dict(env)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value.replace("$PWD", str(REPO)).replace("$PATH", env["PATH"])
    return [sys.executable if w == ".venv/bin/python" else w for w in words], env


FORGED = textwrap.dedent("""
    from gpufleet import wire
    from gpufleet.celery import app
    from gpufleet.core import broker
    from tests.factories import snapshot
    # Signed with the key ghost would have, had it been enrolled.
    key = wire.derive_node_key(b"not this site's", "ghost", 1)
    broker.append(wire.encode_entry(key, "ghost", wire.SNAPSHOT, [wire.encode_snapshot(snapshot("ghost", gpus=1)), None]))
    # Under demo-1's own keys, the only ones its agent reads (as the centre sends jobs).
    with app.connection_for_write(transport_options={"global_keyprefix": wire.node_key_prefix("demo-1")}) as c:
        app.send_task("gpufleet.agent.tasks.collect", args=[1], kwargs={"auth": None}, queue="node.demo-1", connection=c)
""")
# Long enough for the housekeeping beat's 10 s job expiry and several 2 s offline checks.
QUIET_WINDOW_S = 12


def _the_demo_is_a_working_fleet_with_one_node_in_trouble(db: Path, log: Path, bind: str) -> None:
    healthy = _query(db, "select name, attach, health from fleet_node where name != 'demo-h100' order by name")
    assert [(name, attach) for name, attach, _ in healthy] == [
        ("demo-1", "cdi"), ("demo-2", "cdi"), ("demo-a40", "cdi"), ("this-host", "cdi")], healthy
    assert all(health != "fail" for _, _, health in healthy), healthy
    failing = _query(db, "select f.code from fleet_finding f join fleet_node n on f.node_id=n.id "
                         "where n.name='demo-h100' and f.status='fail' order by f.code")
    assert failing == [("gpu2.thermal",), ("gpu5.ecc",), ("gpu7.power",)]  # heat, ECC errors, a power brake

    # The admin `up` printed logs in, finds a node and claims two of its GPUs.
    [password] = re.findall(r"Admin login \(shown once\): admin / (\S+)", log.read_text())
    site, session = f"http://{bind}", requests.Session()
    login = session.get(f"{site}/accounts/login/", timeout=30)
    session.post(f"{site}/accounts/login/", timeout=30, headers={"Referer": login.url},
                 data={"username": "admin", "password": password, "csrfmiddlewaretoken": session.cookies["csrftoken"]})
    found = session.get(f"{site}/api/placement", params={"count": 2}, timeout=30)
    assert found.status_code == 200, found.text
    assert "demo-1" in found.text and "demo-a40" in found.text, found.text
    sent = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": f"{site}/"}
    # A fresh site has no team: the admin makes one (docs/teams.md), then books for it.
    refused = session.post(f"{site}/api/nodes/demo-1/claims/", json={"name": "first-claim", "count": 2}, timeout=30,
                           headers=sent)
    assert refused.status_code == 422 and "make one first" in refused.json()["error"]["message"], refused.text
    team = session.post(f"{site}/api/teams/", json={"name": "demo", "leads": ["admin"]}, timeout=30, headers=sent)
    assert team.status_code == 201, team.text
    claim = session.post(f"{site}/api/nodes/demo-1/claims/", json={"name": "first-claim", "count": 2}, timeout=30,
                         headers=sent)
    assert claim.status_code == 201, claim.text
    claims = session.get(f"{site}/claims/", timeout=30)
    assert claims.status_code == 200 and "first-claim" in claims.text and "demo-1" in claims.text

    # The node in trouble offers the fix its agent allows.
    page = session.get(f"{site}/nodes/demo-h100/", timeout=30)
    assert page.status_code == 200 and "Apply fix…" in page.text


def test_the_readme_demo_runs_as_shown_and_up_prints_each_line_once(fake_host, tmp_path):
    data = tmp_path / "data"
    env = {**os.environ, **fake_host.env(), "GPUFLEET_DATA_DIR": str(data), "GPUFLEET_NODE_NAME": "this-host",
           "GPUFLEET_BIND": f"127.0.0.1:{free_port()}", "GPUFLEET_COLLECT_INTERVAL": "2", "PYTHONUNBUFFERED": "1",
           "PYTHON": sys.executable}
    # A newcomer has no Docker of their own: the demo brings its fake ones.
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "LOG_LEVEL", "DOCKER_HOST"):
        env.pop(name, None)
    if shutil.which("redis-server", path=env["PATH"]) is None:
        missing_service("redis-server is not installed (apt-get install redis-server)")
    db, log, agent_log = data / "gpufleet.sqlite3", tmp_path / "up.log", tmp_path / "demo-agent.log"
    argv, up_env = _as_the_shell_runs(readme_command("PATH=$PWD/tests/fakes/bin:$PATH "), env)
    with open(log, "ab") as out:
        up = subprocess.Popen(argv, cwd=REPO, env=up_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    agents = []
    try:
        for node in ("demo-1", "demo-2"):
            _wait(lambda node=node: _query(db, "select gpu_count from fleet_node where name=?", node) == [(8,)], 60,
                  node, up)
        quiet_from = time.monotonic()
        with open(agent_log, "ab") as out:
            for line in readme_commands("sh gpufleet/demo-agent "):
                agents.append(subprocess.Popen(shlex.split(line), cwd=REPO, env=env, stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True))
        # Enrolled by the script, each node is stored: eight GPUs of its recording, a problem in one line.
        for name, model in (("demo-a40", "A40"), ("demo-h100", "H100")):
            _wait(lambda name=name: _query(db, "select gpu_count from fleet_node where name=?", name) == [(8,)], 60,
                  name, up)
            [(models, problem)] = _query(db, "select gpu_models, problem from fleet_node where name=?", name)
            assert model in models and "Traceback" not in problem, (name, models, problem)
        _the_demo_is_a_working_fleet_with_one_node_in_trouble(db, log, up_env["GPUFLEET_BIND"])

        forged = subprocess.run([sys.executable, "manage.py", "shell", "-c", FORGED], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60)
        assert forged.returncode == 0, forged.stderr
        _wait(lambda: "ingest entries of node 'ghost'" in log.read_text()
              and "refused gpufleet.agent.tasks.collect" in log.read_text(), 30, "the forged messages refused", up)
        time.sleep(max(0.0, QUIET_WINDOW_S - (time.monotonic() - quiet_from)))
    finally:
        for proc in (*agents, up):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text()
    assert up.returncode == 0, output[-3000:]
    agent_output = agent_log.read_text()
    assert "demo-a40 enrolled" in agent_output and "demo-h100 enrolled" in agent_output, agent_output[-3000:]
    assert "not enrolled" not in agent_output
    # Each line once: a worker's handler and ours both printed every line of its own.
    [refused] = re.findall(r".*refused 1 ingest entries of node 'ghost'.*", output)
    assert "manage.py enroll NAME" in refused  # an unenrolled agent is told how to enrol it
    assert len(re.findall(r"refused gpufleet\.agent\.tasks\.collect", output)) == 1
    # No Celery chatter for each beat tick and task, no warning for running as root.
    for chatter in ("Sending due task", "] received", "] succeeded in", "superuser privileges", "SecurityWarning"):
        assert chatter not in output, chatter
