"""NVIDIA DCGM's active diagnostics (`dcgmi diag`): whether a host has DCGM, the fixed
commands that run a diagnostic, reading what `dcgmi diag` prints, and the finding a
run leaves on its node. Pure: the agent runs the commands, the site stores the result.

`dcgmi diag -j` prints JSON; its shape changed with DCGM 4 ("DCGM GPU Diagnostic" with
`gpu_ids` per result before, "DCGM Diagnostic" with entities and a `test_summary` since).
Both are read, and the text table (`dcgmi diag` without -j) is the fallback for a dcgmi
that printed no JSON. The recordings these rules were written from are in
tests/fakes/data/dcgmi/ (its README says where each comes from)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.gpu.findings import Finding, Status
from gpufleet.gpu.interfaces import COMMAND_TIMEOUT_S, CommandResult, Runner

DCGMI = "dcgmi"
VERSION_ARGV: tuple[str, ...] = (DCGMI, "--version")
# -r 1 (quick, seconds: deployment checks) and -r 2 (medium, minutes: adds PCIe and
# memory tests that load the GPUs). -r 3 and 4 run for half an hour and more: not offered.
LEVELS = (1, 2)
LEVEL_NAMES = {1: "quick (-r 1)", 2: "medium (-r 2)"}
INSTALL_HINT = (
    "Install NVIDIA DCGM from NVIDIA's CUDA repository (for example `apt-get install -y "
    "datacenter-gpu-manager-4-cuda12`) and start its host engine (`systemctl enable --now nvidia-dcgm`); "
    "the agent finds `dcgmi` on its PATH at its next collection."
)
FINDING_CODE = "dcgm-diag"

# What the site keeps of one run: bounded, as a real run on the largest host needs.
TESTS_MAX, MESSAGES_MAX, MESSAGE_MAX, GPUS_MAX = 64, 16, 1000, 64


def diag_argv(level: int, as_json: bool = True) -> tuple[str, ...]:
    """The one command line a diagnostic runs (never built from stored text)."""
    if level not in LEVELS:
        raise ValueError(f"DCGM diagnostic level {level!r} is not offered (only {LEVELS})")
    return (DCGMI, "diag", "-r", str(level), *(("-j",) if as_json else ()))


@dataclass(frozen=True)
class DcgmInfo:
    """DCGM on a host: `version` when `dcgmi --version` answered, else why not."""

    installed: bool
    version: str = ""
    problem: str = ""

    def to_dict(self) -> dict:
        return {"installed": self.installed, "version": self.version, "problem": self.problem}

    @classmethod
    def from_dict(cls, data: dict | None) -> DcgmInfo | None:
        """None for a node whose agent never said (an agent from before DCGM detection)."""
        if not data:
            return None
        return cls(bool(data.get("installed")), str(data.get("version", "")), str(data.get("problem", "")))


_VERSION = re.compile(r"version\s*:\s*(\S+)", re.IGNORECASE)


def detect(runner: Runner, timeout: float = COMMAND_TIMEOUT_S) -> DcgmInfo:
    """Ask `dcgmi --version` (it answers without the host engine running)."""
    result = runner.run(VERSION_ARGV, timeout=timeout)
    if result.error:
        return DcgmInfo(False, problem=result.error)
    if result.exit_code != 0:
        said = _first_line(result.stderr) or _first_line(result.stdout)
        return DcgmInfo(False, problem=f"dcgmi --version exited {result.exit_code}" + (f": {said}" if said else ""))
    match = _VERSION.search(result.stdout)
    return DcgmInfo(True, version=match.group(1)[:64] if match else _first_line(result.stdout)[:64])


class Outcome(StrEnum):
    """A test's result, in dcgmi's vocabulary. Declared best first: worse ranks higher."""

    PASS = "pass"
    SKIP = "skip"
    NOT_RUN = "not run"
    WARN = "warn"
    FAIL = "fail"

    @property
    def label(self) -> str:
        return self.value.capitalize()

    @property
    def colour(self) -> str:
        return {"pass": "green", "skip": "grey", "not run": "grey", "warn": "amber", "fail": "red"}[self.value]

    @classmethod
    def read(cls, word: object) -> Outcome:
        """dcgmi's word ("Pass", "PASS", "Pass - All", "Fail - GPU: 0", "SKIPPED"); a word
        it never printed is not taken for a pass."""
        text = str(word or "").strip().lower().split(" - ", 1)[0].strip()
        return _STATUS_WORDS.get(text, cls.WARN)


_STATUS_WORDS = {
    "pass": Outcome.PASS,
    "passed": Outcome.PASS,
    "fail": Outcome.FAIL,
    "failed": Outcome.FAIL,
    "warn": Outcome.WARN,
    "warning": Outcome.WARN,
    "skip": Outcome.SKIP,
    "skipped": Outcome.SKIP,
    "not run": Outcome.NOT_RUN,
    "notrun": Outcome.NOT_RUN,
}
_RANK = {status: rank for rank, status in enumerate(Outcome)}


def _worst(statuses) -> Outcome:
    return max(statuses, key=_RANK.__getitem__, default=Outcome.NOT_RUN)


@dataclass(frozen=True)
class DiagTest:
    """One test of a run: its worst result over the GPUs, each GPU's, and DCGM's messages."""

    name: str
    category: str
    status: Outcome
    gpus: tuple[tuple[str, Outcome], ...] = ()
    messages: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "category": self.category,
            "status": str(self.status),
            "gpus": [[gpu, str(status)] for gpu, status in self.gpus],
            "messages": list(self.messages),
        }


class Verdict(StrEnum):
    """A run as a whole: failed when any test failed, warned when any warned, passed
    otherwise; `error` when dcgmi printed no result at all (it could not run)."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"

    @property
    def label(self) -> str:
        return {"pass": "Passed", "warn": "Passed with warnings", "fail": "Failed", "error": "Did not run"}[self.value]

    @property
    def colour(self) -> str:
        return {"pass": "green", "warn": "amber", "fail": "red", "error": "grey"}[self.value]

    @property
    def status(self) -> Status:
        """As a finding's status (a run that did not run says nothing of the GPUs)."""
        return {"pass": Status.OK, "warn": Status.WARN, "fail": Status.FAIL, "error": Status.WARN}[self.value]


