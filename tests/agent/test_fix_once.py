"""A fix job runs at most once per job id, even across agent restarts: the agent keeps
the ids of the fix jobs it ran in a small file under its data dir, for as long as the
centre's signature of each could still be accepted (GPUFLEET_JOB_TIMEOUT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet import wire
from gpufleet.agent import jobs_run
from gpufleet.fleet import credentials

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]

# One agent process: it takes one apply_fix as Celery would hand it over, with the
# host's fix and the sending stubbed, and prints the codes of the fixes it ran.
AGENT = """
import json, sys
import django
django.setup()
from gpufleet.agent import tasks as agent
from gpufleet.agent.fixes import FixRun
runs = []
agent.run_fix = lambda code: runs.append(code) or FixRun(True, "done")
agent.send_to_centre = lambda *args, **kwargs: None
agent.snapshot_this_host = lambda: {"node": "alpha"}
job_id, code, auth = json.loads(sys.argv[1])
agent.apply_fix.run(job_id, code, auth=auth)
print(json.dumps(runs))
"""


def _agent_process(data_dir: Path, key: wire.NodeKey, job_id: int, auth: dict) -> list[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "GPUFLEET_DATA_DIR": str(data_dir),
           "GPUFLEET_NODE_NAME": "alpha", "GPUFLEET_AGENT_KEY": str(key), "GPUFLEET_AGENT_FIXES": "cdi"}
    done = subprocess.run([sys.executable, "-c", AGENT, json.dumps([job_id, "cdi", auth])], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_signed_fix_replayed_after_the_agent_restarts_runs_nothing(tmp_path):
    key = credentials.enroll("alpha")
    auth = credentials.sign_for_agent("alpha", wire.APPLY_FIX_TASK, [11, "cdi"])
    assert _agent_process(tmp_path, key, 11, auth) == ["cdi"]
    # A new agent process (restarted), the same signed request replayed from the broker.
    assert _agent_process(tmp_path, key, 11, auth) == []
    other = credentials.sign_for_agent("alpha", wire.APPLY_FIX_TASK, [12, "cdi"])
    assert _agent_process(tmp_path, key, 12, other) == ["cdi"]


def test_it_remembers_a_job_in_its_file_until_the_signature_expires(settings):
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_JOB_TIMEOUT = "alpha", 60.0
    now = time.time()
    ran = jobs_run.for_this_agent()
    assert not ran.ran(11, now)
    ran.record(11, now, signed_at=now - 5)
    assert jobs_run.for_this_agent().ran(11, now + 1)  # what a restarted agent reads
    # Past the signature's validity a replay is refused by its age; the id may go.
    jobs_run.for_this_agent().record(12, now + 56, signed_at=now + 56)
    assert json.loads(ran.path.read_text()).keys() == {"11", "12"}
    jobs_run.for_this_agent().record(13, now + 61, signed_at=now + 61)
    assert json.loads(ran.path.read_text()).keys() == {"12", "13"}
    assert not jobs_run.for_this_agent().ran(11, now + 61)


def test_a_signature_from_a_clock_ahead_is_remembered_until_it_expires(settings):
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_JOB_TIMEOUT = "alpha", 60.0
    now = time.time()
    jobs_run.for_this_agent().record(11, now, signed_at=now + 300)
    assert jobs_run.for_this_agent().ran(11, now + 330)


def test_the_file_is_replaced_whole_and_private(settings, agent_data_dir, monkeypatch):
    settings.GPUFLEET_NODE_NAME = "alpha"
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append(Path(dst)) or real_replace(src, dst))
    ran = jobs_run.for_this_agent()
    ran.record(11, time.time(), signed_at=time.time())
    assert replaced == [ran.path] and ran.path.parent == agent_data_dir
    assert ran.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in agent_data_dir.iterdir()] == [ran.path.name]


def test_an_unreadable_file_runs_no_fix_and_says_which(settings, caplog):
    settings.GPUFLEET_NODE_NAME = "alpha"
    ran = jobs_run.for_this_agent()
    ran.path.parent.mkdir(parents=True, exist_ok=True)
    ran.path.write_text("{not json")
    assert ran.ran(99, time.time())
    assert str(ran.path) in caplog.text


def test_each_node_of_a_host_keeps_its_own(settings):
    settings.GPUFLEET_NODE_NAME = "alpha"
    alpha = jobs_run.for_this_agent()
    settings.GPUFLEET_NODE_NAME = "bravo"
    assert jobs_run.for_this_agent().path != alpha.path
