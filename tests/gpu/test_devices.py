"""parse_smi, Info and detect."""

from __future__ import annotations

import pytest

from gpufleet.gpu import (
    ALL_FIELDS,
    DEVICE_FIELDS,
    INSTALL_HINT,
    NESTED_DEVICE_FIELDS,
    REFERENCE_FIELDS,
    REFERENCE_QUERY_ARGV,
    THROTTLE_REASONS,
    Device,
    DockerInfo,
    Info,
    SmiParseError,
    detect,
    parse_smi,
)
from gpufleet.gpu.devices import HEALTH_FIELDS, MigDevice, XidCount
from gpufleet.gpu.processes import Container, GpuProcess
from tests.fakes.memory import HELP, SMI, exited, failed, host
from tests.fakes.recorded import recording

H200_UUID_0 = "GPU-a44622e3-2296-6285-0a86-84d0f6c67900"


def test_it_falls_back_to_the_seven_reference_fields_without_header_or_units():
    assert REFERENCE_QUERY_ARGV == [
        "nvidia-smi",
        "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,driver_version",
        "--format=csv,noheader,nounits",
    ]


def test_it_parses_8x_h200():
    driver, devices = parse_smi(recording("smi-8x-h200.csv"))
    assert driver == "570.195.03"
    assert [d.index for d in devices] == list(range(8))
    assert devices[0] == Device(0, H200_UUID_0, "NVIDIA H200", 143771, 130013, 100)
    assert devices[7].vram_used_mib == 58071
    assert devices[7].utilization_percent == 0


def test_it_parses_values_that_carry_units():
    driver, devices = parse_smi(recording("smi-8x-a40-with-units.csv"))
    assert driver == "550.127.05"
    assert len(devices) == 8
    assert {d.name for d in devices} == {"NVIDIA A40"}
    assert (devices[4].vram_total_mib, devices[4].vram_used_mib) == (46068, 41782)
    assert [d.utilization_percent for d in devices] == [
        76,
        77,
        81,
        84,
        100,
        100,
        95,
        94,
    ]


def test_it_parses_a_mixed_pair():
    driver, devices = parse_smi(recording("smi-2x-mixed.csv"))
    assert driver == "560.35.03"
    assert [d.name for d in devices] == [
        "NVIDIA GeForce RTX 4080 SUPER",
        "NVIDIA GeForce RTX 3090",
    ]
    assert [d.vram_total_mib for d in devices] == [16376, 24576]


def test_it_reads_placeholder_utilization_as_unknown():
    _, devices = parse_smi(recording("smi-2x-k80-util-placeholders.csv"))
    assert [d.utilization_percent for d in devices] == [None, None]
    assert [d.vram_used_mib for d in devices] == [0, 10]


def test_it_keeps_a_gpu_whose_memory_is_not_reported():
    driver, devices = parse_smi(recording("smi-1x-gh200-memory-na.csv"))
    assert driver == "570.124.06"
    assert devices == [
        Device(
            0,
            "GPU-6f2d3c4b-5a69-7e8f-9a0b-1c2d3e4f5a6b",
            "NVIDIA GH200 480GB",
            None,
            None,
            42,
        )
    ]


def test_it_skips_warnings_around_good_rows():
    driver, devices = parse_smi(recording("smi-2x-warnings-around-rows.txt"))
    assert driver == "560.35.03"
    assert [d.index for d in devices] == [0, 1]


def test_an_unreadable_health_value_is_unknown_and_costs_no_gpu():
    query = [*REFERENCE_FIELDS, HEALTH_FIELDS[0], HEALTH_FIELDS[10], HEALTH_FIELDS[1]]  # bus id, ECC mode, temperature
    row = "0, GPU-aaaa, NVIDIA H100, 81559, 10, 3, 550.90.07, 00000000:18:00.0, Pending, 41 C"
    _, [device] = parse_smi(row, query)
    assert (device.pci_bus_id, device.ecc_mode, device.temperature_c) == ("00000000:18:00.0", None, None)
    assert device.vram_total_mib == 81559
    # A reference field must still read, or the row is not a GPU's.
    with pytest.raises(SmiParseError, match="memory.total 'lots' is not a number"):
        parse_smi(row.replace("81559", "lots"), query)