@dataclass(frozen=True)
class DiagResult:
    """What one `dcgmi diag` printed, read."""

    tests: tuple[DiagTest, ...] = ()
    version: str = ""
    driver_version: str = ""
    error: str = ""
    form: str = ""  # "json" or "text": which output it was read from
    level: int | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def verdict(self) -> Verdict:
        if not self.tests:
            return Verdict.ERROR
        worst = _worst(t.status for t in self.tests)
        if worst == Outcome.FAIL:
            return Verdict.FAIL
        return Verdict.WARN if worst == Outcome.WARN else Verdict.PASS

    @property
    def failed(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status == Outcome.FAIL]

    @property
    def warned(self) -> list[DiagTest]:
        return [t for t in self.tests if t.status == Outcome.WARN]

    def summary(self) -> str:
        """One sentence: which tests failed (or warned) and DCGM's first word on each."""
        if self.verdict == Verdict.ERROR:
            return f"dcgmi printed no test result{': ' + self.error if self.error else ''}"
        shown = self.failed or self.warned
        if not shown:
            return f"all {len(self.tests)} tests passed"
        word = "failed" if self.failed else "warned"
        parts = [t.name + (f" ({_line(t.messages[0])})" if t.messages else "") for t in shown[:4]]
        more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
        return f"{len(shown)} of {len(self.tests)} tests {word}: {'; '.join(parts)}{more}"

    def to_dict(self) -> dict:
        return {
            "verdict": str(self.verdict),
            "level": self.level,
            "form": self.form,
            "version": self.version,
            "driver_version": self.driver_version,
            "error": self.error,
            "tests": [t.to_dict() for t in self.tests],
        }

    @classmethod
    def from_dict(cls, data: dict | None) -> DiagResult | None:
        """The result as stored (`to_dict`); None for none."""
        if not data:
            return None
        tests = tuple(
            DiagTest(
                str(t["name"]),
                str(t.get("category", "")),
                Outcome(t["status"]),
                tuple((str(g), Outcome(s)) for g, s in t.get("gpus", [])),
                tuple(t.get("messages", [])),
            )
            for t in data.get("tests", [])
        )
        return cls(
            tests,
            str(data.get("version", "")),
            str(data.get("driver_version", "")),
            str(data.get("error", "")),
            str(data.get("form", "")),
            data.get("level"),
        )


def parse_diag(text: str, level: int | None = None) -> DiagResult:
    """Read what `dcgmi diag` printed: its JSON document (-j) where there is one, else its
    text table. Never raises: output with no result at all reads as an error that says
    what dcgmi printed instead."""
    text = text or ""
    document = _json_document(text)
    if document is not None:
        result = _from_json(document)
        if result is not None:
            return _bounded(result, level)
    return _bounded(_from_text(text), level)


