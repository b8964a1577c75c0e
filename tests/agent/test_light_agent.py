"""The agent as a GPU host runs it (processes.agent_worker, the line `manage.py agent` runs)
loads neither Django's database layer nor the site's settings and apps, so it can open no
database connection; it still collects and sends under its node's own broker user."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from gpufleet import wire
from gpufleet.core import broker_acl, processes
from tests.acl_redis import STREAM, running

REPO = Path(__file__).resolve().parents[2]
NODE = "light-1"
# What only the site needs: a database layer, its settings and apps, a database driver.
SITE_ONLY = ("django.db", "django.apps", "django.contrib", "gpufleet.settings", "gpufleet.fleet", "psycopg",
             "sqlite3")


# processes.agent_worker's `python -m celery ...`, which also writes down the modules it
# has loaded when it exits (after its collections).
RUN_AND_LIST_MODULES = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv[0] = "celery"
runpy.run_module("celery", run_name="__main__", alter_sys=True)
"""


def test_the_agent_collects_and_sends_without_loading_the_site_or_a_database_driver(fake_host, tmp_path):
    key = wire.NodeKey(1, os.urandom(32))
    for server in running():
        centre = server.centre()
        broker_acl.put_node_user(centre, NODE, "node-password", STREAM)
        env = {
            **os.environ, **fake_host.env(),
            "CELERY_BROKER_URL": broker_acl.node_url(NODE, "node-password", server.url()),
            "GPUFLEET_INGEST_STREAM": STREAM, "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_NODE_NAME": NODE,
            "GPUFLEET_AGENT_KEY": str(key), "GPUFLEET_COLLECT_INTERVAL": "1", "GPUFLEET_ROLE": "agent",
            # Neither may bring Django in: not Celery's Django fixup, nor a database URL.
            "DJANGO_SETTINGS_MODULE": "gpufleet.settings", "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none",
        }
        argv, modules, log = processes.agent_worker(NODE, tmp_path), tmp_path / "modules", tmp_path / "agent.log"
        assert argv[1:3] == ["-m", "celery"]
        with log.open("w") as out:
            agent = subprocess.Popen([argv[0], "-c", RUN_AND_LIST_MODULES, str(modules), *argv[3:]], cwd=REPO,
                                     env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while centre.xlen(STREAM) < 2 and time.monotonic() < deadline and agent.poll() is None:
                time.sleep(0.1)
        finally:
            agent.terminate()
            agent.wait(30)
        output = log.read_text()
        entries = centre.xrange(STREAM)
        assert len(entries) >= 2, output[-3000:]
        entry = wire.read_entry(entries[0][1])
        assert entry.node == NODE and wire.entry_signed_with(entry, key)
        imported = modules.read_text().split()
        assert "gpufleet.agent.tasks" in imported, output[-3000:]
        assert sorted(m for m in imported if m.startswith(SITE_ONLY)) == []
