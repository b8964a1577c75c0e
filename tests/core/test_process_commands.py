"""The long-running processes as manage.py commands: `web` and `beat` become the
programs of gpufleet/core/launch.py with the settings' values (the pid stays the same, so
systemd and `up` watch and signal the program itself); `clearmetrics` empties the
prometheus-client directory before a start."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from gpufleet.core import launch


@pytest.fixture
def execs(monkeypatch):
    ran = []
    monkeypatch.setattr("os.execv", lambda path, argv: ran.append((path, argv)))
    return ran


def test_web_runs_gunicorn_where_the_settings_say(execs, settings):
    settings.GPUFLEET_BIND, settings.GPUFLEET_WEB_WORKERS = "0.0.0.0:8123", 3
    settings.GPUFLEET_WEB_THREADS, settings.GPUFLEET_WEB_TIMEOUT = 6, 45
    call_command("web")
    [(path, argv)] = execs
    assert argv == launch.gunicorn("0.0.0.0:8123", 3, 6, 45) and path == argv[0] == launch.PYTHON
    assert argv[1:4] == ["-m", "gunicorn", "gpufleet.wsgi"]
    assert argv[argv.index("--bind") + 1] == "0.0.0.0:8123" and argv[argv.index("--workers") + 1] == "3"
    # Threads, not sync workers: a long download must not be killed at the timeout.
    assert argv[argv.index("--worker-class") + 1] == "gthread"
    assert argv[argv.index("--threads") + 1] == "6" and argv[argv.index("--timeout") + 1] == "45"


def test_web_options_override_the_settings(execs, settings):
    settings.GPUFLEET_BIND, settings.GPUFLEET_WEB_WORKERS = "0.0.0.0:8123", 3
    call_command("web", "--bind", "127.0.0.1:9000", "--workers", "1")
    assert execs[0][1] == launch.gunicorn("127.0.0.1:9000", 1, settings.GPUFLEET_WEB_THREADS, settings.GPUFLEET_WEB_TIMEOUT)


def test_beat_runs_the_central_beat_with_its_housekeeping_worker(execs, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    call_command("beat")
    [(path, argv)] = execs
    assert argv == launch.central_beat(tmp_path) and path == argv[0]
    assert "-B" in argv and argv[argv.index("-Q") + 1] == "housekeeping"
    assert argv[argv.index("-s") + 1] == str(tmp_path / "beat-central")


def test_clearmetrics_removes_the_files_of_an_earlier_run_and_nothing_else(settings, tmp_path):
    settings.GPUFLEET_METRICS_DIR = tmp_path / "metrics"
    settings.GPUFLEET_METRICS_DIR.mkdir()
    stale = [settings.GPUFLEET_METRICS_DIR / name for name in ("histogram_4242.db", "counter_4242.db")]
    for path in stale:
        path.write_bytes(b"\0" * 16)
    other = settings.GPUFLEET_METRICS_DIR / "README"
    other.write_text("not prometheus-client's")
    call_command("clearmetrics")
    assert not any(path.exists() for path in stale)
    assert other.exists()
    call_command("clearmetrics")  # nothing to remove: fine
    (tmp_path / "metrics").rename(tmp_path / "gone")
    call_command("clearmetrics")  # no directory yet: made
    assert settings.GPUFLEET_METRICS_DIR.is_dir()
