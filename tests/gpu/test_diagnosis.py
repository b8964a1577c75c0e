"""diagnose_host and the doctor report."""

from __future__ import annotations

import json

import pytest

from gpufleet.gpu import (
    CDI_ENABLE_HINT,
    CDI_GENERATE_COMMAND,
    DRIVER_HINT,
    INSTALL_COMMAND,
    Device,
    DockerInfo,
    Finding,
    HostDiagnosis,
    Info,
    SmiQuery,
    Status,
    cdi_spec_mentions_gpu,
    diagnose_host,
    is_cdi_spec_name,
)
from gpufleet.gpu.processes import COMPUTE_APPS_ARGV
from tests.fakes.memory import CTK, DMESG, HELP, NVLINK_STATUS, SMI, FakeDocker, exited, host
from tests.fakes.recorded import recording

RUNC = ("io.containerd.runc.v2", "runc")
NVIDIA = (*RUNC, "nvidia")
CDI = ("nvidia.com/gpu=0", "nvidia.com/gpu=all")
SPEC = ("/etc/cdi/nvidia.yaml",)
MIXED = recording("smi-2x-mixed.csv")
CTK_1_18 = recording("ctk-1.18.2.txt")


def diagnose(
    smi=MIXED, ctk=CTK_1_18, runtimes=NVIDIA, cdi=(), specs=(), error="", docker_url="", **kwargs
):
    docker = FakeDocker(DockerInfo(runtimes=runtimes, cdi_devices=cdi, error=error, url=docker_url))
    diagnosis = diagnose_host(host(smi=smi, ctk=ctk), docker, specs, **kwargs)
    assert docker.calls == 1
    return diagnosis


def by_code(diagnosis: HostDiagnosis) -> dict[str, Finding]:
    return {f.code: f for f in diagnosis.findings}


@pytest.mark.parametrize(
    "smi,remedy",
    [
        (None, DRIVER_HINT),
        ("", DRIVER_HINT),
        (exited(SMI, 9, stdout=recording("smi-error-exit9.txt")), "sudo modprobe nvidia"),
    ],
)
def test_it_gives_one_driver_failure_without_a_gpu(smi, remedy):
    d = diagnose(smi=smi, cdi=CDI)
    assert d.attach == "none"
    assert len(d.findings) == 1
    (finding,) = d.findings
    assert (finding.code, finding.status) == ("driver", "fail")
    assert remedy in finding.fix
    assert d.info.no_gpu_reason in finding.message
    assert d.failed
    assert d.worst_status == Status.FAIL


CRASHED = """\
Traceback (most recent call last):
  File "/usr/local/bin/nvidia-smi", line 12, in <module>
    sys.exit(main("SMI"))
             ^^^^^^^^^^^
  File "/usr/local/lib/tool.py", line 79, in main
    with open(stdout, encoding="utf-8") as fh:
FileNotFoundError: [Errno 2] No such file or directory: '/data/smi-8x-a40.csv'
"""


def test_a_crashed_command_is_one_line_with_its_error_not_its_traceback():
    # A wrapper script on PATH that crashed: the node's problem column shows this text.
    d = diagnose(smi=exited(SMI, 1, stderr=CRASHED))
    (finding,) = d.findings
    assert finding.message == (
        "No NVIDIA GPU detected: nvidia-smi exited with code 1: FileNotFoundError: [Errno 2]"
        " No such file or directory: '/data/smi-8x-a40.csv'"
    )


def test_it_reports_a_healthy_legacy_host():
    d = diagnose()
    f = by_code(d)
    assert [x.code for x in d.findings] == [
        "driver",
        "gpu0",
        "gpu1",
        "toolkit",
        "cdi",
        "runtime",
        "attach",
    ]
    assert f["driver"].status == "ok"
    assert f["driver"].message == "Driver 560.35.03, 2 GPUs"
    assert f["gpu0"].name == "GPU 0 (NVIDIA GeForce RTX 4080 SUPER)"
    assert f["gpu0"].message == "1.2 of 16.0 GiB in use (7%)"
    assert f["toolkit"].message == "NVIDIA Container Toolkit CLI version 1.18.2"
    assert d.toolkit_version == "NVIDIA Container Toolkit CLI version 1.18.2"
    assert d.attach == "legacy"
    assert f["attach"].status == "ok" and "legacy" in f["attach"].message
    assert not d.failed


