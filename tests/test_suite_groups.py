"""With `-n 2 --dist loadgroup` (as `sh gpufleet/bootstrap test` runs), the tests that
start processes, servers or a browser share one xdist group, so one worker runs them in
turn and the bench's module fixture runs once (tests/conftest.py)."""

from __future__ import annotations

import pytest


def test_the_tests_that_start_processes_are_in_one_xdist_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only in an xdist worker under --dist loadgroup")
    ours = [item for item in request.session.items
            if item.get_closest_marker("integration") or item.get_closest_marker("browser")
            or item.module.__name__.endswith("test_bench")]
    if not ours:
        pytest.skip("no test that starts processes in this run")
    # pytest-xdist's worker names each test's group at the end of its id, from its marks.
    assert [item.nodeid for item in ours if not item.nodeid.endswith("@processes")] == []


def _collected(*args: str) -> set[str]:
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/ingest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "no:xdist", *args],
                          cwd=tests.parent, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


def test_the_default_tier_leaves_out_the_slow_kinds_and_a_marker_expression_chooses_by_itself():
    every = _collected()
    default = _collected("--tier", "default")
    slow = _collected("--tier", "slow")
    assert "ingest/test_bench.py" in every and "ingest/test_consumer.py" in every
    assert "ingest/test_bench.py" not in default and "ingest/test_consumer.py" in default
    assert slow == {"ingest/test_bench.py", "ingest/test_bench_flood.py"}
    assert "ingest/test_bench.py" in _collected("--tier", "default", "-m", "bench")


def test_the_readmes_test_command_runs_the_default_tier_and_ci_every_tier():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert "pytest tests -n 2 --dist loadgroup --tier default" in (root / "gpufleet/bootstrap").read_text()
    assert "sh gpufleet/bootstrap test --tier all" in (root / ".ci/run").read_text()