def test_it_names_the_row_it_cannot_read():
    with pytest.raises(SmiParseError) as caught:
        parse_smi(recording("smi-garbage-row.csv"))
    assert caught.value.row == 2
    assert "row 2" in str(caught.value)
    assert "GeForce RTX 3090, lots" in str(caught.value)
    assert "memory.total" in str(caught.value)


ROW = "0, GPU-aaaa, NVIDIA A100-SXM4-80GB, 81920, 1024, 5, 550.54.15"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", []),
        ("\n  \n\n", []),
        ("No devices were found\n", []),
        (
            f"  {ROW}  \r\n\r\n",
            [Device(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920, 1024, 5)],
        ),
        (
            '0, GPU-aaaa, "Quadro RTX 6000, Rev B", 24576, 0, 0, 550.54.15',
            [Device(0, "GPU-aaaa", "Quadro RTX 6000, Rev B", 24576, 0, 0)],
        ),
        (
            "0,GPU-aaaa,Tesla T4,15360,0,N/A,550.54.15",
            [Device(0, "GPU-aaaa", "Tesla T4", 15360, 0, None)],
        ),
        (
            "0, GPU-aaaa, Tesla T4, [Unknown Error], 3, 0, 550.54.15",
            [Device(0, "GPU-aaaa", "Tesla T4", None, 3, 0)],
        ),
        (
            "index, uuid, name, memory.total, memory.used, utilization.gpu, driver_version\n"
            + ROW,
            [Device(0, "GPU-aaaa", "NVIDIA A100-SXM4-80GB", 81920, 1024, 5)],
        ),
    ],
)
def test_it_parses(text, expected):
    assert parse_smi(text)[1] == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        ("0, GPU-aaaa, Tesla T4, 15360, 0, 0", "expected 7 fields, got 6"),
        (
            "0, GPU-aaaa, Tesla T4, 15360, 0, 0, 550.54.15, extra",
            "expected 7 fields, got 8",
        ),
        ("x, GPU-aaaa, Tesla T4, 15360, 0, 0, 550.54.15", "index 'x' is not a number"),
        (
            "-1, GPU-aaaa, Tesla T4, 15360, 0, 0, 550.54.15",
            "index '-1' is not a number",
        ),
        ("0, , Tesla T4, 15360, 0, 0, 550.54.15", "empty UUID"),
        ("0, GPU-aaaa, Tesla T4, 15360 MB, 0, 0, 550.54.15", "memory.total '15360 MB'"),
        ("0, GPU-aaaa, Tesla T4, 15360, 1.5, 0, 550.54.15", "memory.used '1.5'"),
        (
            "0, GPU-aaaa, Tesla T4, 15360, 0, 12 MiB, 550.54.15",
            "utilization.gpu '12 MiB'",
        ),
        (
            f"{ROW}\n0, GPU-bbbb, Tesla T4, 15360, 0, 0, 550.54.15",
            "index 0 also on row 1",
        ),
        (f"{ROW}\n1, gpu-AAAA, Tesla T4, 15360, 0, 0, 550.54.15", "UUID also on row 1"),
        (f"{ROW}\n1, GPU-bbbb, Tesla T4, 15360, 0, 0, 535.1", "driver '535.1' differs"),
    ],
)
def test_it_refuses(text, problem):
    with pytest.raises(SmiParseError) as caught:
        parse_smi(text)
    assert problem in str(caught.value)
    assert isinstance(caught.value, ValueError)


def _info(**overrides) -> Info:
    fields = {
        "present": True,
        "driver_version": "570.195.03",
        "devices": (
            Device(0, "GPU-a", "A", 1000, 10, 0),
            Device(1, "GPU-b", "B", None, None, None),
        ),
        "runtime_installed": True,
    }
    return Info(**{**fields, **overrides})