# --- JSON ------------------------------------------------------------------------------


def _json_document(text: str) -> dict | None:
    # dcgmi may print a line before its document; the document is the first object.
    start = text.find("{")
    if start < 0:
        return None
    try:
        document, _ = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return document if isinstance(document, dict) else None


def _from_json(document: dict) -> DiagResult | None:
    root = document.get("DCGM GPU Diagnostic", document.get("DCGM Diagnostic"))
    if not isinstance(root, dict):
        return None
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    version = root.get("version") or metadata.get("version") or ""
    driver = (
        root.get("Driver Version Detected")
        or root.get("driver_version_detected")
        or metadata.get("Driver Version Detected")
        or ""
    )
    tests = []
    categories = root.get("test_categories")
    for category in categories if isinstance(categories, list) else []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if isinstance(test, dict):  # DCGM 3.1 printed null between tests
                tests.append(_json_test(test, str(category.get("category", ""))))
    error = root.get("runtime_error") or document.get("runtime_error") or ""
    return DiagResult(tuple(tests), _line(version), _line(driver), _line(error, MESSAGE_MAX), "json")


def _json_test(test: dict, category: str) -> DiagTest:
    gpus, messages = [], []
    results = test.get("results") if isinstance(test.get("results"), list) else []
    for result in results:
        if not isinstance(result, dict):
            continue
        status = Outcome.read(result.get("status"))
        gpus.append((_json_gpus(result), status))
        messages += _json_messages(result.get("warnings"))
        messages += [f"info: {m}" for m in _json_messages(result.get("info"))]
    summary = test.get("test_summary") if isinstance(test.get("test_summary"), dict) else {}
    messages += [f"info: {m}" for m in _json_messages(summary.get("info"))]
    if summary.get("status"):
        status = Outcome.read(summary["status"])
    else:
        status = _worst(s for _, s in gpus) if gpus else Outcome.NOT_RUN
    return DiagTest(_line(test.get("name", "?")), _line(category), status, tuple(gpus), _unique(messages))


def _json_gpus(result: dict) -> str:
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU"))
        return f"{group} {result['entity_id']}"
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return "all"
    ids = str(ids)
    return f"GPU {ids}" if "," not in ids else f"GPUs {ids}"


