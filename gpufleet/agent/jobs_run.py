"""The fix jobs this agent ran, kept on disk so that a signed apply_fix replayed from
the broker runs nothing, even after the agent restarts.

One small JSON file per node under GPUFLEET_DATA_DIR: job id -> until when the centre's
signature of that job could still be accepted (GPUFLEET_JOB_TIMEOUT after it was made,
by this host's clock). Past that, verification refuses a replay by its age, so the id
is dropped: the file holds only the fixes of the last job timeout. It is replaced whole
(temp file, then os.replace), so a crash leaves the old list or the new one."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path

from gpufleet.core import agent_settings
from gpufleet.env import write_private_text

log = logging.getLogger(__name__)


class JobsRun:
    """The fix jobs run on this host for one node, as kept in `path`."""

    def __init__(self, path: Path, valid_for_s: float) -> None:
        self.path = path
        self.valid_for_s = valid_for_s

    def ran(self, job_id: int, now: float) -> bool:
        """Whether job `job_id` ran here while its signature could still be valid. An
        unreadable file answers yes (logged): a fix must not run twice."""
        kept = self._read()
        if kept is None:
            return True
        return kept.get(str(job_id), 0.0) >= now

    def record(self, job_id: int, now: float, signed_at: float) -> None:
        """Keep `job_id` as run (before it runs: a crash mid-fix must not lead to a
        second run); ids whose signatures have expired are dropped."""
        kept = {job: until for job, until in (self._read() or {}).items() if until >= now}
        # A centre's clock ahead of this host's keeps its signature valid that much longer.
        kept[str(job_id)] = max(now, signed_at) + self.valid_for_s
        write_private_text(self.path, json.dumps(kept, sort_keys=True))

    def _read(self) -> dict[str, float] | None:
        try:
            kept = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("cannot read the fix jobs run here from %s (%s): no fix runs until it is removed", self.path, exc)
            return None
        if not isinstance(kept, dict) or not all(isinstance(v, int | float) for v in kept.values()):
            log.error("%s is not a list of fix jobs run: no fix runs until it is removed", self.path)
            return None
        return kept


def for_this_agent() -> JobsRun:
    """The jobs run by this host's agent (GPUFLEET_NODE_NAME): `up` runs several under one data dir."""
    settings = agent_settings.current()
    return JobsRun(settings.DATA_DIR / f"agent-{settings.GPUFLEET_NODE_NAME}-fixes-run.json",
                   settings.GPUFLEET_JOB_TIMEOUT)


def signed_at(auth: dict) -> float:
    """When the centre signed a task (its verified `auth`), as a timestamp."""
    return datetime.fromisoformat(auth["at"]).timestamp()
