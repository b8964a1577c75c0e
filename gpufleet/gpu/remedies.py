"""The fixes that are commands, written once as argv lists: the agent runs them as they
are (gpufleet/agent/fixes.py, as root, no shell), and a finding's fix shows them as one
shell line with sudo before each command (`command_text`), so the two cannot differ."""

from __future__ import annotations

import shlex

Commands = tuple[tuple[str, ...], ...]

TOOLKIT_INSTALL: Commands = (("apt-get", "install", "-y", "nvidia-container-toolkit"),)
RUNTIME_CONFIGURE: Commands = (
    ("nvidia-ctk", "runtime", "configure", "--runtime=docker"),
    ("systemctl", "restart", "docker"),
)
# Writes the NVIDIA CDI spec that CDI attach needs.
CDI_GENERATE: Commands = (("nvidia-ctk", "cdi", "generate", "--output=/etc/cdi/nvidia.yaml"),)
PERSISTENCE_ON: Commands = (("nvidia-smi", "-pm", "1"),)


def command_text(commands: Commands) -> str:
    """`commands` as a person runs them: one shell line, each quoted and with sudo."""
    return " && ".join("sudo " + shlex.join(argv) for argv in commands)


INSTALL_COMMAND = command_text(TOOLKIT_INSTALL + RUNTIME_CONFIGURE)
CDI_GENERATE_COMMAND = command_text(CDI_GENERATE)
PERSISTENCE_COMMAND = command_text(PERSISTENCE_ON)
