"""DCGM diagnostics run by this agent when the centre asks (signed, once per job): the
domain's fixed `dcgmi diag -r N` (gpufleet/gpu/dcgm.py), never a command from the site.

The agent's worker runs one task at a time, and `-r 2` takes minutes: the run goes in a
thread while the task keeps sending a snapshot every collect interval, so the node does
not look offline for the length of its own diagnostic."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpufleet.agent.adapters import SubprocessRunner
from gpufleet.core import agent_settings
from gpufleet.gpu import dcgm

log = logging.getLogger(__name__)


def run(level: int, report: Callable[[], None], runner=None) -> tuple[dcgm.DiagResult, str]:
    """Run the diagnostic of `level`, calling `report` every collect interval while it
    runs. Returns its result and what dcgmi printed."""
    settings = agent_settings.current()
    runner = runner or SubprocessRunner()
    done: list[tuple[dcgm.DiagResult, str]] = []
    worker = threading.Thread(
        target=lambda: done.append(dcgm.run_diag(runner, level, settings.GPUFLEET_DCGM_DIAG_TIMEOUT)),
        name=f"dcgm-diag-r{level}", daemon=True,
    )
    worker.start()
    while True:
        worker.join(settings.GPUFLEET_COLLECT_INTERVAL)
        if not worker.is_alive():
            break
        try:
            report()
        except Exception:  # a snapshot that could not be sent must not lose the run
            log.exception("could not send a snapshot while the DCGM diagnostic runs")
    if not done:  # the thread died: an error of ours, said as the run's
        return dcgm.DiagResult(error="the diagnostic's thread ended without a result", level=level), ""
    return done[0]
