"""In-memory stand-ins for the host, for the domain's tests: a Runner answering
from a table (nvidia-smi's query answered from a recording as the fake executable
answers it, smi_query.py) and DockerFacts. Recordings are read with
recorded.recording; the subprocess-level fake host is fixtures.FakeHost."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.gpu import (
    KERNEL_LOG_ARGV,
    NVLINK_ERRORS_ARGV,
    NVLINK_STATUS_ARGV,
    SMI_HELP_ARGV,
    SMI_QUERY_ARGV,
    TOOLKIT_ARGV,
    CommandResult,
    DockerInfo,
)
from tests.fakes import smi_query


def ok(argv: Sequence[str], stdout: str) -> CommandResult:
    return CommandResult(tuple(argv), 0, stdout=stdout)


def exited(
    argv: Sequence[str], code: int, stdout: str = "", stderr: str = ""
) -> CommandResult:
    return CommandResult(tuple(argv), code, stdout=stdout, stderr=stderr)


def failed(argv: Sequence[str], error: str) -> CommandResult:
    return CommandResult(tuple(argv), None, error=error)


class FakeRunner:
    """Answers each argv from `results`; an unknown program is "not found on PATH"."""

    def __init__(
        self, results: dict[tuple[str, ...], CommandResult] | None = None
    ) -> None:
        self.results = dict(results or {})
        self.calls: list[tuple[tuple[str, ...], float]] = []
        # A recorded --help-query-gpu (set `help`): the driver knows its fields too.
        self.help: str | None = None

    def run(self, argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
        key = tuple(argv)
        self.calls.append((key, timeout))
        recorded = self.results.get(SMI)
        if recorded is not None and smi_query.requested_fields(list(key)) is not None:
            if recorded.error:
                return recorded
            # nvidia-smi's GPU query, whatever its fields: answered as a driver that
            # knows the recording's fields would answer it.
            known = smi_query.known_fields(self.help) if self.help else frozenset()
            stdout, _, code = smi_query.answer(list(key), recorded.stdout, recorded.exit_code or 0, known)
            return CommandResult(key, code, stdout=stdout, stderr=recorded.stderr)
        if key in self.results:
            return self.results[key]
        if recorded is not None and not recorded.error and key == HELP:
            return ok(key, self.help if self.help is not None else smi_query.help_text(recorded.stdout))
        if recorded is not None and not recorded.error and key in (NVLINK_STATUS, NVLINK_ERRORS):
            # GPUs without NVLink: each GPU is named, with no link under it.
            return ok(key, smi_query.nvlink_status_without_links(recorded.stdout))
        return failed(key, f"{key[0]} not found on PATH")


class FakeDocker:
    """DockerFacts that returns one DockerInfo and counts how often it was asked."""

    def __init__(self, info: DockerInfo | None = None, containers: list | None = None,
                 inspected: dict | None = None) -> None:
        self._info = info or DockerInfo()
        self._containers = containers or []
        self._inspected = inspected or {}
        self.calls = 0
        self.inspected: list[str] = []

    def info(self) -> DockerInfo:
        self.calls += 1
        return self._info

    def containers(self) -> list:
        return self._containers

    def inspect(self, container_ids) -> dict:
        self.inspected += container_ids
        return {cid: self._inspected[cid] for cid in container_ids if cid in self._inspected}


SMI = tuple(SMI_QUERY_ARGV)
HELP = tuple(SMI_HELP_ARGV)
NVLINK_STATUS = tuple(NVLINK_STATUS_ARGV)
NVLINK_ERRORS = tuple(NVLINK_ERRORS_ARGV)
CTK = tuple(TOOLKIT_ARGV)
DMESG = tuple(KERNEL_LOG_ARGV)


def host(
    smi: CommandResult | str | None = None,
    ctk: CommandResult | str | None = None,
    dmesg: CommandResult | str | None = "",
) -> FakeRunner:
    """A runner for a host whose nvidia-smi, nvidia-ctk and dmesg print the given text
    (or return the given result); None leaves the program missing. nvidia-smi answers
    any field list from its recording (tests/fakes/smi_query.py); the kernel log is
    empty unless given."""
    results = {}
    for argv, answer in ((SMI, smi), (CTK, ctk), (DMESG, dmesg)):
        if isinstance(answer, str):
            results[argv] = ok(argv, answer)
        elif answer is not None:
            results[argv] = answer
    return FakeRunner(results)