def _json_messages(value: object) -> list[str]:
    """Warnings and info as DCGM prints them: a string, a list of strings, or a list of
    {"warning": ...} / {"message": ...} objects."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    messages = []
    for item in items:
        if isinstance(item, dict):
            item = item.get("warning", item.get("message", ""))
        if isinstance(item, str) and item.strip():
            messages.append(item.strip())
    return messages


# --- text ------------------------------------------------------------------------------

_HEADER = re.compile(r"^\|\s*Diagnostic\s*\|\s*Result\s*\|$")
_SECTION = re.compile(r"^[|+]-+\s+(?P<name>[^-|+]+?)\s+-+[+|]")
_METADATA = {"dcgm version": "version", "driver version detected": "driver_version"}
_MESSAGE_ROWS = {"error": "", "warning": "", "info": "info: "}
_GPU_LINE = re.compile(r"^(?P<gpu>(?:GPU|CPU)\s*\d+)\s*:\s*(?P<status>.+)$", re.IGNORECASE)


def _from_text(text: str) -> DiagResult:
    tests: list[dict] = []
    category, meta, errors = "", {}, []
    current: dict | None = None  # the test or message row the next wrapped line continues
    in_table = False  # rows count only inside dcgmi's "Diagnostic | Result" table
    for raw in text.splitlines():
        line = raw.rstrip()
        if not in_table:
            in_table = bool(_HEADER.match(line))
            if not in_table and line.lower().startswith("error"):
                errors.append(line.split(":", 1)[-1].strip())
            continue
        if section := _SECTION.match(line):
            category, current = section.group("name").strip(), None
            continue
        cells = line.split("|")
        if len(cells) < 4 or not line.startswith("|"):
            if line.lower().startswith("error"):
                errors.append(line.split(":", 1)[-1].strip())
            continue
        name, value = cells[1].strip(), "|".join(cells[2:-1])
        # The value column is wrapped at a fixed width, mid-word: its lines join as printed.
        chunk = value[1:-2] if len(value) > 3 else value.strip()
        if name and name.lower() in _METADATA:
            meta[_METADATA[name.lower()]] = value.strip()
            current = None
        elif name and name.lower() in _MESSAGE_ROWS and tests:
            current = {"prefix": _MESSAGE_ROWS[name.lower()], "text": chunk, "test": tests[-1]}
            tests[-1]["messages"].append(current)
        elif name:
            if category.lower() == "metadata":
                continue
            status_text = value.strip()
            current = {
                "name": name,
                "category": category,
                "status": Outcome.read(status_text),
                "detail": status_text,
                "gpus": [],
                "messages": [],
            }
            tests.append(current)
        elif current is not None and "prefix" in current:
            current["text"] += chunk
        elif current is not None and (gpu := _GPU_LINE.match(value.strip())):
            current["gpus"].append(
                (gpu.group("gpu").replace(" ", "").upper().replace("GPU", "GPU "), Outcome.read(gpu.group("status")))
            )
    read = []
    for t in tests:
        messages = [m["prefix"] + " ".join(m["text"].split()) for m in t["messages"]]
        gpus = t["gpus"] or ([(_text_gpus(t["detail"]), t["status"])] if " - " in t["detail"] else [])
        read.append(DiagTest(_line(t["name"]), _line(t["category"]), t["status"], tuple(gpus), _unique(messages)))
    error = "" if read else " ".join(errors) or _first_line(text)
    return DiagResult(
        tuple(read),
        _line(meta.get("version", "")),
        _line(meta.get("driver_version", "")),
        _line(error, MESSAGE_MAX),
        "text",
    )


def _text_gpus(detail: str) -> str:
    # "Pass - All", "Fail - GPU: 0, 3"
    which = detail.split(" - ", 1)[1].strip()
    return "all" if which.lower() == "all" else which.replace("GPU:", "GPU").strip()


# --- bounds and helpers -----------------------------------------------------------------


def _bounded(result: DiagResult, level: int | None) -> DiagResult:
    tests = tuple(
        DiagTest(
            t.name,
            t.category,
            t.status,
            t.gpus[:GPUS_MAX],
            tuple(m if len(m) <= MESSAGE_MAX else m[: MESSAGE_MAX - 1] + "…" for m in t.messages[:MESSAGES_MAX]),
        )
        for t in result.tests[:TESTS_MAX]
    )
    return DiagResult(tests, result.version, result.driver_version, result.error, result.form, level)


def _unique(messages: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(m for m in messages if m))


def _line(value: object, limit: int = 200) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


# --- the run and its finding ---------------------------------------------------------------


def run_diag(runner: Runner, level: int, timeout: float) -> tuple[DiagResult, str]:
    """Run the level's diagnostic on this host: JSON first, and the text form only when
    dcgmi printed no JSON result (an old dcgmi) and did not time out. Returns the
    result and what dcgmi printed (the output the site keeps)."""
    first = runner.run(diag_argv(level, as_json=True), timeout=timeout)
    result = parse_diag(first.stdout, level)
    if result.tests or "timed out" in first.error or first.error.endswith("not found on PATH"):
        return _with_reason(result, first), _printed(first)
    second = runner.run(diag_argv(level, as_json=False), timeout=timeout)
    text_result = parse_diag(second.stdout, level)
    if text_result.tests:
        return text_result, _printed(second)
    return _with_reason(result, first), _printed(first)


def _with_reason(result: DiagResult, run: CommandResult) -> DiagResult:
    if result.tests:
        return result
    reason = (
        run.error
        or result.error
        or _first_line(run.stderr)
        or (f"exited {run.exit_code}" if run.exit_code else "printed nothing")
    )
    return DiagResult((), result.version, result.driver_version, _line(reason, MESSAGE_MAX), result.form, result.level)


def _printed(run: CommandResult) -> str:
    return "\n".join(t for t in (run.stdout.rstrip(), run.stderr.rstrip()) if t)


def finding(summary: dict | None) -> Finding | None:
    """The finding a node's last diagnostic leaves (`summary` as the site keeps it: verdict,
    level, summary, at): failing until a run passes, warning for a run with warnings; a
    passed run, or none, leaves none."""
    if not summary or summary.get("verdict") not in (Verdict.FAIL, Verdict.WARN):
        return None
    verdict = Verdict(summary["verdict"])
    level = summary.get("level")
    at = summary.get("at", "")
    message = f"DCGM diagnostic -r {level} of {at[:16].replace('T', ' ')} UTC: {summary.get('summary', '')}"
    fix = (
        "Look at the failed tests on the node page (DCGM's messages say what to do), fix the GPU or its "
        "setup, then run the diagnostic again: a passed run clears this."
    )
    return Finding(FINDING_CODE, "DCGM diagnostic", verdict.status, message[:4000], fix)
