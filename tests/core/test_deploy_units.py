"""The systemd units in gpufleet/deploy/ run the command lines of gpufleet/core/launch.py,
and `up`'s Procfile runs the same ones where the two overlap, so neither can drift."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from honcho.environ import parse_procfile

from gpufleet.core import launch

DEPLOY = Path(launch.__file__).resolve().parents[1] / "deploy"
CHECKOUT, VENV_PYTHON = "/opt/gpufleet", "/opt/gpufleet/.venv/bin/python"


def _env_file(name: str) -> dict[str, str]:
    lines = (DEPLOY / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


DATA = Path(_env_file("central.env.example")["GPUFLEET_DATA_DIR"])
UNITS = {
    "gpufleet-web.service": launch.web("127.0.0.1:8000", 4),
    "gpufleet-ingest.service": launch.ingest(),
    "gpufleet-beat.service": launch.central_beat(DATA),
    "gpufleet-agent.service": launch.agent(),
}


def _service(name: str) -> dict[str, str]:
    """The [Service] settings of a unit (each key once, as ours are written)."""
    text = (DEPLOY / name).read_text().split("[Service]", 1)[1].split("\n[", 1)[0]
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _argv(exec_start: str) -> list[str]:
    # "%%" is systemd's escape for a literal "%" (celery's "%h" host name).
    argv = shlex.split(exec_start.replace("%%", "%"))
    return [launch.PYTHON if arg == VENV_PYTHON else arg for arg in argv]


def test_it_has_a_check_for_every_unit():
    assert sorted(p.name for p in DEPLOY.glob("*.service")) == sorted(UNITS)


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_it_runs_the_command_line_of_processes_py(unit):
    service = _service(unit)
    assert _argv(service["ExecStart"]) == UNITS[unit]
    assert service["WorkingDirectory"] == CHECKOUT  # where the relative "manage.py" is
    env_file = Path(service["EnvironmentFile"])
    assert env_file.parent == Path("/etc/gpufleet")
    assert (DEPLOY / f"{env_file.name}.example").is_file()


def test_it_runs_what_up_runs():
    procfile = launch.up_procfile("127.0.0.1:8000", 4, DATA, ["demo-1"])
    entries = {name: shlex.split(line) for name, line in parse_procfile(procfile).processes.items()}
    assert entries["web"] == _argv(_service("gpufleet-web.service")["ExecStart"])
    assert entries["agent"] == _argv(_service("gpufleet-agent.service")["ExecStart"])
    assert entries["agent-demo-1"] == ["env", "GPUFLEET_NODE_NAME=demo-1", *entries["agent"]]
    assert entries["housekeeping"] == _argv(_service("gpufleet-beat.service")["ExecStart"])
    # `up` runs one consumer of the ingest stream; the site as many as it likes.
    assert entries["ingest"] == _argv(_service("gpufleet-ingest.service")["ExecStart"]) == launch.ingest()


def test_it_keeps_agent_and_central_on_the_same_data_dir():
    assert _env_file("agent.env.example")["GPUFLEET_DATA_DIR"] == str(DATA)
    assert "DATABASE_URL" not in _env_file("agent.env.example")  # an agent never gets database credentials
