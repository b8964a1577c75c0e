"""This host, as the agent sees it: the domain diagnosis wired to the real
commands, Docker socket and CDI spec folders.

PATH, DOCKER_HOST and GPUFLEET_CDI_SPEC_DIRS are read from the environment at
each collection (as the tools themselves would), not frozen at start-up."""

from __future__ import annotations

import os

from gpufleet import gpu
from gpufleet.agent.adapters import (
    EngineDocker,
    SubprocessRunner,
    list_cdi_spec_files,
    parse_spec_dirs,
    proc_cgroup_reader,
)
from gpufleet.core import agent_settings
from gpufleet.gpu import dcgm
from gpufleet.gpu.throttle import ThrottleHistory
from gpufleet.wire import build_snapshot

# The nvidia-smi fields this host's driver rejected: learnt once per agent process,
# so an older driver costs one retry, not one per collection.
SMI_QUERY = gpu.SmiQuery()
# Each GPU's last hour of throttling, read at each collection: a restarted agent starts a
# new hour (docs/agent.md says why the agent keeps it, not the site).
THROTTLE = ThrottleHistory()


def diagnose_this_host(runner: gpu.Runner | None = None) -> gpu.HostDiagnosis:
    settings = agent_settings.current()
    return gpu.diagnose_host(
        runner or SubprocessRunner(),
        EngineDocker(timeout=settings.GPUFLEET_DOCKER_TIMEOUT),
        list_cdi_spec_files(parse_spec_dirs(os.environ.get("GPUFLEET_CDI_SPEC_DIRS"))),
        settings.GPUFLEET_VRAM_WARN_PERCENT,
        query=SMI_QUERY,
        temperature_warn_c=settings.GPUFLEET_TEMPERATURE_WARN_C,
        xid_window_hours=settings.GPUFLEET_XID_WINDOW_HOURS,
        cgroup_of=proc_cgroup_reader(os.environ.get("GPUFLEET_PROC_ROOT") or "/proc"),
        throttle=THROTTLE,
        throttle_warn_share=settings.GPUFLEET_THROTTLE_WARN_SHARE,
    )


def snapshot_this_host(node: str | None = None) -> dict:
    """One collection: diagnose this host and package it for ingest."""
    from gpufleet.agent.fixes import allowed_fixes

    return build_snapshot(diagnose_this_host(), node or agent_settings.current().GPUFLEET_NODE_NAME, allowed_fixes(),
                          dcgm=dcgm.detect(SubprocessRunner()))
