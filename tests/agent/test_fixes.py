"""Agent fixes: fixed commands owned by the agent, only for allowed codes."""

from __future__ import annotations

import json

import pytest

from gpufleet import gpu
from gpufleet.agent import fixes
from gpufleet.gpu import CommandResult, DockerInfo
from tests.fakes.memory import FakeDocker, host
from tests.fakes.recorded import DATA_DIR, recording


class RecordingRunner:
    def __init__(self, results=None):
        self.calls = []
        self.results = results or {}

    def run(self, argv, timeout=10.0):
        self.calls.append(tuple(argv))
        return self.results.get(tuple(argv), CommandResult(tuple(argv), 0, stdout="ok\n"))


def test_nothing_is_allowed_by_default(settings):
    settings.GPUFLEET_AGENT_FIXES = []
    runner = RecordingRunner()
    result = fixes.apply_fix("cdi", runner)
    assert not result.ok and "does not allow" in result.error
    assert runner.calls == []


def test_unknown_codes_in_the_setting_are_ignored(settings):
    settings.GPUFLEET_AGENT_FIXES = ["cdi", "rm -rf /", "driver"]
    assert fixes.allowed_fixes() == ["cdi"]


def test_an_allowed_fix_runs_its_fixed_argv_lists_in_order(settings):
    settings.GPUFLEET_AGENT_FIXES = ["runtime"]
    runner = RecordingRunner()
    result = fixes.apply_fix("runtime", runner)
    assert result.ok
    assert runner.calls == [("nvidia-ctk", "runtime", "configure", "--runtime=docker"), ("systemctl", "restart", "docker")]
    assert "$ systemctl restart docker" in result.output


def test_a_failing_step_stops_the_fix_and_says_why(settings):
    settings.GPUFLEET_AGENT_FIXES = ["runtime"]
    first = ("nvidia-ctk", "runtime", "configure", "--runtime=docker")
    runner = RecordingRunner({first: CommandResult(first, 1, stderr="permission denied\n")})
    result = fixes.apply_fix("runtime", runner)
    assert not result.ok
    assert result.error == "nvidia-ctk exited with code 1"
    assert "permission denied" in result.output
    assert runner.calls == [first]


def test_the_persistence_fix_turns_persistence_mode_on_through_nvidia_smi(settings, fake_host):
    fake_host.smi(DATA_DIR / "health" / "smi-8x-h100-failing.csv")
    settings.GPUFLEET_AGENT_FIXES = ["persistence"]
    result = fixes.apply_fix("persistence")
    assert result.ok, result.error
    assert result.output.startswith("$ nvidia-smi -pm 1\nEnabled persistence mode for GPU 00000000:18:00.0.")
    assert result.output.endswith("All done.")
    calls = [json.loads(line)["argv"] for line in fake_host.log_path.read_text().splitlines()]
    assert calls == [["-pm", "1"]]


@pytest.mark.parametrize("code", sorted(fixes.FIX_COMMANDS))
def test_every_fix_is_plain_argv_with_no_shell(code):
    for argv in fixes.FIX_COMMANDS[code]:
        assert isinstance(argv, tuple) and all(isinstance(a, str) for a in argv)
        assert argv[0] not in ("sh", "bash") and not any(c in " ".join(argv) for c in ";|&$`")


def test_each_fix_runs_the_commands_its_finding_shows():
    """A finding's fix text is written from the argv lists the agent runs (gpu/remedies.py):
    the agent runs the shown command, or (toolkit, runtime) the part of it for its code."""
    no_toolkit = gpu.diagnose_host(host(smi=recording("health/smi-2x-geforce.csv"), ctk=None),
                                   FakeDocker(DockerInfo(runtimes=("runc",))), ())
    shown = {f.code: f.fix for f in no_toolkit.findings if f.fix_is_command}
    assert set(fixes.FIX_COMMANDS) <= set(shown)
    for code, commands in fixes.FIX_COMMANDS.items():
        assert gpu.command_text(commands) in shown[code], code