@pytest.mark.parametrize(
    "present, runtime, cdi, usable, hint",
    [
        (True, True, (), True, ""),
        (
            True,
            False,
            ("nvidia.com/gpu=0",),
            True,
            "",
        ),  # CDI counts: deliberate improvement
        (True, True, ("nvidia.com/gpu=0",), True, ""),
        (True, False, (), False, INSTALL_HINT),
        (False, True, (), False, ""),
        (False, False, (), False, ""),
    ],
)
def test_it_tells_usable_and_hint(present, runtime, cdi, usable, hint):
    info = _info(present=present, runtime_installed=runtime, cdi_devices=cdi)
    assert info.usable is usable
    assert info.hint == hint


def test_it_detects_gpus_and_the_runtime():
    runner = host(smi=recording("smi-8x-h200.csv"))
    docker = DockerInfo(runtimes=("io.containerd.runc.v2", "NVIDIA", "runc"))
    info = detect(runner, docker)
    assert info.present
    assert info.no_gpu_reason == ""
    assert info.driver_version == "570.195.03"
    assert info.count == 8
    assert info.runtime_installed
    # The driver lists only the reference fields: it is asked for those alone, once.
    assert runner.calls[0] == (HELP, 10.0) and runner.calls[1] == (tuple(REFERENCE_QUERY_ARGV), 10.0)


@pytest.mark.parametrize(
    "runtimes, installed",
    [
        (("nvidia",), True),
        (("runc", "Nvidia"), True),
        (("runc",), False),
        (("nvidia-cdi", "nvidia-legacy"), False),
        ((), False),
    ],
)
def test_it_compares_runtime_names_case_insensitively(runtimes, installed):
    info = detect(host(smi=recording("smi-2x-mixed.csv")), DockerInfo(runtimes=runtimes))
    assert info.runtime_installed is installed


def test_it_keeps_only_nvidia_gpu_cdi_devices():
    docker = DockerInfo(
        cdi_devices=(
            "nvidia.com/gpu=0",
            "vendor.com/net=eth1",
            "nvidia.com/gpu=all",
            "nvidia.com/gds=all",
        )
    )
    info = detect(host(smi=recording("smi-2x-mixed.csv")), docker)
    assert info.cdi_devices == ("nvidia.com/gpu=0", "nvidia.com/gpu=all")
    assert info.usable


@pytest.mark.parametrize(
    "smi, reason",
    [
        (None, "nvidia-smi not found on PATH"),
        (
            failed(SMI, "nvidia-smi timed out after 10 s"),
            "nvidia-smi timed out after 10 s",
        ),
        (failed(SMI, "permission denied"), "nvidia-smi: permission denied"),
        (
            exited(SMI, 9, stdout=recording("smi-error-exit9.txt")),
            (
                "nvidia-smi exited with code 9: NVIDIA-SMI has failed because it couldn't communicate"
                " with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
            ),
        ),
        (
            exited(SMI, 18, stderr=recording("smi-error-exit18.txt")),
            "nvidia-smi exited with code 18: Failed to initialize NVML: Driver/library version mismatch",
        ),
        (
            exited(
                SMI,
                18,
                stdout=recording("smi-error-exit18.txt"),
                stderr=recording("smi-error-exit18.txt"),
            ),
            "nvidia-smi exited with code 18: Failed to initialize NVML: Driver/library version mismatch",
        ),
        (exited(SMI, 255), "nvidia-smi exited with code 255"),
        ("", "nvidia-smi listed no GPUs"),
        ("No devices were found\n", "nvidia-smi listed no GPUs: No devices were found"),
        (
            recording("smi-garbage-row.csv"),
            "nvidia-smi output could not be read: row 2: memory.total 'lots' is not a number",
        ),
    ],
)
def test_it_reports_no_gpu_with_the_reason(smi, reason):
    info = detect(
        host(smi=smi),
        DockerInfo(runtimes=("nvidia",), cdi_devices=("nvidia.com/gpu=0",)),
    )
    assert not info.present
    assert info.devices == ()
    assert info.count == 0
    assert info.no_gpu_reason.startswith(reason)
    assert not info.usable
    assert info.hint == ""
    # Docker's facts are still recorded for the report.
    assert info.runtime_installed
    assert info.cdi_devices == ("nvidia.com/gpu=0",)


