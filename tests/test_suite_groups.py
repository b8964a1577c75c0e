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
