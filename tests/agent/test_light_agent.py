"""The agent as a GPU host runs it (launch.agent_worker, the line `manage.py agent` runs)
loads no Django at all, nor pydantic, nor the site's settings and apps, so it can open no
database connection; it still collects and sends under its node's own broker user, and its
memory does not grow from one collection to the next. Its budget (64 MiB for its process tree)
is a figure of `manage.py bench`, measured beside the bare commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpufleet import wire
from gpufleet.core import broker, broker_acl, launch
from gpufleet.fleet import broker_users
from tests.acl_redis import STREAM, running
from tests.conftest import HANG_S

REPO = Path(__file__).resolve().parents[2]
NODE = "light-1"
# What only the site needs: Django, the schema's pydantic, its settings and apps, a database driver.
SITE_ONLY = ("django", "pydantic", "gpufleet.settings", "gpufleet.fleet", "gpufleet.ingest", "psycopg", "sqlite3")
# Collections watched after the first (its imports, a first look at the host): its memory
# over the last SETTLED of them may not pass the most it held over the first SETTLED by more
# than GROWTH, far more than what it keeps per collection, far less than a snapshot kept each.
COLLECTIONS = 8
SETTLED = 3
GROWTH = 1.25


# launch.agent_worker's `python -m gpufleet.agent`, which also writes down the modules it
# has loaded when it exits (after its collections).
RUN_AND_LIST_MODULES = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(m for m, v in sys.modules.items() if v is not None))))
runpy.run_module("gpufleet.agent", run_name="__main__", alter_sys=True)
"""


def test_the_agent_collects_and_sends_without_loading_the_site_or_a_database_driver(fake_host, tmp_path, settings):
    key = wire.NodeKey(1, os.urandom(32))
    settings.GPUFLEET_INGEST_STREAM = STREAM
    stream_key = broker.ingest_key()
    for server in running():
        centre = server.centre()
        broker_users.prepare(centre)
        broker_acl.put_node_user(centre, NODE, "node-password", stream_key)
        env = {
            **os.environ, **fake_host.env(),
            "CELERY_BROKER_URL": broker_acl.node_url(NODE, "node-password", server.url()),
            "GPUFLEET_INGEST_STREAM": STREAM, "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_NODE_NAME": NODE,
            "GPUFLEET_AGENT_KEY": str(key), "GPUFLEET_COLLECT_INTERVAL": "1",
            # Neither may bring Django in: not Celery's Django fixup, nor a database URL.
            "DJANGO_SETTINGS_MODULE": "gpufleet.settings", "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        }
        argv, modules, log = launch.agent_worker(), tmp_path / "modules", tmp_path / "agent.log"
        assert argv[1:] == ["-m", "gpufleet.agent"]
        with log.open("w") as out:
            agent = subprocess.Popen([argv[0], "-c", RUN_AND_LIST_MODULES, str(modules)], cwd=REPO,
                                     env=env, stdout=out, stderr=subprocess.STDOUT)
        held: dict[int, int] = {}  # the most the agent itself held while n collections were sent
        try:
            deadline = time.monotonic() + HANG_S
            while (sent := centre.xlen(stream_key)) <= COLLECTIONS and time.monotonic() < deadline \
                    and agent.poll() is None:
                if sent:
                    held[sent] = max(held.get(sent, 0), _own_rss(agent.pid))
                time.sleep(0.02)
        finally:
            agent.terminate()
            agent.wait(30)
        output = log.read_text()
        entries = centre.xrange(stream_key)
        assert len(entries) > COLLECTIONS, output[-3000:]
        entry = wire.read_entry(entries[0][1])
        assert entry.node == NODE and wire.entry_signed_with(entry, key)
        # kombu's redelivery sweep (its lock, released by EVALSHA of the script the centre
        # loaded) and the appends run within the node's rights.
        assert "permission" not in output.lower() and "NOPERM" not in output, output[-3000:]
        imported = modules.read_text().split()
        assert "gpufleet.agent.tasks" in imported, output[-3000:]
        assert sorted(m for m in imported if m.startswith(SITE_ONLY)) == []
        first = max((rss for n, rss in held.items() if n <= SETTLED), default=0)
        last = max((rss for n, rss in held.items() if n > COLLECTIONS - SETTLED), default=0)
        mib = {n: round(rss / 2**20, 1) for n, rss in sorted(held.items())}
        assert first > 0 and 0 < last <= GROWTH * first, f"MiB held by the agent after n collections: {mib}"


def _own_rss(pid: int) -> int:
    """The agent's own resident memory, without the commands it runs (which a loaded machine
    keeps alive longer, and the bench counts)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    except OSError:
        return 0


SITE_AND_AGENT = """
import dataclasses, json
from gpufleet import settings
from gpufleet.core import agent_settings
agent = agent_settings.from_environment()
print(json.dumps({f.name: [str(getattr(agent, f.name)), str(getattr(settings, f.name))]
                  for f in dataclasses.fields(agent)}))
"""


def test_the_site_and_the_agent_read_the_same_variables_alike(tmp_path):
    env = {**os.environ, "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_NODE_NAME": "gpu-9", "GPUFLEET_AGENT_FIXES": "cdi, runtime",
           "GPUFLEET_COLLECT_INTERVAL": "7", "GPUFLEET_JOB_TIMEOUT": "90", "GPUFLEET_INGEST_STREAM": "s:1",
           "GPUFLEET_BROKER_VISIBILITY_TIMEOUT": "42"}
    for name in ("CELERY_BROKER_URL", "GPUFLEET_AGENT_KEY", "DATABASE_URL"):
        env.pop(name, None)
    (tmp_path / "agent-gpu-9.key").write_text("1.a-key-left-by-up")
    done = subprocess.run([sys.executable, "-c", SITE_AND_AGENT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    values = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: pair for name, pair in values.items() if pair[0] != pair[1]} == {}
    assert values["GPUFLEET_AGENT_FIXES"][0] == "['cdi', 'runtime']"
    assert values["GPUFLEET_AGENT_KEY"][0] == "1.a-key-left-by-up"
    assert values["CELERY_BROKER_URL"][0] == f"redis+socket://{tmp_path / 'redis.sock'}"
