"""What the driver knows (--help-query-gpu of three driver generations), the PCIe link
against the one it should have, and NVLinks (nvidia-smi nvlink -s / -e of an 8-GPU
A100 host): the fields read and the findings they give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet import gpu
from gpufleet.gpu import DockerInfo, SmiQuery, detect, diagnose_host
from tests.fakes.memory import NVLINK_ERRORS, NVLINK_STATUS, FakeDocker, host, ok
from tests.fakes.recorded import recording

NOW = datetime(2026, 12, 3, 17, 0, tzinfo=UTC)
DOCKER = DockerInfo(runtimes=("runc", "nvidia"))
HELP = {"535": "drivers/help-query-gpu-535.129.03.txt", "580": "drivers/help-query-gpu-580.173.02.txt",
        "590": "drivers/help-query-gpu-590.48.01.txt"}
NEW_FIELDS = ("pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
              "power.draw.average", "clocks_event_reasons_counters.sw_power_cap")


def a100_host(status: str = "drivers/nvlink-s-8x-a100.txt", errors: str = "drivers/nvlink-e-8x-a100.txt"):
    runner = host(smi=recording("health/smi-8x-a100-r535.csv"))
    runner.help = recording(HELP["535"])
    runner.results[NVLINK_STATUS] = ok(NVLINK_STATUS, recording(status))
    runner.results[NVLINK_ERRORS] = ok(NVLINK_ERRORS, recording(errors))
    return runner


def finding(diagnosis, code):
    return next((f for f in diagnosis.findings if f.code == code), None)


# --- what each driver knows ----------------------------------------------------------


def test_it_reads_every_quoted_name_of_a_property_line_and_no_description():
    known = gpu.parse_help_query_gpu(recording(HELP["590"]))
    assert {"pcie.link.gen.current", "pcie.link.gen.gpucurrent", "power.draw.average", "gpu.power.draw.average",
            "clocks_event_reasons.sw_power_cap", "clocks_throttle_reasons.sw_power_cap", "clocks.max.sm"} <= known
    # Description lines quote words too ("0: Default" means ..., Value is either "Enabled" ...).
    assert not {"0: Default", "Enabled", "YYYY/MM/DD HH:MM:SS.msec", "All On"} & known


@pytest.mark.parametrize("driver, knows, lacks", [
    # R535: clock-event reasons by both names, PCIe and the average power; no counters, no row remapping
    ("535", {*NEW_FIELDS[:5], "clocks_event_reasons.hw_slowdown", "retired_pages.pending"},
     {"clocks_event_reasons_counters.sw_power_cap", "remapped_rows.pending"}),
    # R580 and R590: everything gpufleet asks for
    ("580", {*NEW_FIELDS, "remapped_rows.failure"}, set()),
    ("590", {*NEW_FIELDS, "remapped_rows.failure"}, set()),
])
def test_each_driver_generation_is_asked_for_the_fields_it_lists(driver, knows, lacks):
    query = SmiQuery()
    query.learn(recording(HELP[driver]))
    asked = {f.query for f in query.fields}
    assert knows <= asked and not lacks & asked
    assert {f.query for f in gpu.REFERENCE_FIELDS} <= asked


def test_a_listing_without_the_reference_fields_is_no_listing():
    query = SmiQuery()
    query.learn("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    assert query.known is None


def test_it_learns_the_fields_again_when_the_driver_changes():
    runner = host(smi=recording("health/smi-1x-h100-r590.csv"))
    query = SmiQuery()
    detect(runner, DOCKER, query)
    upgraded = recording("health/smi-1x-h100-r590.csv").replace("590.48.01", "595.71.05")
    runner.results[tuple(gpu.SMI_QUERY_ARGV)] = ok(gpu.SMI_QUERY_ARGV, upgraded)
    runner.calls.clear()
    info = detect(runner, DOCKER, query)
    assert info.driver_version == "595.71.05" and query.driver == "595.71.05"
    assert [argv for argv, _ in runner.calls].count(tuple(gpu.SMI_HELP_ARGV)) == 1


def test_it_reads_the_link_power_and_throttle_time_of_an_r590_gpu_in_one_query():
    runner = host(smi=recording("health/smi-1x-h100-r590.csv"))
    runner.help = recording(HELP["590"])
    (h100,) = detect(runner, DOCKER, SmiQuery()).devices
    assert (h100.pcie_link_gen, h100.pcie_link_gen_max, h100.pcie_link_width, h100.pcie_link_width_max) == (1, 5, 16, 16)
    assert h100.power_draw_average_w == 69.03 and h100.sw_power_cap_us == 1023200 and h100.sync_boost_us == 0
    # Fields the driver lists and this GPU has no column of print [N/A]: unknown.
    assert h100.fan_percent is None and h100.remapped_rows_failure is None
    assert len([a for a, _ in runner.calls if a[1].startswith("--query-gpu=")]) == 1


# --- PCIe -------------------------------------------------------------------------------


def test_a_busy_gpu_on_a_downtrained_link_warns_and_an_idle_one_does_not():
    diagnosis = diagnose_host(a100_host(), FakeDocker(DOCKER), [], now=NOW)
    gpu3 = finding(diagnosis, "gpu3.pcie")
    assert gpu3.status == "warn"
    assert gpu3.name == "GPU 3 (NVIDIA A100-SXM4-40GB, PCI 00000000:0D:00.0)"
    assert "runs at Gen3 x16" in gpu3.message and "should run at Gen4 x16" in gpu3.message
    assert "Reseat" in gpu3.fix and "riser" in gpu3.fix and "BIOS" in gpu3.fix and "00000000:0D:00.0" in gpu3.fix
    idle = diagnosis.info.devices[5]
    assert idle.pcie_link_gen == 1 and idle.utilization_percent == 0
    assert finding(diagnosis, "gpu5.pcie") is None  # idle: Gen1 to save power
    assert [f.code for f in diagnosis.findings if f.code.endswith(".pcie")] == ["gpu3.pcie"]


def test_a_process_makes_a_gpu_busy_as_the_idle_rule_says():
    rule = gpu.IdleRule(util_percent=99)
    diagnosis = diagnose_host(a100_host(), FakeDocker(DOCKER), [], now=NOW, idle_rule=rule)
    assert finding(diagnosis, "gpu3.pcie") is None  # 97 % is idle under a 99 % rule


# --- NVLink -----------------------------------------------------------------------------


def test_it_reads_the_links_and_counters_of_an_8_gpu_nvlink_host():
    info = detect(a100_host(), DOCKER, SmiQuery())
    assert [len(d.nvlink) for d in info.devices] == [12] * 8
    assert info.devices[0].nvlink[0].to_dict() == {"link": 0, "state": "up", "replay_errors": 0,
                                                   "recovery_errors": 0, "crc_errors": 0}


def test_a_link_down_that_its_peers_have_up_fails():
    diagnosis = diagnose_host(a100_host(status="drivers/nvlink-s-8x-a100-link-down.txt"), FakeDocker(DOCKER), [],
                              now=NOW)
    gpu6 = finding(diagnosis, "gpu6.nvlink")
    assert gpu6.status == "fail" and "NVLink 4 down (11 of 12 links up)" in gpu6.message
    assert "PCI 00000000:10:00.0" in gpu6.name and "nvidia-smi -r -i 6" in gpu6.fix
    assert [f.code for f in diagnosis.findings if f.code.endswith(".nvlink")] == ["gpu6.nvlink"]


def test_error_counters_that_grow_between_two_collections_warn_with_the_rate():
    query = SmiQuery()
    diagnose_host(a100_host(errors="drivers/nvlink-e-8x-a100-errors-before.txt"), FakeDocker(DOCKER), [],
                  now=NOW, query=query)
    after = a100_host(errors="drivers/nvlink-e-8x-a100-errors-after.txt")
    diagnosis = diagnose_host(after, FakeDocker(DOCKER), [], now=NOW + timedelta(seconds=30), query=query)
    gpu2 = finding(diagnosis, "gpu2.nvlink")
    assert gpu2.status == "warn"
    assert "link 7 replay +300 (600.0/min), CRC +900 (1800.0/min)" in gpu2.message
    assert "recovery" not in gpu2.message  # it did not grow
    # The same counts again: nothing grew.
    again = diagnose_host(a100_host(errors="drivers/nvlink-e-8x-a100-errors-after.txt"), FakeDocker(DOCKER), [],
                          now=NOW + timedelta(seconds=60), query=query)
    assert finding(again, "gpu2.nvlink") is None


def test_counters_seen_once_say_nothing():
    diagnosis = diagnose_host(a100_host(errors="drivers/nvlink-e-8x-a100-errors-after.txt"), FakeDocker(DOCKER), [],
                              now=NOW, query=SmiQuery())
    assert finding(diagnosis, "gpu2.nvlink") is None


def test_a_host_without_nvlink_is_asked_once():
    runner = host(smi=recording("health/smi-8x-h100.csv"))
    query = SmiQuery()
    assert detect(runner, DOCKER, query).devices[0].nvlink == ()
    runner.calls.clear()
    detect(runner, DOCKER, query)
    assert NVLINK_STATUS not in [argv for argv, _ in runner.calls]
