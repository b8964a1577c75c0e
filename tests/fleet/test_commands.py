"""manage.py doctor and collect --once, on a fake host at the boundary
(fake nvidia-smi / nvidia-ctk on PATH, a Docker Engine API on a unix socket)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from gpufleet.fleet.models import Node
from tests.fakes.recorded import DATA_DIR, H200_UUIDS

REPO = Path(__file__).resolve().parents[2]
DOCTOR_KEYS = [
    "node", "present", "driver_version", "devices", "runtime_installed", "toolkit_version",
    "cdi_spec_files", "cdi_devices", "attach", "findings",
]
# The reference package's six device keys, then the health keys, then who is on the GPU, in this order.
DEVICE_KEYS = [
    "index", "uuid", "name", "vram_total_mib", "vram_used_mib", "utilization_percent",
    "pci_bus_id", "temperature_c", "memory_temperature_c", "power_draw_w", "power_limit_w", "fan_percent",
    "pstate", "sm_clock_mhz", "sm_clock_max_mhz", "persistence_mode", "ecc_mode", "ecc_corrected_volatile",
    "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "retired_pages_pending",
    "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure",
    "throttle_reasons", "mig_mode", "pcie_link_gen", "pcie_link_gen_max", "pcie_link_width", "pcie_link_width_max",
    "power_draw_average_w", "sw_power_cap_us", "sw_thermal_slowdown_us", "hw_thermal_slowdown_us",
    "hw_power_brake_slowdown_us", "sync_boost_us", "mig_devices", "xid_errors", "processes", "attached_idle", "nvlink",
]


def _doctor_json(capsys) -> tuple[dict, int]:
    code = 0
    try:
        call_command("doctor", json=True)
    except SystemExit as exc:
        code = exc.code
    return json.loads(capsys.readouterr().out), code


def _finding(report: dict, code: str) -> dict:
    return next(f for f in report["findings"] if f["code"] == code)


def test_it_reports_an_8_gpu_cdi_host_in_the_documented_keys(fake_host, capsys, settings):
    settings.GPUFLEET_NODE_NAME = "gpu-a"
    fake_host.write_cdi_spec()
    report, code = _doctor_json(capsys)
    assert code == 0
    assert list(report) == DOCTOR_KEYS
    assert report["node"] == "gpu-a"
    assert len(report["devices"]) == 8 and list(report["devices"][0]) == DEVICE_KEYS
    assert report["attach"] == "cdi"
    assert report["runtime_installed"] is True
    assert report["toolkit_version"].endswith("1.18.2")
    assert report["cdi_spec_files"] == [str(fake_host.run_cdi / "nvidia.yaml")]
    assert all(d.startswith("nvidia.com/gpu=") for d in report["cdi_devices"])
    assert [f["code"] for f in report["findings"]][:9] == ["driver"] + [f"gpu{i}" for i in range(8)]
    # The recorded H200s: GPU 0 has 130013 of 143771 MiB in use (90.4 %), GPU 7 58071.
    assert _finding(report, "gpu0")["status"] == "warn"
    assert _finding(report, "gpu7")["status"] == "ok"
    assert all(_finding(report, c)["status"] == "ok" for c in ("driver", "toolkit", "cdi", "runtime", "attach"))


HEALTH = DATA_DIR / "health"


@pytest.mark.parametrize(
    "recording, expected",
    [
        # datacenter: every field known
        ("smi-8x-h100.csv", {"pci_bus_id": "00000000:18:00.0", "temperature_c": 33, "power_limit_w": 700.0,
                             "ecc_mode": True, "remapped_rows_failure": False, "throttle_reasons": []}),
        # consumer: no ECC, no row remapping, no MIG
        ("smi-2x-geforce.csv", {"name": "NVIDIA GeForce RTX 4090", "fan_percent": 30, "ecc_mode": None,
                                "remapped_rows_pending": None, "mig_mode": None, "persistence_mode": False}),
        # Windows: CRLF, no persistence mode
        ("smi-1x-windows-a4000.csv", {"name": "NVIDIA RTX A4000", "persistence_mode": None, "ecc_mode": False}),
        # a driver before R535: the clock-event reasons by their old name
        ("smi-2x-a100-r525.csv", {"temperature_c": 88, "remapped_rows_correctable": 0,
                                  "throttle_reasons": ["hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"]}),
        # an older driver that rejects the throttle and row-remapping fields
        ("smi-1x-v100-r450.csv", {"name": "Tesla V100-SXM2-32GB", "temperature_c": 36, "throttle_reasons": None,
                                  "remapped_rows_correctable": None, "ecc_mode": True}),
    ],
)
def test_doctor_json_reports_the_health_keys_of_each_gpu_family(fake_host, capsys, recording, expected):
    fake_host.smi(HEALTH / recording)
    report, _ = _doctor_json(capsys)
    device = report["devices"][0]
    assert list(device) == DEVICE_KEYS
    assert {key: device[key] for key in expected} == expected


def test_doctor_json_lists_the_mig_devices_of_a_gpu_in_mig_mode(fake_host, capsys):
    fake_host.smi(HEALTH / "smi-2x-a100-mig.csv", listing=HEALTH / "smi-list-a100-mig.txt")
    report, _ = _doctor_json(capsys)
    mig, plain = report["devices"]
    assert mig["mig_mode"] is True and mig["utilization_percent"] is None
    assert mig["mig_devices"] == [
        {"uuid": "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "profile": "3g.40gb", "device": 0},
        {"uuid": "MIG-2f1c0a9e-8b7d-5c6e-a4f3-b2e1d0c9f8a7", "profile": "2g.20gb", "device": 1},
        {"uuid": "MIG-9e8d7c6b-5a4f-5e3d-b2c1-a0f9e8d7c6b5", "profile": "1g.10gb", "device": 2},
    ]
    assert plain["mig_mode"] is False and plain["mig_devices"] == []
    calls = [json.loads(line)["argv"] for line in fake_host.log_path.read_text().splitlines()]
    assert ["-L"] in calls


def test_the_fake_nvidia_smi_lists_the_gpus_of_its_recording(fake_host):
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    assert listed.splitlines()[0] == f"GPU 0: NVIDIA H200 (UUID: {H200_UUIDS[0]})"
    assert len(listed.splitlines()) == 8


def test_doctor_json_reports_xids_and_gpu_problems_through_the_real_commands(fake_host, capsys):
    fake_host.smi(HEALTH / "smi-8x-h100-failing.csv")
    # The recorded fall, moved to an hour ago so it is inside the Xid window whenever this runs.
    an_hour_ago = (datetime.now() - timedelta(hours=1)).strftime("%a %b %e %H:%M:%S %Y")
    fake_host.kernel_log((HEALTH / "kernel-ctime.txt").read_text().replace("Thu Dec  3 15:40:02 2026", an_hour_ago))
    report, code = _doctor_json(capsys)
    assert code == 1
    assert report["devices"][7]["xid_errors"] == [
        {"xid": 79, "count": 1, "last_seen": report["devices"][7]["xid_errors"][0]["last_seen"],
         "description": "GPU has fallen off the bus"}
    ]
    assert _finding(report, "gpu7.xid")["status"] == "fail"
    assert _finding(report, "gpu5.ecc")["status"] == "fail"
    assert _finding(report, "persistence")["fix"] == "sudo nvidia-smi -pm 1"


def test_doctor_keeps_the_good_gpus_of_an_exit_15(fake_host, capsys):
    fake_host.smi(HEALTH / "smi-3x-h100-gpu-lost.exit15.csv", exit_code=15)
    report, code = _doctor_json(capsys)
    assert code == 1
    assert [d["index"] for d in report["devices"]] == [0, 1, 3]
    assert _finding(report, "lost:0000:3A:00.0")["status"] == "fail"


def test_it_exits_1_and_says_why_when_there_is_no_gpu(fake_host, capsys):
    fake_host.smi_missing()
    report, code = _doctor_json(capsys)
    assert code == 1
    assert report["present"] is False and report["devices"] == [] and report["attach"] == "none"
    driver = _finding(report, "driver")
    assert driver["status"] == "fail"
    assert "nvidia-smi not found" in driver["message"]
    assert driver["fix"]


@pytest.mark.parametrize("recorded, words", [
    ("error-9", "couldn't communicate with the NVIDIA driver"),
    ("error-18", "Driver/library version mismatch"),
])
def test_it_keeps_nvidia_smi_error_texts_and_exit_codes(fake_host, capsys, recorded, words):
    fake_host.smi(recorded)
    report, code = _doctor_json(capsys)
    message = _finding(report, "driver")["message"]
    assert code == 1
    assert words in message
    assert ("code 9" if recorded == "error-9" else "code 18") in message


def test_it_gives_up_on_a_hung_nvidia_smi(fake_host, capsys, monkeypatch):
    import gpufleet.gpu.devices as devices

    monkeypatch.setattr(devices, "COMMAND_TIMEOUT_S", 1.0)
    fake_host.smi_hang()
    report, code = _doctor_json(capsys)
    assert code == 1
    assert "timed out" in _finding(report, "driver")["message"]
    # It gives up on the driver there (what it asks of it first, then its query), instead of
    # waiting out a timeout for each of its other nvidia-smi commands too.
    assert len(fake_host.calls("nvidia-smi")) == 2


def test_it_records_an_unreachable_docker_instead_of_crashing(fake_host, capsys):
    url = fake_host.docker_unreachable()
    report, code = _doctor_json(capsys)
    assert code == 1  # attach has no way in
    assert report["runtime_installed"] is False and report["attach"] == "none"
    runtime = _finding(report, "runtime")
    assert runtime["status"] == "warn" and "unreachable" in runtime["message"] and url in runtime["message"]
    # The toolkit is there: the remedy is about dockerd, naming the DOCKER_HOST in use.
    for finding in (runtime, _finding(report, "attach")):
        assert "nvidia-container-toolkit" not in finding["fix"]
        assert "systemctl status docker" in finding["fix"] and f"DOCKER_HOST is {url}" in finding["fix"]


def test_it_honours_the_environment_when_run_as_a_command(fake_host, tmp_path):
    fake_host.smi("a40")
    env = {**os.environ, **fake_host.env(), "GPUFLEET_NODE_NAME": "a40-box", "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "manage.py", "doctor", "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    report = json.loads(proc.stdout)
    assert report["node"] == "a40-box"
    assert [d["name"] for d in report["devices"]] == ["NVIDIA A40"] * 8
    # Six of the A40s are over 90 % VRAM in the recorded output: warnings, not failures.
    assert proc.returncode == 0, proc.stderr
    assert any(f["status"] == "warn" for f in report["findings"])


def test_it_prints_a_readable_report_without_json(fake_host, capsys):
    call_command("doctor")
    out = capsys.readouterr().out
    assert "[OK  ] NVIDIA driver:" in out
    assert "GPU 7" in out


@pytest.mark.django_db
def test_collect_once_records_an_8_gpu_node_with_its_findings(fake_host, capsys):
    call_command("collect", once=True, node="h200-01")
    node = Node.objects.get(name="h200-01")
    assert node.gpu_count == 8 and node.present and node.attach == "cdi"
    assert node.devices.filter(vanished_at__isnull=True).count() == 8
    findings = dict(node.findings.values_list("code", "status"))
    assert findings["driver"] == "ok" and findings["runtime"] == "ok" and findings["attach"] == "ok"
    assert findings["toolkit"] == "ok"
    assert "h200-01: snapshot accepted; 8 GPU(s)" in capsys.readouterr().out


@pytest.mark.django_db
def test_collect_once_records_this_host_without_a_gpu(fake_host, settings):
    settings.GPUFLEET_NODE_NAME = "plain"
    fake_host.smi_missing()
    call_command("collect", once=True)
    node = Node.objects.get(name="plain")
    assert node.gpu_count == 0 and node.health == "fail"
    driver = node.findings.get(code="driver")
    assert driver.status == "fail" and "not found" in driver.message


@pytest.mark.django_db
def test_collect_once_needs_once():
    with pytest.raises(CommandError):
        call_command("collect")


@pytest.mark.django_db
def test_collect_once_against_a_real_docker_daemon(fake_host, real_dockerd, monkeypatch):
    """Runtime detection through the Engine API of a real dockerd (nvidia runtime
    registered in its daemon.json, no GPU, no CDI devices: Docker 20.10 has none)."""
    monkeypatch.setenv("DOCKER_HOST", real_dockerd)
    call_command("collect", once=True, node="real-docker")
    node = Node.objects.get(name="real-docker")
    assert node.runtime_installed is True
    assert node.attach == "legacy"
    assert node.cdi_devices == []
    assert node.findings.get(code="runtime").status == "ok"


CONTAINER_ID = "4f1d9c2b8e7a1d2c3b4a5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e"


def test_doctor_json_attributes_each_process_to_its_gpu_and_container(fake_host, capsys, tmp_path, monkeypatch):
    fake_host.smi(HEALTH / "smi-8x-h100.csv")
    fake_host.compute_apps(
        "GPU-6b3c0a1e-4f1d-9c2b-8e7a-1d2c3b4a5f60, 4412, python3, 30211\n"
        "GPU-6b3c1a1e-4f1d-9c2b-8e7a-1d2c3b4a5f61, 6001, /usr/bin/python3, [N/A]\n"
    )
    proc = tmp_path / "proc"
    (proc / "4412").mkdir(parents=True)
    (proc / "4412" / "cgroup").write_text(f"0::/system.slice/docker-{CONTAINER_ID}.scope\n")
    (proc / "6001").mkdir()
    (proc / "6001" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    monkeypatch.setenv("GPUFLEET_PROC_ROOT", str(proc))
    idle, plain = "a" * 64, "b" * 64
    fake_host.engine.containers = [
        {"Id": CONTAINER_ID, "Names": ["/trainer"], "Image": "pytorch/pytorch:2.5.1-cuda12.4",
         "Labels": {"gpufleet.claim": "train-llm"}},
        {"Id": idle, "Names": ["/notebook"], "Image": "jupyter/base", "Labels": {}},
        {"Id": plain, "Names": ["/nginx"], "Image": "nginx", "Labels": {}},
    ]
    # `docker run --gpus '"device=3"'` that has not started CUDA yet; nginx asked for no GPU.
    fake_host.engine.inspected = {
        idle: {"HostConfig": {"DeviceRequests": [{"Driver": "", "Count": 0, "DeviceIDs": ["3"],
                                                   "Capabilities": [["gpu"]]}]}, "Config": {"Env": []}},
        plain: {"HostConfig": {"DeviceRequests": None}, "Config": {"Env": ["PATH=/usr/bin"]}},
    }
    report, _ = _doctor_json(capsys)
    assert report["devices"][0]["processes"] == [
        {"pid": 4412, "name": "python3", "used_mib": 30211,
         "container": {"id": CONTAINER_ID, "name": "trainer", "image": "pytorch/pytorch:2.5.1-cuda12.4",
                       "claim": "train-llm"}}
    ]
    assert report["devices"][1]["processes"] == [
        {"pid": 6001, "name": "/usr/bin/python3", "used_mib": None, "container": None}
    ]
    assert report["devices"][2]["processes"] == []
    assert report["devices"][3]["attached_idle"] == [{"id": idle, "name": "notebook", "image": "jupyter/base",
                                                     "claim": None}]
    assert [d["attached_idle"] for i, d in enumerate(report["devices"]) if i != 3] == [[]] * 7
    assert fake_host.engine.count("/containers/json") == 1
    # Only the containers with no GPU process are inspected, once each.
    assert fake_host.engine.count(f"/containers/{idle}/json") == 1
    assert fake_host.engine.count(f"/containers/{plain}/json") == 1
    assert fake_host.engine.count(f"/containers/{CONTAINER_ID}/json") == 0


DRIVERS = DATA_DIR / "drivers"


@pytest.mark.parametrize("recording, help_listing", [
    ("smi-8x-a100-r535.csv", "help-query-gpu-535.129.03.txt"),
    ("smi-1x-h100-r590.csv", "help-query-gpu-590.48.01.txt"),
    ("smi-8x-h100.csv", None),
])
def test_doctor_json_reports_the_link_keys_on_each_family(fake_host, capsys, recording, help_listing):
    fake_host.smi(HEALTH / recording, help=DRIVERS / help_listing if help_listing else None)
    report, _ = _doctor_json(capsys)
    for device in report["devices"]:
        assert list(device) == DEVICE_KEYS
        assert device["nvlink"] == []  # these GPUs' nvlink -s lists no link
    if help_listing:
        assert all(d["pcie_link_gen_max"] in (4, 5) and d["pcie_link_width"] == 16 for d in report["devices"])


def test_doctor_json_reports_the_nvlinks_and_a_downtrained_busy_gpu(fake_host, capsys):
    fake_host.smi(HEALTH / "smi-8x-a100-r535.csv", help=DRIVERS / "help-query-gpu-535.129.03.txt",
                  nvlink_status=DRIVERS / "nvlink-s-8x-a100-link-down.txt", nvlink_errors=DRIVERS / "nvlink-e-8x-a100.txt")
    report, code = _doctor_json(capsys)
    assert code == 1  # the link down fails
    gpu6 = report["devices"][6]
    assert len(gpu6["nvlink"]) == 12 and gpu6["nvlink"][4] == {
        "link": 4, "state": "down", "replay_errors": 0, "recovery_errors": 0, "crc_errors": 0}
    assert _finding(report, "gpu6.nvlink")["status"] == "fail"
    assert _finding(report, "gpu3.pcie")["status"] == "warn"
    assert [f["code"] for f in report["findings"] if f["code"].endswith(".pcie")] == ["gpu3.pcie"]
    tools = [c["argv"] for c in fake_host.calls("nvidia-smi")]
    assert tools.count(["--help-query-gpu"]) == 1 and ["nvlink", "-e"] in tools
