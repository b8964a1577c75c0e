"""The systemd units in gpufleet/deploy/ each run exactly `manage.py <command>`, and
`up`'s Procfile runs the same commands: what a process runs lives in its command
(gpufleet/core/launch.py) and its settings in the environment file, never in a copy of a
command line in a unit. The central processes start after the metrics directory was
emptied, once per start of the site."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from django.core.management import call_command, get_commands
from honcho.environ import parse_procfile

from gpufleet.core import launch

DEPLOY = Path(launch.__file__).resolve().parents[1] / "deploy"
CHECKOUT, VENV_PYTHON = "/opt/gpufleet", "/opt/gpufleet/.venv/bin/python"
UNITS = {
    "gpufleet-web.service": "web",
    "gpufleet-ingest.service": "ingest",
    "gpufleet-beat.service": "beat",
    "gpufleet-agent.service": "agent",
    "gpufleet-metrics.service": "clearmetrics",
}
CENTRAL = ("gpufleet-web.service", "gpufleet-ingest.service", "gpufleet-beat.service")


def _env_file(name: str) -> dict[str, str]:
    lines = (DEPLOY / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


DATA = Path(_env_file("central.env.example")["GPUFLEET_DATA_DIR"])


def _section(unit: str, section: str = "Service") -> dict[str, str]:
    """A section's settings of a unit (each key once, as ours are written)."""
    text = (DEPLOY / unit).read_text().split(f"[{section}]", 1)[1].split("\n[", 1)[0]
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _argv(exec_start: str) -> list[str]:
    return [launch.PYTHON if arg == VENV_PYTHON else arg for arg in shlex.split(exec_start)]


def test_it_has_a_check_for_every_unit():
    assert sorted(p.name for p in DEPLOY.glob("*.service")) == sorted(UNITS)


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_each_unit_runs_exactly_one_manage_py_command(unit):
    service = _section(unit)
    assert service["ExecStart"] == f"{VENV_PYTHON} manage.py {UNITS[unit]}"
    assert UNITS[unit] in get_commands()
    assert service["WorkingDirectory"] == CHECKOUT  # where the relative "manage.py" is
    env_file = Path(service["EnvironmentFile"])
    assert env_file.parent == Path("/etc/gpufleet")
    assert (DEPLOY / f"{env_file.name}.example").is_file()


def test_it_runs_what_up_runs():
    procfile = launch.up_procfile(["demo-1"])
    entries = {name: shlex.split(line) for name, line in parse_procfile(procfile).processes.items()}
    for name, unit in (("web", "gpufleet-web.service"), ("ingest", "gpufleet-ingest.service"),
                       ("beat", "gpufleet-beat.service"), ("agent", "gpufleet-agent.service")):
        assert entries[name] == _argv(_section(unit)["ExecStart"]) == launch.command(name)
    assert entries["agent-demo-1"] == ["env", "GPUFLEET_NODE_NAME=demo-1", *entries["agent"]]


@pytest.mark.parametrize("unit", CENTRAL)
def test_the_central_processes_start_after_the_metrics_directory_was_emptied(unit):
    # Requires= + After=: started after it; and restarting it restarts them around it.
    assert "gpufleet-metrics.service" in _section(unit, "Unit")["Requires"].split()
    assert "gpufleet-metrics.service" in _section(unit, "Unit")["After"].split()
    assert _section(unit)["EnvironmentFile"] == _section("gpufleet-metrics.service")["EnvironmentFile"]


def test_the_metrics_directory_is_emptied_once_per_start_of_the_site():
    service = _section("gpufleet-metrics.service")
    # Run once, then active while any central process needs it (a restart of one of them
    # does not run it again), stopped with the last of them (the next start runs it again).
    assert (service["Type"], service["RemainAfterExit"]) == ("oneshot", "yes")
    assert _section("gpufleet-metrics.service", "Unit")["StopWhenUnneeded"] == "yes"
    assert "Install" not in (DEPLOY / "gpufleet-metrics.service").read_text()  # pulled in, never enabled


def test_the_web_serves_as_the_environment_file_says(monkeypatch, settings):
    import gpufleet.core.management.commands.web as web

    central = _env_file("central.env.example")
    settings.GPUFLEET_BIND, settings.GPUFLEET_WEB_WORKERS = central["GPUFLEET_BIND"], int(central["GPUFLEET_WEB_WORKERS"])
    ran = []
    monkeypatch.setattr(web.os, "execv", lambda path, argv: ran.append(argv))
    call_command("web")
    assert ran == [launch.gunicorn("127.0.0.1:8000", 4, settings.GPUFLEET_WEB_THREADS, settings.GPUFLEET_WEB_TIMEOUT)]


def test_it_keeps_agent_and_central_on_the_same_data_dir():
    assert _env_file("agent.env.example")["GPUFLEET_DATA_DIR"] == str(DATA)
    assert "DATABASE_URL" not in _env_file("agent.env.example")  # an agent never gets database credentials
