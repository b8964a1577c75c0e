"""Every task a beat schedules is registered in a worker as it starts: a fresh
interpreter that loads the Celery app as its worker does (`celery -A gpufleet.celery
worker`, or the agent's `python -m gpufleet.agent`), so
only the app's own task discovery counts, never a module some test imported. A task
the worker does not know is dropped with a KeyError in its log (claims' expiry was,
every minute, until it was discovered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOAD_AS_A_WORKER = """
import json
import django
django.setup()
from django.conf import settings
from gpufleet import wire
from gpufleet.celery import app
app.loader.import_default_modules()
print(json.dumps({"registered": sorted(app.tasks),
                  "wanted": sorted({e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
                                   | {wire.COLLECT_TASK, wire.APPLY_FIX_TASK})}))
"""


# The agent's app (gpufleet/agent/app.py), as `python -m gpufleet.agent` loads it.
LOAD_THE_AGENT = """
import json
from gpufleet import wire
from gpufleet.agent.app import app
app.loader.import_default_modules()
print(json.dumps({"registered": sorted(app.tasks),
                  "wanted": sorted({e["task"] for e in app.conf.beat_schedule.values()}
                                   | {wire.COLLECT_TASK, wire.APPLY_FIX_TASK})}))
"""


@pytest.mark.parametrize("program", [LOAD_AS_A_WORKER, LOAD_THE_AGENT], ids=["central", "agent"])
def test_every_task_a_beat_schedules_or_the_centre_sends_is_registered(program):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpufleet.settings"}
    proc = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(tasks["wanted"]) - set(tasks["registered"]) == set()