def test_it_says_one_gpu_in_the_singular():
    d = diagnose(smi=recording("smi-1x-gh200-memory-na.csv"))
    assert by_code(d)["driver"].message == "Driver 570.124.06, 1 GPU"


@pytest.mark.parametrize(
    "used, total, warn_percent, status",
    [
        (9000, 10000, 90, "warn"),  # exactly 90 %: the level itself warns
        (8999, 10000, 90, "ok"),
        (10000, 10000, 90, "warn"),
        (0, 10000, 90, "ok"),
        (5000, 10000, 50, "warn"),
        (4999, 10000, 50, "ok"),
        (9999, 10000, 100, "ok"),
        (10000, 10000, 100, "warn"),
        (9000, 10000, 0, "warn"),  # out of range: ignored, 90 applies
        (5000, 10000, 0, "ok"),
        (5000, 10000, -5, "ok"),
        (5000, 10000, 150, "ok"),
        (9000, 10000, 150, "warn"),
        (9000, 10000, float("nan"), "warn"),
        (5000, 10000, float("nan"), "ok"),
        (22117, 24576, 90, "ok"),  # 89.99 %
        (22119, 24576, 90, "warn"),
    ],
)
def test_it_warns_on_vram_use(used, total, warn_percent, status):
    smi = f"0, GPU-x, NVIDIA GeForce RTX 3090, {total}, {used}, 50, 560.35.03"
    finding = by_code(diagnose(smi=smi, vram_warn_percent=warn_percent))["gpu0"]
    assert finding.status == status
    assert "GiB in use" in finding.message


def test_it_shows_memory_in_gib_and_the_level_it_crossed():
    finding = by_code(diagnose(smi=recording("smi-8x-h200.csv")))["gpu0"]
    assert finding.status == "warn"
    assert (
        finding.message
        == "127.0 of 140.4 GiB in use (90%), at or above the 90% warning level"
    )


@pytest.mark.parametrize(
    "row",
    [
        "0, GPU-x, NVIDIA GH200 480GB, [N/A], [N/A], 42, 570.124.06",
        "0, GPU-x, NVIDIA GH200 480GB, [N/A], 100, 42, 570.124.06",
        "0, GPU-x, NVIDIA GH200 480GB, 97871, [N/A], 42, 570.124.06",
        "0, GPU-x, NVIDIA GH200 480GB, 0, 0, 42, 570.124.06",
    ],
)
def test_it_accepts_unreported_memory(row):
    d = diagnose(smi=row)
    finding = by_code(d)["gpu0"]
    assert finding.status == "ok"
    assert "not reported" in finding.message
    assert d.info.present


@pytest.mark.parametrize(
    "ctk, version, status",
    [
        (CTK_1_18, "NVIDIA Container Toolkit CLI version 1.18.2", "ok"),
        (
            recording("ctk-1.12.0.txt"),
            "NVIDIA Container Toolkit CLI version 1.12.0",
            "ok",
        ),
        (
            "\n  NVIDIA Container Toolkit CLI version 1.17.0  \n",
            "NVIDIA Container Toolkit CLI version 1.17.0",
            "ok",
        ),
        (None, "", "warn"),
        ("", "", "warn"),
        (exited(CTK, 1, stderr="boom"), "", "warn"),
    ],
)
def test_it_reports_the_toolkit(ctk, version, status):
    d = diagnose(ctk=ctk)
    finding = by_code(d)["toolkit"]
    assert d.toolkit_version == version
    assert finding.status == status
    assert finding.fix == ("" if status == "ok" else INSTALL_COMMAND)


