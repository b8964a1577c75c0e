"""Fixes an agent can apply when asked from the dashboard.

Each finding code maps to the domain's fixed argument lists (gpufleet/gpu/remedies.py,
which the findings' fix texts are written from); nothing that came from the database
or the browser is ever run, and only codes the node's operator listed in
GPUFLEET_AGENT_FIXES are allowed (none by default)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpufleet import gpu, wire
from gpufleet.agent.adapters import SubprocessRunner
from gpufleet.core import agent_settings

FIX_TIMEOUT_S = 300.0

FIX_COMMANDS: dict[str, gpu.Commands] = {
    "cdi": gpu.CDI_GENERATE,
    "runtime": gpu.RUNTIME_CONFIGURE,
    "toolkit": gpu.TOOLKIT_INSTALL,
    "persistence": gpu.PERSISTENCE_ON,
}


def allowed_fixes() -> list[str]:
    """The codes this agent will fix: configured and known, in a stable order."""
    return sorted(code for code in agent_settings.current().GPUFLEET_AGENT_FIXES if code in FIX_COMMANDS)


@dataclass(frozen=True)
class FixRun:
    """What a fix did, its texts cleaned as snapshot texts are: a command may print
    anything, a NUL byte included, which the site could not store."""

    ok: bool
    output: str
    error: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", wire.clean_text(self.output))
        object.__setattr__(self, "error", wire.clean_text(self.error))


def apply_fix(code: str, runner: gpu.Runner | None = None) -> FixRun:
    if code not in allowed_fixes():
        return FixRun(False, "", f"this node does not allow the fix {code!r} (GPUFLEET_AGENT_FIXES)")
    runner = runner or SubprocessRunner()
    lines: list[str] = []
    for argv in FIX_COMMANDS[code]:
        result = runner.run(argv, timeout=FIX_TIMEOUT_S)
        lines.append("$ " + shlex.join(argv))
        lines.extend(t for t in (result.stdout.rstrip(), result.stderr.rstrip()) if t)
        if not result.ok:
            reason = result.error or f"exited with code {result.exit_code}"
            return FixRun(False, "\n".join(lines), f"{argv[0]} {reason}")
    return FixRun(True, "\n".join(lines))
