"""SubprocessRunner against the fake nvidia-smi / nvidia-ctk executables."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from gpufleet.agent.adapters import OUTPUT_LIMIT, CommandResult, SubprocessRunner
from tests.conftest import HANG_S, wait_until
from tests.fakes.recorded import BIN_DIR, data_path

QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,driver_version",
    "--format=csv,noheader,nounits",
]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, just not reaped yet


def test_stdout_and_exit_zero_are_kept(fake_host):
    result = SubprocessRunner().run(QUERY)
    assert isinstance(result, CommandResult)
    assert result.ok and result.exit_code == 0 and result.error == ""
    assert result.stdout == data_path("h200").read_text()
    assert result.stdout.splitlines()[7].startswith(
        "7, GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72"
    )
    assert result.argv == tuple(QUERY)


def test_child_sees_lc_all_c_and_the_argv(fake_host, monkeypatch):
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    SubprocessRunner().run(QUERY)
    (call,) = fake_host.calls("nvidia-smi")
    assert call["lc_all"] == "C"
    assert call["argv"] == QUERY[1:]
    assert os.environ["LC_ALL"] == "de_DE.UTF-8"  # the caller's own env is left alone


def test_path_is_honoured(fake_host):
    fake_host.smi("a40")
    result = SubprocessRunner().run(QUERY)
    assert "NVIDIA A40" in result.stdout and "H200" not in result.stdout
    call = fake_host.calls("nvidia-smi")[0]
    assert str(fake_host.bin_dir) in call["path"].split(os.pathsep)


@pytest.mark.parametrize(("name", "code", "text"), [
    ("error-9", 9, "couldn't communicate with the NVIDIA driver"),
    ("error-18", 18, "Driver/library version mismatch"),
])  # fmt: skip
def test_nonzero_exit_keeps_code_and_text(fake_host, name, code, text):
    fake_host.smi(name)
    result = SubprocessRunner().run(QUERY)
    assert result.exit_code == code
    assert not result.ok and result.error == ""
    assert text in result.stdout


def test_stderr_is_kept_apart_from_stdout(fake_host):
    fake_host.smi("error-18", stream="stderr")
    result = SubprocessRunner().run(QUERY)
    assert result.stdout == ""
    assert (
        result.stderr.strip()
        == "Failed to initialize NVML: Driver/library version mismatch"
    )
    assert result.exit_code == 18


def test_undecodable_bytes_are_replaced(fake_host):
    fake_host.smi_text(stdout=b"0, \xff\xfe bad\n", stderr=b"\xc3(")
    result = SubprocessRunner().run(QUERY)
    assert result.exit_code == 0
    assert "\ufffd" in result.stdout and result.stdout.startswith("0, ")
    assert "\ufffd" in result.stderr


def test_missing_binary_names_the_command(fake_host):
    fake_host.smi_missing()
    result = SubprocessRunner().run(QUERY)
    assert result.exit_code is None and not result.ok
    assert result.error == "nvidia-smi not found on PATH"


def test_missing_ctk_is_missing_everywhere_on_path(fake_host):
    fake_host.ctk_missing()
    result = SubprocessRunner().run(["nvidia-ctk", "--version"])
    assert result.error == "nvidia-ctk not found on PATH"
    fake_host.ctk("1.12.0")
    result = SubprocessRunner().run(["nvidia-ctk", "--version"])
    assert result.ok
    assert (
        result.stdout.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.12.0"
    )


def test_missing_absolute_path_says_not_found(tmp_path):
    result = SubprocessRunner().run([str(tmp_path / "nope"), "-h"])
    assert result.exit_code is None
    assert result.error == f"{tmp_path / 'nope'} not found"


def test_not_executable_is_an_error_not_an_exception(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o644)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = SubprocessRunner().run(["nvidia-smi"])
    assert result.exit_code is None
    assert result.error.startswith("nvidia-smi could not be run:")
    assert "ermission denied" in result.error


def test_hang_is_killed_with_its_whole_group(fake_host, monkeypatch):
    pidfile = fake_host.smi_hang(output="h200")
    real_wait = subprocess.Popen.wait

    def wait_once_it_hangs(proc, timeout=None):
        # The runner's timeout counts from when the fake hangs (its child started, the pidfile
        # written), not from its start: a loaded machine may take longer than that to start it.
        if timeout is not None:
            wait_until(lambda: pidfile.exists() or proc.poll() is not None, "the fake nvidia-smi to hang")
        return real_wait(proc, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", wait_once_it_hangs)
    results = []
    # In a thread: a run() that waited for the child holding its stdout would wait an hour.
    running = threading.Thread(target=lambda: results.append(SubprocessRunner().run(QUERY, timeout=1.0)), daemon=True)
    running.start()
    running.join(HANG_S)
    assert results, "run() still blocked: the child holding stdout survived"
    [result] = results
    assert result.exit_code is None
    assert result.error == "nvidia-smi timed out after 1 s"
    assert result.stdout.startswith("0, GPU-a44622e3")  # what it printed before hanging
    parent, child = (int(p) for p in pidfile.read_text().split())
    wait_until(lambda: not _alive(parent) and not _alive(child), "the hung nvidia-smi and its child to be gone")


def test_timeout_message_uses_the_timeout_given(fake_host):
    fake_host.smi_hang()
    result = SubprocessRunner().run(["nvidia-smi"], timeout=0.5)
    assert result.error == "nvidia-smi timed out after 0.5 s"


def test_default_timeout_is_ten_seconds():
    import inspect

    from gpufleet.agent import adapters as host

    assert host.COMMAND_TIMEOUT_S == 10.0
    assert inspect.signature(SubprocessRunner.run).parameters["timeout"].default == 10.0


def test_no_shell_is_involved(fake_host):
    result = SubprocessRunner().run(["nvidia-smi", "; echo injected", "$(id)"])
    assert "injected" not in result.stdout
    assert fake_host.calls("nvidia-smi")[0]["argv"] == ["; echo injected", "$(id)"]


def test_fakes_are_executable_scripts():
    for tool in ("nvidia-smi", "nvidia-ctk"):
        path = BIN_DIR / tool
        assert os.access(path, os.X_OK)
        assert Path(path).read_text().startswith("#!/usr/bin/env python3\n")


def test_empty_argv_is_an_error():
    assert SubprocessRunner().run([]).error == "empty command"


def test_missing_interpreter_is_not_called_missing_binary(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/nonexistent/python3\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = SubprocessRunner().run(["nvidia-smi"])
    assert result.exit_code is None
    assert result.error == "nvidia-smi could not be run: its interpreter was not found"


def test_it_keeps_the_first_mebibyte_of_a_flood_without_holding_the_rest():


    flood = [sys.executable, "-c", "import sys\nfor _ in range(200): sys.stdout.write('0, ' * 350_000)"]
    tracemalloc.start()
    result = SubprocessRunner().run(flood, timeout=60)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) == OUTPUT_LIMIT
    assert peak < 8 * OUTPUT_LIMIT  # 200 MiB went by; a few MiB were ever held