def test_it_clips_a_huge_error_text():
    info = detect(host(smi=exited(SMI, 9, stdout="x" * 5000)), DockerInfo())
    assert len(info.no_gpu_reason) == 500
    assert info.no_gpu_reason.endswith("…")


FULL = {
    "index": 1, "uuid": "GPU-1", "name": "NVIDIA H200", "vram_total_mib": 143771, "vram_used_mib": 512,
    "utilization_percent": 7, "pci_bus_id": "00000000:9B:00.0", "temperature_c": 40, "power_draw_w": 80.5,
    "throttle_reasons": ["sw_power_cap"], "mig_mode": True,
    "mig_devices": [{"uuid": "MIG-1", "profile": "3g.40gb", "device": 0}],
    "xid_errors": [{"xid": 79, "count": 1, "last_seen": None, "description": "fell off the bus"}],
    "processes": [{"pid": 7, "name": "python3", "used_mib": 500,
                   "container": {"id": "4f1d", "name": "trainer", "image": "pytorch", "claim": "job"}}],
    "attached_idle": [{"id": "9e8d", "name": "idle", "image": "cuda", "claim": None}],
}


def test_from_dict_makes_the_device_its_constructor_makes():
    """from_dict makes the same Device (equal, same hash and repr, frozen), with the
    defaults where a key is missing."""
    made = Device(
        index=1, uuid="GPU-1", name="NVIDIA H200", vram_total_mib=143771, vram_used_mib=512, utilization_percent=7,
        pci_bus_id="00000000:9B:00.0", temperature_c=40, power_draw_w=80.5, throttle_reasons=("sw_power_cap",),
        mig_mode=True, mig_devices=(MigDevice("MIG-1", "3g.40gb", 0),),
        xid_errors=(XidCount(79, 1, None, "fell off the bus"),),
        processes=(GpuProcess("GPU-1", 7, "python3", 500, Container("4f1d", "trainer", "pytorch", "job")),),
        attached_idle=(Container("9e8d", "idle", "cuda", None),),
    )
    device = Device.from_dict(FULL)
    assert device == made and hash(device) == hash(made) and repr(device) == repr(made)
    assert device.ecc_mode is None
    assert Device.from_dict(made.to_dict()) == made
    with pytest.raises(AttributeError):
        device.index = 2


def test_from_dict_leaves_what_an_older_agent_did_not_send_unknown():
    reference = {k: FULL[k] for k in ("index", "uuid", "name", "vram_total_mib", "vram_used_mib", "utilization_percent")}
    assert Device.from_dict(reference) == Device(**reference)


def test_what_nvidia_smi_is_asked_for_is_the_device_s_fields():
    """Each field of the query lands in a Device field of the same key, but the clock-event
    reasons (together throttle_reasons) and the driver version (the host's); the Device's
    other fields are its lists, which other commands fill."""
    asked = {f.key for f in ALL_FIELDS} - set(THROTTLE_REASONS) - {"driver_version"}
    assert asked == set(DEVICE_FIELDS) - set(NESTED_DEVICE_FIELDS) - {"throttle_reasons"}


def test_from_dict_refuses_a_key_that_is_no_field_rather_than_drop_it():
    with pytest.raises(ValueError, match="not fields of a GPU: made_up, memory_temp"):
        Device.from_dict({**FULL, "made_up": 1, "memory_temp": 40})


def test_from_dict_refuses_a_device_without_its_identity():
    with pytest.raises(TypeError, match="index, uuid"):
        Device.from_dict({"name": "NVIDIA H200", "vram_total_mib": 1, "vram_used_mib": 0, "utilization_percent": 0})
