"""No dead code in gpufleet/: vulture finds nothing unused there, beyond the names in
tests/vulture_whitelist.py that frameworks, templates or getattr use by name. (ruff's
F401 and F841 already catch unused imports and local variables.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.conftest import missing_service

REPO = Path(__file__).resolve().parents[1]
# Functions registered by their decorator, which vulture cannot follow: template tags and
# filters, admin classes and actions, Celery tasks, the API's routes and error handlers,
# signal receivers, pydantic validators, and the pages' access and pagination wrappers.
REGISTERED_BY = ("@register.*", "@admin.register", "@admin.action", "@shared_task", "@api.*", "@receiver",
                 "@worker_ready.connect", "@field_validator", "@model_validator", "@read", "@paginate",
                 "@router.*")
# Classes Django finds by their place, whatever their module says: each app's AppConfig
# and each management command.
FOUND_BY_PLACE = ("*Config", "Command")


def _vulture(*paths: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vulture", *paths, "tests/vulture_whitelist.py", "--min-confidence", "60",
         "--exclude", "*/migrations/*", "--ignore-decorators", ",".join(REGISTERED_BY),
         "--ignore-names", ",".join(FOUND_BY_PLACE)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_gpufleet_has_no_dead_code():
    if importlib.util.find_spec("vulture") is None:
        missing_service("vulture is not installed (requirements-dev.txt)")
    found = _vulture("gpufleet")
    assert found.stdout.splitlines() == [] and found.returncode == 0, found.stderr


def test_the_dead_code_check_finds_an_unused_function(tmp_path):
    if importlib.util.find_spec("vulture") is None:
        missing_service("vulture is not installed (requirements-dev.txt)")
    module = tmp_path / "leftover.py"
    module.write_text("def used():\n    return 1\n\n\ndef never_called():\n    return used()\n")
    assert [line.split(": ", 1)[1] for line in _vulture(str(module)).stdout.splitlines()] == [
        "unused function 'never_called' (60% confidence)"]
