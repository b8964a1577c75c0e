"""The agent tests' own data dir: the fix jobs an agent ran are kept there
(gpufleet/agent/jobs_run.py), and job ids repeat from one test to the next."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def agent_data_dir(settings, tmp_path):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR
