"""Every task is named by its function's path, the names the centre sends an agent
(wire.COLLECT_TASK, wire.APPLY_FIX_TASK) included: a name that is not its function's
path is a second name to keep in step with the code."""

from __future__ import annotations

import importlib
from pathlib import Path

from celery import current_app

from gpufleet import wire

REPO = Path(__file__).resolve().parents[2]


def test_each_task_is_named_by_its_functions_path():
    for path in sorted((REPO / "gpufleet").glob("*/tasks.py")):
        importlib.import_module(f"gpufleet.{path.parent.name}.tasks")
    ours = {name: f"{task.run.__module__}.{task.run.__name__}" for name, task in current_app.tasks.items()
            if task.run.__module__.startswith("gpufleet.")}
    assert {wire.COLLECT_TASK, wire.APPLY_FIX_TASK} <= set(ours)
    assert {name: path for name, path in ours.items() if name != path} == {}
