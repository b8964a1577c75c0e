"""pytest fixtures for a fake GPU host. Load as a plugin: pytest_plugins = ["tests.fakes.fixtures"].

fake_host      one fake node per test: fake nvidia-smi / nvidia-ctk on PATH, a FakeDockerEngine
               behind DOCKER_HOST, temporary CDI spec dirs in GPUFLEET_CDI_SPEC_DIRS
real_dockerd   (session) a private Debian docker.io dockerd; yields its unix:// url
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .docker_engine import FakeDockerEngine, unix_http_get
from .recorded import (
    BIN_DIR,
    CDI_SPEC,
    CTK_OUTPUTS,
    SMI_ERROR_EXIT,
    data_path,
)
from .recorded import docker_payload as _docker_payload

FAKE_TOOLS = ("nvidia-smi", "nvidia-ctk", "dcgmi")
# Always installed, so it shadows the real one on PATH: never hidden like the two above.
KERNEL_LOG_TOOL = "dmesg"
_PREFIX = {"nvidia-smi": "SMI", "nvidia-ctk": "CTK", "dmesg": "DMESG"}
_SUFFIXES = ("STDOUT", "STDERR", "EXIT", "HANG", "PIDFILE")


def _sanitized_path(original: str, scratch: Path) -> list[str]:
    """The original PATH minus any real nvidia-smi / nvidia-ctk: a dir holding one is
    replaced by a mirror of symlinks to everything else in it (only happens on GPU hosts)."""
    result: list[str] = []
    for n, entry in enumerate(p for p in original.split(os.pathsep) if p):
        if not any(os.path.lexists(os.path.join(entry, t)) for t in FAKE_TOOLS):
            result.append(entry)
            continue
        mirror = scratch / f"path-mirror-{n}"
        mirror.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            for name in os.listdir(entry):
                if name not in FAKE_TOOLS and not (mirror / name).exists():
                    (mirror / name).symlink_to(os.path.join(entry, name))
        result.append(str(mirror))
    return result


class FakeHost:
    """A fake GPU node. Defaults: 8x H200 (nvidia-smi), nvidia-ctk 1.18.2, Docker with the
    nvidia runtime and NVIDIA CDI devices, empty CDI spec dirs."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        self.tmp_path = tmp_path
        self._mp = monkeypatch
        root = tmp_path / "fakehost"
        self.bin_dir = root / "bin"
        self.out_dir = root / "outputs"
        self.etc_cdi = root / "etc-cdi"
        self.run_cdi = root / "run-cdi"
        for d in (self.bin_dir, self.out_dir, self.etc_cdi, self.run_cdi):
            d.mkdir(parents=True)
        self.spec_dirs: list[str] = [str(self.etc_cdi), str(self.run_cdi)]
        self.log_path = root / "calls.jsonl"
        self._counter = 0

        for name in list(os.environ):
            if name.startswith(("FAKE_SMI_", "FAKE_CTK_", "FAKE_DMESG_", "FAKE_DCGMI_")):
                monkeypatch.delenv(name)
        for tool in (*FAKE_TOOLS, KERNEL_LOG_TOOL):
            script = BIN_DIR / tool
            if not os.access(script, os.X_OK):
                raise RuntimeError(f"{script} is not executable (chmod +x it)")
        path = [str(self.bin_dir), *_sanitized_path(os.environ.get("PATH", ""), root)]
        if shutil.which("python3", path=os.pathsep.join(path)) is None:
            (self.bin_dir / "python3").symlink_to(
                sys.executable
            )  # the fakes' interpreter
        monkeypatch.setenv("PATH", os.pathsep.join(path))
        monkeypatch.setenv("FAKE_TOOL_LOG", str(self.log_path))
        # The agent learns which nvidia-smi fields its driver rejects once per process;
        # each fake host is a new driver.
        from gpufleet.agent import host as agent_host
        from gpufleet.gpu import SmiQuery
        from gpufleet.gpu.throttle import ThrottleHistory

        monkeypatch.setattr(agent_host, "SMI_QUERY", SmiQuery())
        monkeypatch.setattr(agent_host, "THROTTLE", ThrottleHistory())
        monkeypatch.setenv("GPUFLEET_CDI_SPEC_DIRS", ":".join(self.spec_dirs))

        sock = root / "docker.sock"
        self.engine = FakeDockerEngine(
            _docker_payload("nvidia-cdi"), socket_path=sock
        ).start()
        monkeypatch.setenv("DOCKER_HOST", self.engine.url)

        self.smi("h200")
        self.ctk("1.18.2")
        self.kernel_log("")
        self.dcgmi_missing()  # DCGM is not installed unless a test installs it

    # -- nvidia-smi / nvidia-ctk -------------------------------------------------------------

    def _text_file(self, text: str | bytes) -> Path:
        self._counter += 1
        path = self.out_dir / f"out-{self._counter}"
        if isinstance(text, str):
            text = text.encode()
        path.write_bytes(text)
        return path

    def _resolve(self, output: str | os.PathLike[str] | None) -> str:
        if output is None:
            return ""  # print nothing
        if isinstance(output, os.PathLike):
            return os.fspath(output)
        return str(data_path(output))

    def _set_tool(
        self,
        tool: str,
        *,
        stdout: str,
        stderr: str = "",
        exit_code: int = 0,
        hang: bool = False,
        pidfile: Path | None = None,
    ) -> None:
        prefix = _PREFIX[tool]
        for suffix in _SUFFIXES:
            self._mp.delenv(f"FAKE_{prefix}_{suffix}", raising=False)
        self._mp.setenv(f"FAKE_{prefix}_STDOUT", stdout)
        if stderr:
            self._mp.setenv(f"FAKE_{prefix}_STDERR", stderr)
        self._mp.setenv(f"FAKE_{prefix}_EXIT", str(exit_code))
        if hang:
            self._mp.setenv(f"FAKE_{prefix}_HANG", "1")
        if pidfile is not None:
            self._mp.setenv(f"FAKE_{prefix}_PIDFILE", str(pidfile))
        self._install(tool, True)

    def _install(self, tool: str, present: bool) -> None:
        link = self.bin_dir / tool
        if link.is_symlink() or link.exists():
            link.unlink()
        if present:
            link.symlink_to(BIN_DIR / tool)

    def compute_apps(self, text: str) -> None:
        """nvidia-smi --query-compute-apps prints `text` (the processes on the GPUs)."""
        self._mp.setenv("FAKE_SMI_APPS", str(self._text_file(text)))

    def kernel_log(self, text: str, *, exit_code: int = 0, stderr: str = "") -> None:
        """dmesg prints `text` (empty by default); a non-zero exit with `stderr` is a
        kernel log the agent may not read."""
        self._set_tool(
            KERNEL_LOG_TOOL,
            stdout=str(self._text_file(text)),
            stderr=str(self._text_file(stderr)) if stderr else "",
            exit_code=exit_code,
        )

    def smi(
        self,
        output: str | os.PathLike[str] | None = "h200",
        *,
        exit_code: int | None = None,
        stderr: str | os.PathLike[str] | None = None,
        stream: str = "stdout",
        listing: str | os.PathLike[str] | None = None,
        help: str | os.PathLike[str] | None = None,
        nvlink_status: str | os.PathLike[str] | None = None,
        nvlink_errors: str | os.PathLike[str] | None = None,
    ) -> None:
        """nvidia-smi prints a recorded output: a short name of recorded.SMI_OUTPUTS ("h200",
        "a40", "mixed", "util-na", "memory-na", "warnings", "garbage-row", "empty", "error-9",
        "error-18") or a file name under data/, a file path, or None (nothing). Error names
        exit with their code (9, 18) unless exit_code is given; stream="stderr" prints the
        output there. `nvidia-smi -L` prints `listing` (a recording, e.g. of MIG devices),
        or else one line per GPU of the output. `--help-query-gpu` prints `help` (a real
        driver's listing, drivers/help-query-gpu-*.txt), else the output's header fields;
        `nvlink -s` and `nvlink -e` print `nvlink_status` and `nvlink_errors`, else each GPU
        without links."""
        if exit_code is None:
            exit_code = SMI_ERROR_EXIT.get(output, 0) if isinstance(output, str) else 0
        text = self._resolve(output)
        err = self._resolve(stderr)
        if stream == "stderr":
            text, err = "", text
        elif stream != "stdout":
            raise ValueError("stream is 'stdout' or 'stderr'")
        self._set_tool("nvidia-smi", stdout=text, stderr=err, exit_code=exit_code)
        for name, value in (("LIST", listing), ("HELP", help), ("NVLINK_STATUS", nvlink_status),
                            ("NVLINK_ERRORS", nvlink_errors)):
            self._mp.delenv(f"FAKE_SMI_{name}", raising=False)
            if value is not None:
                self._mp.setenv(f"FAKE_SMI_{name}", self._resolve(value))

    def smi_text(
        self, stdout: str | bytes = "", stderr: str | bytes = "", exit_code: int = 0
    ):
        """nvidia-smi prints exactly these texts and exits with exit_code."""
        self._set_tool(
            "nvidia-smi",
            stdout=str(self._text_file(stdout)),
            stderr=str(self._text_file(stderr)) if stderr else "",
            exit_code=exit_code,
        )

    def smi_hang(self, output: str | None = None) -> Path:
        """nvidia-smi (optionally printing `output` first) never exits and leaves a child
        holding its stdout. Returns the file where it writes "<pid> <child pid>"."""
        pidfile = self.out_dir / "smi-hang.pid"
        self._set_tool(
            "nvidia-smi", stdout=self._resolve(output), hang=True, pidfile=pidfile
        )
        return pidfile

    def smi_missing(self) -> None:
        """No nvidia-smi anywhere on PATH."""
        self._install("nvidia-smi", False)

    def ctk(
        self,
        version: str | os.PathLike[str] | None = "1.18.2",
        *,
        exit_code: int = 0,
        stderr: str | os.PathLike[str] | None = None,
    ) -> None:
        """nvidia-ctk --version prints a recorded version ("1.18.2", "1.12.0"), a file, or
        nothing (None)."""
        if isinstance(version, str) and version not in CTK_OUTPUTS:
            raise KeyError(
                f"no recorded nvidia-ctk {version!r}; have {sorted(CTK_OUTPUTS)}"
            )
        self._set_tool(
            "nvidia-ctk",
            stdout=self._resolve(version),
            stderr=self._resolve(stderr),
            exit_code=exit_code,
        )

    def ctk_text(
        self, stdout: str | bytes = "", stderr: str | bytes = "", exit_code: int = 0
    ):
        self._set_tool(
            "nvidia-ctk",
            stdout=str(self._text_file(stdout)),
            stderr=str(self._text_file(stderr)) if stderr else "",
            exit_code=exit_code,
        )

    def dcgmi(self, result: str = "pass", *, json_output: bool = True) -> None:
        """DCGM installed: `dcgmi` on PATH answers --version and `diag -r 1|2 [-j]` from the
        recordings (tests/fakes/data/dcgmi/README.md), its runs passing or failing by
        `result` ("pass", "fail", or "no-hostengine": the host engine stopped). Without
        `json_output` it prints no JSON, as a dcgmi too old for -j."""
        self._mp.setenv("FAKE_DCGMI_RESULT", result)
        self._mp.setenv("FAKE_DCGMI_JSON", "1" if json_output else "0")
        # Read at each call, so a test can change the outcome under a running agent.
        result_file = self.out_dir / "dcgmi-result"
        result_file.write_text(result)
        self._mp.setenv("FAKE_DCGMI_RESULT_FILE", str(result_file))
        self._install("dcgmi", True)

    def dcgmi_outcome(self, result: str) -> None:
        """The installed dcgmi's next runs pass, fail... (see `dcgmi`), also under an agent
        process started before."""
        (self.out_dir / "dcgmi-result").write_text(result)

    def dcgmi_missing(self) -> None:
        """No dcgmi anywhere on PATH (DCGM is not installed)."""
        self._install("dcgmi", False)

    def ctk_missing(self) -> None:
        """No nvidia-ctk anywhere on PATH (the toolkit is not installed)."""
        self._install("nvidia-ctk", False)

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Invocations of the fakes so far: {"tool", "argv", "lc_all", "path"} each."""
        if not self.log_path.exists():
            return []
        entries = [
            json.loads(line) for line in self.log_path.read_text().splitlines() if line
        ]
        return [e for e in entries if tool is None or e["tool"] == tool]

    # -- Docker ------------------------------------------------------------------------------

    @property
    def docker_url(self) -> str:
        return self.engine.url

    def docker(self, payload: str | dict[str, Any] = "nvidia-cdi") -> None:
        """Docker answers /info with a payload: a name of recorded.DOCKER_PAYLOADS
        ("nvidia-cdi", "nvidia-runtime", "nvidia-cdi-empty", "cdi-only", "no-nvidia") or a
        dict. Also undoes docker_error/docker_garbage/docker_unreachable."""
        self.engine.info = (
            _docker_payload(payload) if isinstance(payload, str) else payload
        )
        self.engine.delay, self.engine.status, self.engine.body = 0.0, 200, None
        self._mp.setenv("DOCKER_HOST", self.engine.url)

    def docker_error(
        self, status: int = 500, message: str = "fake daemon error"
    ) -> None:
        self.engine.status, self.engine.error_message, self.engine.body = (
            status,
            message,
            None,
        )

    def docker_garbage(self, body: bytes = b"\x00<html>not json") -> None:
        self.engine.status, self.engine.body = 200, body

    def docker_unreachable(self) -> str:
        """DOCKER_HOST names a socket nobody listens on. Returns that url."""
        url = f"unix://{self.tmp_path / 'fakehost' / 'no-docker.sock'}"
        self._mp.setenv("DOCKER_HOST", url)
        return url

    # -- CDI spec files ----------------------------------------------------------------------

    def write_cdi_spec(
        self,
        name: str = "nvidia.yaml",
        *,
        where: str | os.PathLike[str] = "run",
        content: str | None = None,
    ) -> Path:
        """Write a CDI spec (default: the recorded nvidia-ctk cdi generate output) into the
        "run" (/var/run/cdi) or "etc" (/etc/cdi) spec dir, or any dir. Returns its path."""
        directory = {"run": self.run_cdi, "etc": self.etc_cdi}.get(where, where)  # type: ignore[call-overload]
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / name
        if content is None:
            shutil.copyfile(data_path(CDI_SPEC), path)
        else:
            path.write_text(content)
        return path

    def env(self) -> dict[str, str]:
        """The environment variables this fake host set (for a subprocess env=)."""
        names = ("PATH", "DOCKER_HOST", "GPUFLEET_CDI_SPEC_DIRS", "FAKE_TOOL_LOG")
        return {
            k: v
            for k, v in os.environ.items()
            if k in names or k.startswith(("FAKE_SMI_", "FAKE_CTK_", "FAKE_DCGMI_"))
        }

    def close(self) -> None:
        self.engine.stop()


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHost]:
    host = FakeHost(tmp_path, monkeypatch)
    try:
        yield host
    finally:
        host.close()


# -- a real Docker daemon ------------------------------------------------------------------

DOCKERD_CONFIG: dict[str, Any] = {
    "iptables": False,
    "bridge": "none",
    "storage-driver": "vfs",
    "runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}},
}
DOCKERD_START_TIMEOUT_S = 30.0


class DockerdUnavailable(Exception):
    pass


@contextlib.contextmanager
def private_dockerd(timeout: float = DOCKERD_START_TIMEOUT_S) -> Iterator[str]:
    """Start dockerd on a private socket with private data/exec roots, pidfile and containerd
    namespaces (no clash with a system Docker); yield its unix:// url; stop it after."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerdUnavailable(
            "dockerd is not on PATH (Debian: apt-get install docker.io)"
        )
    if os.geteuid() != 0:
        raise DockerdUnavailable(f"dockerd needs root; running as uid {os.geteuid()}")
    root = Path(
        tempfile.mkdtemp(prefix="gpf-dockerd-")
    )  # short: socket paths are limited
    sock = root / "docker.sock"
    config = root / "daemon.json"
    config.write_text(json.dumps(DOCKERD_CONFIG))
    log_path = root / "dockerd.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    argv = [
        dockerd,
        "--config-file", str(config),
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"),
        "--containerd-namespace", "gpufleet-test",
        "--containerd-plugins-namespace", "gpufleet-test-plugins",
        "-H", f"unix://{sock}",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip

    def tail() -> str:
        try:
            lines = log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        interesting = [ln for ln in lines if "level=error" in ln or "level=fatal" in ln]
        return " | ".join((interesting or lines)[-3:])

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # containerd and shims it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        shutil.rmtree(root, ignore_errors=True)

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise DockerdUnavailable(
                    f"dockerd exited with {proc.returncode}: {tail()}"
                )
            try:
                status, _ = unix_http_get(str(sock), "/_ping", timeout=1.0)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise DockerdUnavailable(
                    f"dockerd gave no /_ping within {timeout:g} s: {tail()}"
                )
            time.sleep(0.2)
    except BaseException:
        stop()
        raise
    try:
        yield f"unix://{sock}"
    finally:
        stop()


@pytest.fixture(scope="session")
def real_dockerd() -> Iterator[str]:
    """unix:// url of a private real dockerd. Skips when it cannot run; fails under CI=true."""
    try:
        cm = private_dockerd()
        url = cm.__enter__()
    except DockerdUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"real dockerd unavailable: {exc}", pytrace=False)
        pytest.skip(f"real dockerd unavailable: {exc}")
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)