@pytest.mark.parametrize(
    "runtimes, cdi, specs, cdi_status, cdi_fix, runtime_status, attach, attach_status",
    [
        (NVIDIA, CDI, SPEC, "ok", "", "ok", "cdi", "ok"),
        (RUNC, CDI, SPEC, "ok", "", "ok", "cdi", "ok"),
        (RUNC, CDI, (), "ok", "", "ok", "cdi", "ok"),
        (NVIDIA, (), SPEC, "warn", CDI_ENABLE_HINT, "ok", "legacy", "ok"),
        (NVIDIA, (), (), "ok", CDI_GENERATE_COMMAND, "ok", "legacy", "ok"),
        (RUNC, (), SPEC, "warn", CDI_ENABLE_HINT, "warn", "none", "fail"),
        (RUNC, (), (), "ok", CDI_GENERATE_COMMAND, "warn", "none", "fail"),
        (
            RUNC,
            ("vendor.com/net=eth1",),
            (),
            "ok",
            CDI_GENERATE_COMMAND,
            "warn",
            "none",
            "fail",
        ),
    ],
)
def test_it_diagnoses_how_docker_attaches_gpus(
    runtimes, cdi, specs, cdi_status, cdi_fix, runtime_status, attach, attach_status
):
    d = diagnose(runtimes=runtimes, cdi=cdi, specs=specs)
    f = by_code(d)
    assert (f["cdi"].status, f["cdi"].fix) == (cdi_status, cdi_fix)
    assert f["runtime"].status == runtime_status
    assert f["runtime"].fix == ("" if runtime_status == "ok" else INSTALL_COMMAND)
    assert d.attach == attach
    assert f["attach"].status == attach_status
    assert f["attach"].fix == ("" if attach_status == "ok" else INSTALL_COMMAND)
    assert d.failed is (attach_status == "fail")
    assert d.worst_status == max(
        (x.status for x in d.findings), key=["ok", "warn", "fail"].index
    )


@pytest.mark.parametrize(
    "error, url, message",
    [
        ("connection refused", "", "Docker is unreachable: connection refused"),
        (
            "Docker at unix:///run/user/1000/docker.sock is unreachable: connection refused",
            "unix:///run/user/1000/docker.sock",
            "Docker at unix:///run/user/1000/docker.sock is unreachable: connection refused",
        ),
    ],
)
def test_it_says_when_docker_is_unreachable(error, url, message):
    d = diagnose(runtimes=(), error=error, docker_url=url)
    f = by_code(d)
    assert f["runtime"].status == "warn"
    assert f["runtime"].message.startswith(message)
    assert d.attach == "none"
    # The toolkit may well be installed (nvidia-ctk answered): what is wrong is that
    # dockerd does not answer, and that is what the runtime and attach findings say.
    assert f["toolkit"].status == "ok"
    assert f["attach"].status == "fail" and "Docker does not answer" in f["attach"].message
    for finding in (f["runtime"], f["attach"]):
        assert INSTALL_COMMAND not in finding.fix and "apt-get install" not in finding.fix
        assert "systemctl status docker" in finding.fix
        assert "DOCKER_HOST" in finding.fix and "group docker" in finding.fix
        if url:
            assert f"DOCKER_HOST is {url}" in finding.fix


def test_an_unreachable_docker_does_not_blame_an_existing_cdi_spec():
    d = diagnose(runtimes=(), specs=SPEC, error="Docker at unix:///var/run/docker.sock is unreachable: no socket there")
    cdi = by_code(d)["cdi"]
    assert cdi.fix != CDI_ENABLE_HINT and "systemctl status docker" in cdi.fix


def test_it_drops_duplicate_spec_files_and_keeps_their_order():
    specs = [
        "/var/run/cdi/nvidia.yaml",
        "/etc/cdi/nvidia.yaml",
        "/var/run/cdi/nvidia.yaml",
    ]
    d = diagnose(specs=specs)
    assert d.cdi_spec_files == ("/var/run/cdi/nvidia.yaml", "/etc/cdi/nvidia.yaml")


def test_it_runs_each_command_once_on_a_driver_that_knows_every_field():
    runner = host(smi=recording("health/smi-8x-h100.csv"), ctk=CTK_1_18)
    query = SmiQuery()
    diagnose_host(runner, FakeDocker(DockerInfo(runtimes=NVIDIA)), (), query=query)
    calls = [argv for argv, _ in runner.calls]
    assert calls == [HELP, tuple(query.argv()), NVLINK_STATUS, CTK, DMESG, tuple(COMPUTE_APPS_ARGV)]
    # Learnt once: the next collection asks for the fields alone, and no longer for NVLink
    # on GPUs that have none.
    runner.calls.clear()
    diagnose_host(runner, FakeDocker(DockerInfo(runtimes=NVIDIA)), (), query=query)
    assert [argv for argv, _ in runner.calls] == [tuple(query.argv()), CTK, DMESG, tuple(COMPUTE_APPS_ARGV)]


