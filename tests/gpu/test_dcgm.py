"""Reading `dcgmi diag` (JSON and text, DCGM 2.x to 4.x) and `dcgmi --version` from real
recordings (tests/fakes/data/dcgmi/README.md), the commands a run uses, and the finding
a run leaves. Pure domain: no Django."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpufleet.gpu import dcgm
from gpufleet.gpu.dcgm import Outcome, Verdict
from gpufleet.gpu.interfaces import CommandResult
from tests.fakes.recorded import recording


def _read(name: str, level: int | None = None) -> dcgm.DiagResult:
    return dcgm.parse_diag(recording(f"dcgmi/{name}"), level)


@pytest.mark.parametrize(
    ("name", "form", "version", "driver", "tests", "verdict"),
    [
        ("diag-r1-pass-3.1.0.json", "json", "3.1.0", "", 10, Verdict.PASS),
        ("diag-r1-fail-4.2.3-gb10.json", "json", "4.2.3", "580.82.09", 1, Verdict.FAIL),
        ("diag-r2-pass-4.4.2.json", "json", "4.4.2", "580.105.08", 3, Verdict.PASS),
        ("diag-r2-fail-3.3.8-h100.json", "json", "3.3.8", "", 11, Verdict.FAIL),
        ("diag-r1-pass-text.txt", "text", "", "", 9, Verdict.PASS),
        ("diag-r1-fail-3.1.8-h200.txt", "text", "3.1.8", "550.127.08", 9, Verdict.FAIL),
        ("diag-r2-pass-4.4.2.txt", "text", "4.4.2", "580.105.08", 3, Verdict.PASS),
        ("diag-r2-pass-3.3.3-p4de.txt", "text", "3.3.3", "535.104.12", 11, Verdict.PASS),
        ("diag-r3-fail-3.3.8-h100.txt", "text", "3.3.8", "560.35.03", 13, Verdict.FAIL),
    ],
)
def test_it_reads_every_recorded_run(name, form, version, driver, tests, verdict):
    result = _read(name, 1)
    assert (result.form, result.version, result.driver_version, len(result.tests), result.verdict) == (
        form,
        version,
        driver,
        tests,
        verdict,
    )
    assert result.level == 1


def test_it_joins_dcgms_wrapped_message_as_printed():
    result = _read("diag-r1-fail-3.1.8-h200.txt")
    [failed] = result.failed
    assert failed.name == "Persistence Mode" and failed.category == "Deployment"
    message = failed.messages[0]
    # The table cut "disab|led" and "peris|tence" mid-word; read back, the words are whole.
    assert message.startswith("Persistence mode for GPU 0 is currently disabled. The DCGM diagnostic requires")
    assert "Persistence mode for GPU 1 is currently disabled." in message
    assert "nvidia-smi -i <gpuId> -pm 1" in message
    # Metadata rows are not tests.
    assert "DCGM Version" not in [t.name for t in result.tests]


def test_it_keeps_dcgm_4s_warning_info_and_entity_of_a_failed_test():
    result = _read("diag-r1-fail-4.2.3-gb10.json")
    [test] = result.tests
    assert (test.name, test.category, test.status) == ("software", "Deployment", Outcome.FAIL)
    assert test.gpus == (("GPU 0", Outcome.FAIL),)
    assert test.messages[0].startswith("Persistence Mode: Persistence mode for GPU 0 is disabled.")
    assert test.messages[1].startswith("info: Error getting the SRAM Threshold Count for GPU 0")
    assert result.summary().startswith("1 of 1 tests failed: software (Persistence Mode:")


def test_it_skips_the_nulls_dcgm_3_1_printed_between_tests():
    result = _read("diag-r1-pass-3.1.0.json")
    assert [t.name for t in result.tests][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert result.tests[0].gpus == (("GPUs 0,1,2,3,4,5,6,7", Outcome.PASS),)
    assert result.summary() == "all 10 tests passed"


def test_it_reads_per_gpu_lines_and_all_or_listed_gpus_of_the_text_form():
    dcgm4 = _read("diag-r2-pass-4.4.2.txt")
    assert [(t.name, t.category, t.gpus) for t in dcgm4.tests] == [
        ("software", "Deployment", (("GPU 0", Outcome.PASS),)),
        ("memory", "Hardware", (("GPU 0", Outcome.PASS),)),
        ("pcie", "Integration", (("GPU 0", Outcome.PASS),)),
    ]
    h100 = _read("diag-r3-fail-3.3.8-h100.txt")
    memory = next(t for t in h100.tests if t.name == "GPU Memory")
    assert memory.status == Outcome.FAIL and memory.gpus == (("all", Outcome.FAIL),)
    assert len(memory.messages) == 8 and memory.messages[7].startswith("GPU 7 Error using CUDA API cuInit")
    assert "https://github.com/nvidia/cuda-samples" in memory.messages[0]
    pcie = next(t for t in h100.tests if t.name == "PCIe")
    assert pcie.status == Outcome.SKIP
    persistence = next(t for t in h100.tests if t.name == "Persistence Mode")
    # An "Info" row is DCGM's note, not a failure.
    assert persistence.status == Outcome.PASS and persistence.messages[0].startswith("info: Persistence mode for GPU 0")


def test_it_says_why_when_dcgmi_printed_no_result():
    result = _read("diag-no-hostengine.txt")
    assert result.verdict == Verdict.ERROR and not result.tests
    assert "unable to establish a connection to the specified host: localhost" in result.error
    assert dcgm.parse_diag("").verdict == Verdict.ERROR


@pytest.mark.parametrize(
    "junk",
    [
        "{",
        "{not json",
        '{"DCGM GPU Diagnostic": 3}',
        "[1, 2]",
        '{"a": {"b": 1}}',
        "| x | y |",
        "\x00\xff" * 50,
        '{"DCGM Diagnostic": {"test_categories": [7, {"tests": [1]}]}}',
    ],
)
def test_output_that_is_no_result_never_raises_and_is_no_pass(junk):
    assert dcgm.parse_diag(junk).verdict == Verdict.ERROR


def test_a_status_word_dcgmi_never_printed_is_not_a_pass():
    assert Outcome.read("Inconclusive") == Outcome.WARN
    assert Outcome.read("Fail - GPU: 0") == Outcome.FAIL
    assert Outcome.read("SKIPPED") == Outcome.SKIP and Outcome.read("Not Run") == Outcome.NOT_RUN


def test_the_result_is_bounded_and_round_trips_as_stored():
    tests = ",".join(
        f'{{"name": "t{i}", "results": [{{"status": "Fail", "warnings": ["{"x" * 5000}"]}}]}}' for i in range(100)
    )
    result = dcgm.parse_diag(
        f'{{"DCGM GPU Diagnostic": {{"test_categories": [{{"category": "C", "tests": [{tests}]}}]}}}}', 2
    )
    assert len(result.tests) == dcgm.TESTS_MAX and len(result.tests[0].messages[0]) == dcgm.MESSAGE_MAX
    stored = dcgm.DiagResult.from_dict(result.to_dict())
    assert stored.tests == result.tests and stored.verdict == Verdict.FAIL and stored.level == 2


def test_only_the_offered_levels_have_a_command():
    assert dcgm.diag_argv(1) == ("dcgmi", "diag", "-r", "1", "-j")
    assert dcgm.diag_argv(2, as_json=False) == ("dcgmi", "diag", "-r", "2")
    with pytest.raises(ValueError):
        dcgm.diag_argv(3)


class _Runner:
    """The host's answers by command line (what dcgmi would print)."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult]):
        self.answers, self.calls = answers, []

    def run(self, argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
        self.calls.append((tuple(argv), timeout))
        return self.answers.get(tuple(argv), CommandResult(tuple(argv), None, error="dcgmi not found on PATH"))


def test_detect_reads_the_version_and_says_why_dcgm_is_missing():
    version = recording("dcgmi/version-3.3.9.txt")
    found = dcgm.detect(_Runner({dcgm.VERSION_ARGV: CommandResult(dcgm.VERSION_ARGV, 0, version)}))
    assert found == dcgm.DcgmInfo(True, "3.3.9")
    missing = dcgm.detect(_Runner({}))
    assert missing == dcgm.DcgmInfo(False, problem="dcgmi not found on PATH")
    broken = dcgm.detect(
        _Runner({dcgm.VERSION_ARGV: CommandResult(dcgm.VERSION_ARGV, 127, "", "libdcgm.so.4: cannot open")})
    )
    assert not broken.installed and broken.problem == "dcgmi --version exited 127: libdcgm.so.4: cannot open"
    assert dcgm.DcgmInfo.from_dict(found.to_dict()) == found and dcgm.DcgmInfo.from_dict({}) is None


def test_a_run_prefers_json_and_falls_back_to_the_table_once():
    text = recording("dcgmi/diag-r1-pass-text.txt")
    runner = _Runner(
        {
            # A dcgmi that knows no -j refuses it; one that ignores it prints its table, read as is.
            dcgm.diag_argv(1): CommandResult(dcgm.diag_argv(1), 1, "", "PARSE ERROR: Argument: -j"),
            dcgm.diag_argv(1, as_json=False): CommandResult(dcgm.diag_argv(1, as_json=False), 0, text),
        }
    )
    result, printed = dcgm.run_diag(runner, 1, timeout=60)
    assert result.form == "text" and result.verdict == Verdict.PASS and printed == text.rstrip()
    assert [argv for argv, _ in runner.calls] == [dcgm.diag_argv(1), dcgm.diag_argv(1, as_json=False)]
    assert all(timeout == 60 for _, timeout in runner.calls)

    ignored = _Runner({dcgm.diag_argv(1): CommandResult(dcgm.diag_argv(1), 0, text)})
    assert dcgm.run_diag(ignored, 1, timeout=60)[0].form == "text" and len(ignored.calls) == 1

    failed = recording("dcgmi/diag-r1-fail-4.2.3-gb10.json")
    runner = _Runner({dcgm.diag_argv(1): CommandResult(dcgm.diag_argv(1), 226, failed)})
    result, _ = dcgm.run_diag(runner, 1, timeout=60)
    assert result.verdict == Verdict.FAIL and len(runner.calls) == 1  # exit 226 with results: no second run


def test_a_run_that_timed_out_is_not_run_again_and_says_so():
    runner = _Runner({dcgm.diag_argv(2): CommandResult(dcgm.diag_argv(2), None, error="timed out after 900 s")})
    result, _ = dcgm.run_diag(runner, 2, timeout=900)
    assert result.verdict == Verdict.ERROR and result.error == "timed out after 900 s" and len(runner.calls) == 1


def test_a_failed_or_warned_run_is_a_finding_and_a_passed_run_none():
    at = "2025-06-01T10:20:30+00:00"
    failed = dcgm.finding({"verdict": "fail", "level": 1, "summary": "1 of 9 tests failed: Persistence Mode", "at": at})
    assert (failed.code, failed.status) == ("dcgm-diag", "fail")
    assert failed.message == "DCGM diagnostic -r 1 of 2025-06-01 10:20 UTC: 1 of 9 tests failed: Persistence Mode"
    assert dcgm.finding({"verdict": "warn", "level": 2, "summary": "s", "at": at}).status == "warn"
    assert dcgm.finding({"verdict": "pass", "level": 2, "summary": "s", "at": at}) is None
    assert dcgm.finding({}) is None and dcgm.finding(None) is None


def test_the_summary_cuts_a_long_message_visibly_and_on_one_line():
    message = "Persistence mode for GPU 0 is currently disabled.\n" + "word " * 60
    failed = dcgm.DiagTest("Persistence Mode", "software", dcgm.Outcome.FAIL, messages=(message,))
    summary = dcgm.DiagResult((failed,)).summary()
    shown = summary.split("(", 1)[1]
    assert "\n" not in summary and shown.endswith("…)") and len(shown) == 201
