"""GPU health: the extended nvidia-smi query, older drivers, MIG, Xid errors from the
kernel log, half-failing nvidia-smi, and the findings each of them gives."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet import gpu
from gpufleet.gpu import SMI_LIST_ARGV, SMI_QUERY_ARGV, DockerInfo, SmiQuery, Status, detect, diagnose_host
from tests.fakes.memory import DMESG, FakeDocker, exited, host, ok
from tests.fakes.recorded import recording

NOW = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
DOCKER = DockerInfo(runtimes=("runc", "nvidia"))


def smi_query_calls(runner) -> list[tuple[str, ...]]:
    return [argv for argv, _ in runner.calls if argv[1].startswith("--query-gpu=")]


def diagnose(runner, **kwargs) -> gpu.HostDiagnosis:
    return diagnose_host(runner, FakeDocker(DOCKER), [], now=NOW, **kwargs)


def finding(diagnosis: gpu.HostDiagnosis, code: str) -> gpu.Finding:
    return next(f for f in diagnosis.findings if f.code == code)


def codes(diagnosis: gpu.HostDiagnosis) -> list[str]:
    return [f.code for f in diagnosis.findings]


# --- the query ---------------------------------------------------------------


def test_it_asks_nvidia_smi_for_the_reference_fields_then_every_health_field_in_one_call():
    query = SMI_QUERY_ARGV[1].removeprefix("--query-gpu=").split(",")
    assert query[:7] == ["index", "uuid", "name", "memory.total", "memory.used", "utilization.gpu", "driver_version"]
    assert "remapped_rows.failure" in query and "clocks_event_reasons.hw_power_brake_slowdown" in query
    assert {"pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
            "power.draw.average", "clocks_event_reasons_counters.sw_power_cap"} <= set(query)
    assert len(query) == 42
    assert SMI_QUERY_ARGV[2] == "--format=csv,noheader,nounits"


def test_it_reads_every_health_field_of_a_datacenter_gpu():
    runner = host(smi=recording("health/smi-8x-h100.csv"))
    info = detect(runner, DOCKER)
    first, second = info.devices[0], info.devices[1]
    assert first.to_dict() == {
        "index": 0, "uuid": "GPU-6b3c0a1e-4f1d-9c2b-8e7a-1d2c3b4a5f60", "name": "NVIDIA H100 80GB HBM3",
        "vram_total_mib": 81559, "vram_used_mib": 1024, "utilization_percent": 0,
        "pci_bus_id": "00000000:18:00.0", "temperature_c": 33, "memory_temperature_c": 41,
        "power_draw_w": 118.4, "power_limit_w": 700.0, "fan_percent": None, "pstate": "P0",
        "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "persistence_mode": True, "ecc_mode": True,
        "ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
        "retired_pages_pending": False, "remapped_rows_correctable": 0, "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False, "remapped_rows_failure": False, "throttle_reasons": [],
        "mig_mode": False, "mig_devices": [], "xid_errors": [], "processes": [], "attached_idle": [],
        # This driver's listing (its recording's columns) has none of the newer fields.
        "pcie_link_gen": None, "pcie_link_gen_max": None, "pcie_link_width": None, "pcie_link_width_max": None,
        "power_draw_average_w": None, "sw_power_cap_us": None, "sw_thermal_slowdown_us": None,
        "hw_thermal_slowdown_us": None, "hw_power_brake_slowdown_us": None, "sync_boost_us": None, "nvlink": [],
    }
    assert second.throttle_reasons == ("sw_power_cap",)
    assert len(smi_query_calls(runner)) == 1


def test_it_reads_placeholders_as_unknown_never_zero_on_a_consumer_gpu():
    info = detect(host(smi=recording("health/smi-2x-geforce.csv")), DOCKER)
    rtx4090, rtx3060 = info.devices
    assert rtx4090.name == "NVIDIA GeForce RTX 4090" and rtx4090.fan_percent == 30
    for key in ("memory_temperature_c", "ecc_mode", "ecc_uncorrected_volatile", "remapped_rows_failure", "mig_mode"):
        assert getattr(rtx4090, key) is None, key
    assert rtx4090.persistence_mode is False
    assert rtx3060.power_draw_w is None and rtx3060.fan_percent == 0


def test_it_reads_a_windows_host_with_crlf_and_no_persistence_mode():
    diagnosis = diagnose(host(smi=recording("health/smi-1x-windows-a4000.csv")))
    (a4000,) = diagnosis.info.devices
    assert a4000.name == "NVIDIA RTX A4000" and a4000.temperature_c == 41 and a4000.pci_bus_id == "00000000:65:00.0"
    assert a4000.persistence_mode is None and a4000.ecc_mode is False
    assert "persistence" not in codes(diagnosis)  # unknown is not "off"


@pytest.mark.parametrize("value", ["Enabled", "Yes", "Active", "enabled"])
def test_it_reads_the_true_words_as_true(value):
    (field,) = [f for f in gpu.ALL_FIELDS if f.query == "persistence_mode"]
    assert gpu.parse_smi(f"0, GPU-a, T4, 1, 0, 0, 1.0, {value}\n", gpu.REFERENCE_FIELDS + (field,))[1][0].persistence_mode


def test_a_boolean_it_does_not_know_is_unknown():
    (field,) = [f for f in gpu.ALL_FIELDS if f.query == "persistence_mode"]
    _, [device] = gpu.parse_smi("0, GPU-a, T4, 1, 0, 0, 1.0, Maybe\n", gpu.REFERENCE_FIELDS + (field,))
    assert device.persistence_mode is None


# --- older drivers -------------------------------------------------------------


def test_it_asks_an_older_driver_only_for_the_fields_its_help_lists_in_one_call():
    runner = host(smi=recording("health/smi-1x-v100-r450.csv"))
    query = SmiQuery()
    info = detect(runner, DOCKER, query)
    (v100,) = info.devices
    assert v100.name == "Tesla V100-SXM2-32GB" and v100.temperature_c == 36 and v100.ecc_mode is True
    assert v100.remapped_rows_pending is None and v100.throttle_reasons is None
    assert len(smi_query_calls(runner)) == 1 and query.rejected == set()
    assert [argv for argv, _ in runner.calls].count(tuple(gpu.SMI_HELP_ARGV)) == 1


def without_help(runner):
    """The runner with --help-query-gpu failing, as a wrapper script that forwards only
    --query-gpu would."""
    runner.results[tuple(gpu.SMI_HELP_ARGV)] = exited(gpu.SMI_HELP_ARGV, 2, stdout="Invalid combination of input arguments.")
    return runner


def test_without_help_it_drops_the_fields_an_older_driver_rejects_and_keeps_the_rest():
    runner = without_help(host(smi=recording("health/smi-1x-v100-r450.csv")))
    query = SmiQuery()
    (v100,) = detect(runner, DOCKER, query).devices
    assert v100.name == "Tesla V100-SXM2-32GB" and v100.temperature_c == 36 and v100.ecc_mode is True
    assert v100.remapped_rows_pending is None and v100.throttle_reasons is None
    # One rejection per group the driver lacks: remapped_rows.*, clocks_event_reasons.*,
    # then the reasons' old name, clocks_throttle_reasons.*, pcie.link.*, power.draw.average,
    # clocks_event_reasons_counters.*.
    assert len(smi_query_calls(runner)) == 7
    reasons = [f.query for f in gpu.ALL_FIELDS if f.query.startswith("clocks_event_reasons.")]
    assert query.rejected == {
        *(f.query for f in gpu.ALL_FIELDS if f.query.startswith(("remapped_rows.", "pcie.link.",
                                                                   "clocks_event_reasons_counters."))),
        *reasons, *(r.replace("clocks_event_reasons.", "clocks_throttle_reasons.") for r in reasons),
        "power.draw.average",
    }


def test_a_driver_rejecting_fields_in_any_number_of_groups_keeps_every_field_it_knows():
    # The case: four groups and more rejected no longer fall back to the seven
    # reference fields and lose the temperature.
    header = recording("health/smi-8x-h100.csv").splitlines()[0].split(", ")
    kept = [f for f in header if not f.startswith(("remapped_rows.", "clocks_event_reasons.", "ecc.errors."))
            and f not in ("pstate", "fan.speed [%]", "mig.mode.current")]
    rows = ["0, GPU-a, NVIDIA H100 80GB HBM3, 81559, 1024, 97, 550.90.07, 00000000:18:00.0, 71, 80, 612.0, 700.0,"
            " 1980, 1980, Enabled, Enabled, No"]
    assert len(kept) == len(rows[0].split(", "))
    runner = without_help(host(smi="\n".join([", ".join(kept), *rows]) + "\n"))
    query = SmiQuery()
    (h100,) = detect(runner, DOCKER, query).devices
    assert not query.reference_only
    assert (h100.temperature_c, h100.memory_temperature_c, h100.power_draw_w, h100.sm_clock_mhz) == (71, 80, 612.0, 1980)
    assert h100.persistence_mode is True and h100.ecc_mode is True and h100.retired_pages_pending is False
    assert h100.pstate is None and h100.fan_percent is None and h100.throttle_reasons is None
    runner.calls.clear()
    detect(runner, DOCKER, query)
    assert len(smi_query_calls(runner)) == 1  # learnt once per process


def test_it_asks_a_driver_before_r535_for_the_clock_event_reasons_by_their_old_name():
    runner = host(smi=recording("health/smi-2x-a100-r525.csv"))
    query = SmiQuery()
    hot, idle = detect(runner, DOCKER, query).devices
    assert hot.throttle_reasons == ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
    assert idle.throttle_reasons == () and idle.remapped_rows_pending is False
    assert "clocks_throttle_reasons.hw_slowdown" in smi_query_calls(runner)[-1][1]
    runner.calls.clear()
    detect(runner, DOCKER, query)
    assert len(smi_query_calls(runner)) == 1  # the old name is remembered too


def test_it_pays_for_a_rejected_field_once_per_process():
    runner = host(smi=recording("health/smi-1x-v100-r450.csv"))
    query = SmiQuery()
    detect(runner, DOCKER, query)
    runner.calls.clear()
    assert detect(runner, DOCKER, query).count == 1
    assert len(smi_query_calls(runner)) == 1


def test_it_falls_back_to_the_reference_fields_for_a_driver_that_knows_no_other():
    runner = without_help(host(smi="0, GPU-aaaa, Tesla K80, 11441, 0, 3, 470.82.01\n"))
    query = SmiQuery()
    info = detect(runner, DOCKER, query)
    assert [d.name for d in info.devices] == ["Tesla K80"] and info.devices[0].temperature_c is None
    assert query.fields == gpu.REFERENCE_FIELDS
    assert smi_query_calls(runner)[-1] == tuple(gpu.REFERENCE_QUERY_ARGV)
    # Each retry asks for fewer fields: at most one a health field, then the reference ones.
    assert len(smi_query_calls(runner)) <= len(gpu.ALL_FIELDS) - len(gpu.REFERENCE_FIELDS) + 1


def test_a_driver_that_knows_only_the_reference_fields_says_so_in_its_help():
    runner = host(smi="0, GPU-aaaa, Tesla K80, 11441, 0, 3, 470.82.01\n")
    info = detect(runner, DOCKER, SmiQuery())
    assert [d.name for d in info.devices] == ["Tesla K80"]
    assert smi_query_calls(runner) == [tuple(gpu.REFERENCE_QUERY_ARGV)]


def test_it_does_not_retry_a_driver_failure():
    runner = host(smi=exited(SMI_QUERY_ARGV, 9, stdout=recording("smi-error-exit9.txt")))
    info = detect(runner, DOCKER)
    assert not info.present and "couldn't communicate" in info.no_gpu_reason
    assert len(smi_query_calls(runner)) == 1


# --- MIG -----------------------------------------------------------------------


def test_it_lists_the_mig_slices_of_a_gpu_in_mig_mode():
    runner = host(smi=recording("health/smi-2x-a100-mig.csv"))
    runner.results[tuple(SMI_LIST_ARGV)] = ok(SMI_LIST_ARGV, recording("health/smi-list-a100-mig.txt"))
    mig, plain = detect(runner, DOCKER).devices
    assert mig.mig_mode is True and mig.utilization_percent is None
    assert [m.to_dict() for m in mig.mig_devices] == [
        {"uuid": "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "profile": "3g.40gb", "device": 0},
        {"uuid": "MIG-2f1c0a9e-8b7d-5c6e-a4f3-b2e1d0c9f8a7", "profile": "2g.20gb", "device": 1},
        {"uuid": "MIG-9e8d7c6b-5a4f-5e3d-b2c1-a0f9e8d7c6b5", "profile": "1g.10gb", "device": 2},
    ]
    assert plain.mig_mode is False and plain.mig_devices == ()


def test_it_keeps_a_mig_gpu_when_its_slices_cannot_be_listed():
    (mig, _) = detect(host(smi=recording("health/smi-2x-a100-mig.csv")), DOCKER).devices  # no `nvidia-smi -L`
    assert mig.mig_mode is True and mig.mig_devices == ()


def test_it_does_not_list_slices_when_no_gpu_is_in_mig_mode():
    runner = host(smi=recording("health/smi-8x-h100.csv"))
    detect(runner, DOCKER)
    assert tuple(SMI_LIST_ARGV) not in [argv for argv, _ in runner.calls]


# --- nvidia-smi half failing ----------------------------------------------------


def test_it_keeps_the_rows_of_a_corrupt_inforom_exit_14_and_warns():
    runner = host(smi=exited(SMI_QUERY_ARGV, 14, stdout=recording("health/smi-2x-h100-inforom.exit14.csv")))
    diagnosis = diagnose(runner)
    assert diagnosis.info.count == 2
    driver = finding(diagnosis, "driver")
    assert driver.status == Status.WARN and "infoROM is corrupted" in driver.message and "code 14" in driver.message


def test_it_keeps_the_good_gpus_when_one_is_lost_exit_15_and_fails_the_lost_one():
    runner = host(smi=exited(SMI_QUERY_ARGV, 15, stdout=recording("health/smi-3x-h100-gpu-lost.exit15.csv")))
    diagnosis = diagnose(runner)
    assert [d.index for d in diagnosis.info.devices] == [0, 1, 3]
    lost = finding(diagnosis, "lost:0000:3A:00.0")
    assert lost.status == Status.FAIL and "0000:3A:00.0" in lost.message and "GPU is lost" in lost.message
    assert "nvidia-smi -r" in lost.fix and "reboot" in lost.fix.lower() and "hardware" in lost.fix.lower()
    assert diagnosis.failed


@pytest.mark.parametrize(
    "code,said,remedy",
    [
        (18, "Failed to initialize NVML: Driver/library version mismatch", "reload the modules"),
        (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "modprobe nvidia"),
        (6, "No devices were found", "lspci"),
        (12, "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.", "user-space libraries"),
    ],
)
def test_it_gives_each_known_nvidia_smi_failure_its_own_remedy(code, said, remedy):
    diagnosis = diagnose(host(smi=exited(SMI_QUERY_ARGV, code, stdout=said + "\n")))
    driver = finding(diagnosis, "driver")
    assert driver.status == Status.FAIL and remedy in driver.fix
    assert "ubuntu-drivers" not in driver.fix


def test_it_still_says_install_a_driver_when_there_is_no_nvidia_smi():
    assert "ubuntu-drivers" in finding(diagnose(host(smi=None)), "driver").fix


# --- findings per GPU -------------------------------------------------------------


def test_it_finds_each_problem_of_a_gpu_in_trouble_by_index_and_pci_address():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100-failing.csv")))
    thermal = finding(diagnosis, "gpu2.thermal")
    assert thermal.status == Status.FAIL and "hw_thermal_slowdown" in thermal.message and "92 °C" in thermal.message
    assert "GPU 2" in thermal.name and "00000000:3A:00.0" in thermal.name
    ecc = finding(diagnosis, "gpu5.ecc")
    assert ecc.status == Status.FAIL and "4 uncorrectable ECC errors" in ecc.message and "row remapping failed" in ecc.message
    pending = finding(diagnosis, "gpu6.ecc")
    assert pending.status == Status.WARN and "reset the gpu or reboot" in pending.fix.lower()
    brake = finding(diagnosis, "gpu7.power")
    assert brake.status == Status.FAIL and "power brake" in brake.message.lower()
    persistence = finding(diagnosis, "persistence")
    assert persistence.status == Status.WARN and persistence.fix == "sudo nvidia-smi -pm 1"
    assert "(0 at PCI 00000000:18:00.0, 1 at PCI 00000000:2A:00.0, " in persistence.message
    assert "gpu7.thermal" not in codes(diagnosis)  # its hw_slowdown is the brake's, not heat
    # The healthy GPUs get no extra finding; sw_power_cap alone is normal under load.
    assert not [c for c in codes(diagnosis) if c.startswith(("gpu0.", "gpu1.", "gpu3.", "gpu4."))]


def test_it_warns_of_a_hot_gpu_from_the_configured_level():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv")), temperature_warn_c=38)
    hot = [f.code for f in diagnosis.findings if f.code.endswith(".thermal")]
    assert hot == ["gpu5.thermal", "gpu6.thermal", "gpu7.thermal"]  # 38, 39 and 40 °C
    assert finding(diagnosis, "gpu5.thermal").status == Status.WARN


def test_a_healthy_datacenter_node_has_nothing_to_report():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), ctk="NVIDIA Container Toolkit CLI version 1.18.2\n"))
    assert diagnosis.worst_status == Status.OK, [(f.code, f.message) for f in diagnosis.findings if f.status != "ok"]


# --- Xid errors --------------------------------------------------------------------


def test_it_counts_xid_errors_per_gpu_within_the_window_from_iso_dmesg():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), dmesg=recording("health/kernel-iso.txt")))
    by_index = {d.index: d for d in diagnosis.info.devices}
    assert [x.to_dict() for x in by_index[4].xid_errors] == [
        {"xid": 119, "count": 2, "last_seen": "2026-12-03T16:05:10.101883+00:00", "description": "GSP RPC timeout"}
    ]
    assert [x.xid for x in by_index[1].xid_errors] == [13]
    assert by_index[0].xid_errors == ()  # Xid 48 on 30 November is outside the 24 h window
    gsp = finding(diagnosis, "gpu4.xid")
    assert gsp.status == Status.FAIL and "Xid 119 ×2" in gsp.message and "reset" in gsp.fix.lower()
    app = finding(diagnosis, "gpu1.xid")
    assert app.status == Status.WARN and "Restart the application" in app.fix


def test_a_longer_window_counts_the_older_xid():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), dmesg=recording("health/kernel-iso.txt")), xid_window_hours=24 * 7)
    assert finding(diagnosis, "gpu0.xid").status == Status.FAIL  # Xid 48, double bit ECC


def test_it_reads_fallen_off_the_bus_from_dmesg_t_once_as_xid_79():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), dmesg=recording("health/kernel-ctime.txt")))
    (xid,) = diagnosis.info.devices[7].xid_errors
    assert (xid.xid, xid.count, xid.last_seen) == (79, 1, "2026-12-03T15:40:02+00:00")
    assert finding(diagnosis, "gpu7.xid").status == Status.FAIL


def test_repeated_xids_each_count_even_within_one_second_or_without_a_time():
    now = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
    same_second = "\n".join(
        ["2026-12-03T15:00:01,000000+00:00 NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=python, Graphics Exception"] * 3
    )
    untimed = "\n".join(["[  12.5] NVRM: Xid (0000:18:00): 31, Ch 00000010, intr 10000000"] * 2)
    assert [e.xid for e in gpu.parse_kernel_log(same_second, now)] == [13, 13, 13]
    assert [e.xid for e in gpu.parse_kernel_log(untimed, now)] == [31, 31]


def test_it_reads_plain_dmesg_without_wall_clock_times():
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), dmesg=recording("health/kernel-plain.txt")))
    assert [(x.xid, x.last_seen) for x in diagnosis.info.devices[0].xid_errors] == [(14, None), (31, None)]


def test_it_reads_journalctl_and_a_multi_line_fall_off_the_bus_for_a_gpu_nvidia_smi_lost():
    runner = host(smi=exited(SMI_QUERY_ARGV, 15, stdout=recording("health/smi-3x-h100-gpu-lost.exit15.csv")),
                  dmesg=recording("health/kernel-journal.txt"))
    diagnosis = diagnose(runner)
    gone = finding(diagnosis, "xid:0000:3a:00")
    assert gone.status == Status.FAIL and "Xid 79" in gone.message and "not listed by nvidia-smi" in gone.name
    # Xid 94 names 0000:5d:00, GPU 3 of this node.
    assert [x.xid for x in diagnosis.info.devices[2].xid_errors] == [94]


def test_it_warns_and_says_how_to_grant_it_when_the_kernel_log_is_not_readable():
    denied = exited(DMESG, 1, stderr=recording("health/kernel-denied.txt"))
    diagnosis = diagnose(host(smi=recording("health/smi-8x-h100.csv"), dmesg=denied))
    log = finding(diagnosis, "kernel-log")
    assert log.status == Status.WARN and "Operation not permitted" in log.message
    assert "CAP_SYSLOG" in log.fix and "dmesg_restrict" in log.fix


def test_every_catalogued_xid_has_a_description_and_an_action_and_application_errors_only_warn():
    for code, entry in gpu.XID_CATALOGUE.items():
        assert entry.description and entry.action, code
    assert {c for c, e in gpu.XID_CATALOGUE.items() if not e.fails} >= {13, 31, 43, 45}
    assert {c for c, e in gpu.XID_CATALOGUE.items() if e.fails} >= {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    assert not gpu.xid_code(99999).fails and "99999" in gpu.xid_code(99999).description


def test_a_mig_uuid_is_a_claim_device_id_that_holds_its_gpu():
    runner = host(smi=recording("health/smi-2x-a100-mig.csv"))
    runner.results[tuple(SMI_LIST_ARGV)] = ok(SMI_LIST_ARGV, recording("health/smi-list-a100-mig.txt"))
    info = detect(runner, DOCKER)
    slice_claim = gpu.Claim(name="infer", device_ids=("MIG-2F1C0A9E-8B7D-5C6E-A4F3-B2E1D0C9F8A7",))
    ledger = gpu.Ledger(info, [slice_claim])
    assert gpu.Ledger(info, []).fit(slice_claim) is None
    assert ledger.holder_of(0) == "infer" and ledger.free == 1
    taken = gpu.Ledger(info, [slice_claim]).fit(gpu.Claim(name="train", device_ids=("0",)))
    assert isinstance(taken, gpu.DeviceTaken)
    assert isinstance(gpu.Ledger(info, []).fit(gpu.Claim(name="x", device_ids=("MIG-unknown",))), gpu.UnknownDevice)


def test_cdi_names_of_mig_slices_count_as_gpu_attach():
    info = detect(host(smi=recording("health/smi-2x-a100-mig.csv")), DockerInfo(cdi_devices=("nvidia.com/gpu=0:1",)))
    assert info.cdi_devices == ("nvidia.com/gpu=0:1",) and info.usable