def test_it_writes_exactly_the_doctor_json_keys():
    d = diagnose(smi=recording("smi-2x-k80-util-placeholders.csv"), cdi=CDI, specs=SPEC)
    report = d.to_dict("gpu-07")
    assert list(report) == [
        "node",
        "present",
        "driver_version",
        "devices",
        "runtime_installed",
        "toolkit_version",
        "cdi_spec_files",
        "cdi_devices",
        "attach",
        "findings",
    ]
    assert report["node"] == "gpu-07"
    reference = {
        "index": 0,
        "uuid": "GPU-9f0e6c1a-77b2-4d1e-8c3f-5a6b7c8d9e01",
        "name": "Tesla K80",
        "vram_total_mib": 11441,
        "vram_used_mib": 0,
        "utilization_percent": None,
    }
    # A driver that knows only the reference fields: every health key is there, unknown.
    lists = {"mig_devices": [], "xid_errors": [], "processes": [], "attached_idle": [], "nvlink": []}
    health = {k: None for k in report["devices"][0] if k not in reference and k not in lists}
    assert report["devices"][0] == {**reference, **health, **lists}
    assert len(health) == 31
    assert {"pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max"} <= set(health)
    assert report["cdi_spec_files"] == list(SPEC)
    assert report["cdi_devices"] == list(CDI)
    assert report["attach"] == "cdi"
    for finding in report["findings"]:
        assert set(finding) in (
            {"code", "name", "status", "message"},
            {"code", "name", "status", "message", "fix"},
        )
        assert finding.get("fix", "x") != ""
    by = {f["code"]: f for f in report["findings"]}
    assert "fix" not in by["driver"]
    # Plain strings, not enum members, so the JSON is the contract's vocabulary.
    assert {type(f["status"]) for f in report["findings"]} == {str}
    assert type(report["attach"]) is str
    assert json.loads(json.dumps(report)) == report


def test_it_reports_no_gpu_in_json():
    report = diagnose(smi=None).to_dict("cpu-01")
    assert report["present"] is False
    assert report["devices"] == []
    assert report["attach"] == "none"
    assert [f["code"] for f in report["findings"]] == ["driver"]
    assert report["findings"][0]["fix"] == DRIVER_HINT


@pytest.mark.parametrize("status", ["ok", "warn", "fail", Status.WARN])
def test_it_accepts_statuses_as_plain_strings(status):
    assert Finding("x", "X", status, "m").status == status


def test_it_refuses_an_unknown_status():
    with pytest.raises(ValueError):
        Finding("x", "X", "bad", "m")


def test_it_treats_no_findings_as_ok():
    info = Info(
        present=True,
        driver_version="1",
        devices=(Device(0, "u", "n", 1, 1, 1),),
        runtime_installed=True,
    )
    d = HostDiagnosis(info, "", (), (), "legacy", ())
    assert d.worst_status == "ok"
    assert not d.failed


@pytest.mark.parametrize(
    "name, spec",
    [
        ("nvidia.yaml", True),
        ("nvidia.yml", True),
        ("nvidia.json", True),
        ("nvidia.yaml.bak", False),
        ("nvidia.yaml~", False),
        ("README", False),
        ("nvidia.txt", False),
    ],
)
def test_it_knows_cdi_spec_file_names(name, spec):
    assert is_cdi_spec_name(name) is spec


@pytest.mark.parametrize(
    "text, mentions",
    [
        (recording("cdi-nvidia.yaml"), True),
        ('{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": []}', True),
        ("cdiVersion: 0.7.0\nkind: vendor.com/net\n", False),
        ("", False),
    ],
)
def test_it_knows_an_nvidia_gpu_spec(text, mentions):
    assert cdi_spec_mentions_gpu(text) is mentions
