"""Hostile and oversized snapshots: rejected alone with a bounded reason, never
stored half, never able to make a page fail; the agent cuts real oversized
output to the schema instead of sending what the site would reject."""

from __future__ import annotations

import copy
import json

import pytest
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet import gpu, wire
from gpufleet.claims.services import save_claim
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.ingest.schema import parse_snapshot
from gpufleet.ingest.services import ACCEPTED, REJECTED, ingest_snapshot
from gpufleet.wire import CDI_DEVICES_MAX, LINE_MAX, SnapshotError, encode_snapshot, fit_snapshot
from tests.factories import gpu_uuid, later, snapshot
from tests.fleet.test_node_page import NODE_PAGE_QUERIES

pytestmark = pytest.mark.django_db


def _rejected(snap: dict | str) -> str:
    result = ingest_snapshot(snap)
    assert result.outcome == REJECTED, result
    return result.reason


@pytest.mark.parametrize(
    "mutate,words",
    [
        (lambda d: d.update(collected_at="0001-01-01T00:00:00+14:00"), "collected_at"),
        (lambda d: d.update(collected_at="1970-01-01T00:00:00+00:00"), "before 2000"),
        (lambda d: d["findings"][0].update(message="bad\x00byte"), "findings.0.message"),
        (lambda d: d["devices"][0].update(name="NVIDIA\x1b[31m H200"), "devices.0.name"),
        (lambda d: d["devices"][0].update(vram_total_mib=2**64), "devices.0.vram_total_mib"),
        (lambda d: d["findings"][0].update(code="<script>"), "findings.0.code"),
        (lambda d: d.update(cdi_devices=["x"] * (CDI_DEVICES_MAX + 1)), "cdi_devices"),
    ],
)
def test_it_rejects_hostile_values_and_writes_nothing(mutate, words):
    snap = snapshot("alpha", 2)
    mutate(snap)
    assert words in _rejected(snap)
    assert not Node.objects.exists() and not Device.objects.exists()


@pytest.mark.parametrize(
    "text,words",
    [
        pytest.param('{"schema_version": 2, "node": "alpha", ', "snapshot is not JSON", id="cut-short"),
        pytest.param("[" * 100_000 + "]" * 100_000, "snapshot is not JSON", id="nested-past-the-stack"),
        pytest.param("[1, 2]", "snapshot must be a JSON object, not list", id="a-list"),
    ],
)
def test_snapshot_text_that_is_no_json_object_is_rejected_and_writes_nothing(text, words):
    assert words in _rejected(text)
    assert not Node.objects.exists()


def test_a_snapshot_as_text_is_checked_as_the_object_is():
    snap = snapshot("alpha", 2)
    snap["devices"][0]["vram_total_mib"] = 2**64
    assert "devices.0.vram_total_mib" in _rejected(encode_snapshot(snap))
    assert not Node.objects.exists()
    assert ingest_snapshot(encode_snapshot(snapshot("alpha", 2))).outcome == ACCEPTED


def test_a_known_node_whose_snapshot_is_rejected_fails_with_the_reason_until_a_good_one(viewer_client):
    good = snapshot("alpha", 2)
    ingest_snapshot(good)
    bad = snapshot("alpha", 2, at=later(good))
    bad["devices"][0]["vram_total_mib"] = 2**64
    _rejected(bad)
    node = Node.objects.get(name="alpha")
    finding = node.findings.get(code="rejected-snapshot")
    assert node.health == "fail" and "vram_total_mib" in finding.message
    page = viewer_client.get(reverse("fleet:node_detail", args=["alpha"]))
    assert page.status_code == 200 and b"Rejected snapshot" in page.content
    ingest_snapshot(snapshot("alpha", 2, at=later(bad)))
    assert not Finding.objects.filter(code="rejected-snapshot").exists()


def test_the_reason_of_a_rejection_is_bounded(caplog):
    snap = snapshot("alpha", 1)
    snap["findings"][0]["code"] = "x" * 100_000
    assert len(_rejected(snap)) <= 1000
    assert all(len(r.getMessage()) < 2000 for r in caplog.records)


def test_the_agent_cuts_oversized_output_to_the_schema_and_says_so():
    snap = snapshot("alpha", 2)
    snap["cdi_devices"] = [f"nvidia.com/gpu={i}:{j}" for i in range(8) for j in range(700)]
    snap["devices"][0]["name"] = "N" * 300
    snap["driver_version"] = "570." * 30
    snap["findings"][0]["message"] = "line one\r\nline\x00two"
    fitted = fit_snapshot(copy.deepcopy(snap))
    parse_snapshot(fitted)  # the site accepts what the agent now sends
    assert len(fitted["cdi_devices"]) == CDI_DEVICES_MAX
    assert len(fitted["devices"][0]["name"]) == LINE_MAX
    assert len(fitted["driver_version"]) == wire.DRIVER_VERSION_MAX
    assert "\x00" not in fitted["findings"][0]["message"]
    clipped = fitted["findings"][-1]
    assert clipped["code"] == "snapshot-clipped" and "5600 CDI devices, kept 4096" in clipped["message"]


def test_a_real_large_mig_host_fits_without_cuts():
    snap = snapshot("alpha", 8)
    snap["cdi_devices"] = [f"nvidia.com/gpu={i}:{j}" for i in range(8) for j in range(7)] + ["nvidia.com/gpu=all"]
    snap["devices"][0]["name"] = "NVIDIA " + "H" * 187  # 194 characters
    fitted = fit_snapshot(copy.deepcopy(snap))
    assert not [f for f in fitted["findings"] if f["code"] == "snapshot-clipped"]
    assert ingest_snapshot(fitted).outcome == ACCEPTED


_HOSTILE = st.one_of(
    st.text(max_size=300),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(value, prefix=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:2]):
            yield (*prefix, index)
            yield from _paths(item, (*prefix, index))


_TEMPLATE = None


def _hostile_snapshot(data) -> dict:
    """A good snapshot with one value, anywhere in it, replaced by a hostile one."""
    global _TEMPLATE
    _TEMPLATE = _TEMPLATE or snapshot("alpha", 2)
    snap = copy.deepcopy(_TEMPLATE)
    path = data.draw(st.sampled_from(list(_paths(snap))))
    target = snap
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = data.draw(_HOSTILE)
    return snap


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_hostile_snapshot_raises_or_breaks_a_page(viewer_client, data):
    snap = _hostile_snapshot(data)
    result = ingest_snapshot(snap)  # never raises
    assert result.outcome in (ACCEPTED, REJECTED, "stale")
    for url in (reverse("fleet:overview"), reverse("fleet:node_detail", args=["alpha"])):
        response = viewer_client.get(url)
        assert response.status_code in (200, 404), (snap, response.status_code)


def _judged(snap):
    try:
        return parse_snapshot(snap)
    except SnapshotError as exc:
        return str(exc)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_snapshot_text_is_accepted_and_refused_as_its_object_is(data):
    # Text is validated by pydantic's JSON parser, an object by the decoded way: both
    # must take the same snapshots, and refuse the others for the same reason.
    snap = _hostile_snapshot(data)
    assert _judged(json.dumps(snap)) == _judged(snap)


# --- What one node may report in all ------------------------------------------


def _container(n: int) -> dict:
    return {"id": f"{n:064x}", "name": f"c{n}".ljust(LINE_MAX, "c"), "image": "i" * LINE_MAX, "claim": "k" * LINE_MAX}


# Each of a GPU's lists, as one item of it at the longest the schema takes.
_ITEM = {
    "mig_devices": lambda n: {"uuid": f"MIG-{n:08d}-".ljust(100, "m"), "profile": "p" * 32, "device": n % 7},
    "xid_errors": lambda n: {"xid": 79, "count": 2**62, "last_seen": "2026-01-01T00:00:00+00:00",
                             "description": "d" * LINE_MAX},
    "processes": lambda n: {"pid": n, "name": "n" * LINE_MAX, "used_mib": 2**52, "container": _container(n)},
    "attached_idle": _container,
    # Link numbers repeat from GPU to GPU, never within one (each GPU's start at a multiple of 32).
    "nvlink": lambda n: {"link": n % wire.NVLINKS_PER_GPU_MAX, "state": "down", "replay_errors": 2**62,
                         "recovery_errors": 2**62, "crc_errors": 2**62},
}


def _fill(snap: dict, key: str, total: int, start: int = 0) -> None:
    """`total` items of `key` from GPU `start` on, as many on each GPU as the schema takes."""
    per_gpu = next(limit for name, limit, _, _ in wire.DEVICE_LISTS if name == key)
    made = 0
    for device in snap["devices"][start:]:
        device[key] = [_ITEM[key](made + i) for i in range(min(per_gpu, total - made))]
        made += len(device[key])
    assert made == total, f"not enough GPUs to hold {total} {key}"


def _maximal_snapshot(node: str = "alpha", **at) -> dict:
    """The most one node may send: every per-node bound reached, every text at its longest."""
    snap = snapshot(node, wire.GPUS_PER_NODE_MAX, **at)
    for key, _, per_node, _ in wire.DEVICE_LISTS:
        _fill(snap, key, per_node)
    snap["cdi_spec_files"] = [f"/etc/cdi/{i}".ljust(wire.CDI_SPEC_PATH_MAX, "s") for i in range(wire.CDI_SPEC_FILES_MAX)]
    snap["cdi_devices"] = [f"nvidia.com/gpu={i}".ljust(LINE_MAX, "x") for i in range(CDI_DEVICES_MAX)]
    snap["findings"] += [
        {"code": f"extra{i}", "name": "N" * LINE_MAX, "status": "warn", "message": "m" * wire.TEXT_MAX,
         "fix": "f" * wire.TEXT_MAX}
        for i in range(wire.FINDINGS_MAX - len(snap["findings"]))
    ]
    return snap


def _one_more(key: str):
    """One more `key` on a GPU that holds fewer than it may: over the node's bound only."""
    def mutate(snap: dict) -> None:
        device = next(d for d in snap["devices"] if not d[key])
        device[key] = [_ITEM[key](10_000)]
    return mutate


def _one_more_gpu(snap: dict) -> None:
    extra = copy.deepcopy(snap["devices"][-1])
    extra.update(index=wire.GPUS_PER_NODE_MAX, uuid=gpu_uuid("alpha", wire.GPUS_PER_NODE_MAX), mig_devices=[],
                 xid_errors=[], processes=[], attached_idle=[])
    snap["devices"].append(extra)


def _one_more_finding(snap: dict) -> None:
    snap["findings"].append({"code": "one-more", "name": "n", "status": "ok", "message": "m"})


def test_the_most_one_node_may_send_is_stored():
    assert ingest_snapshot(_maximal_snapshot()).outcome == ACCEPTED
    node = Node.objects.get(name="alpha")
    devices = list(node.devices.all())
    assert len(devices) == wire.GPUS_PER_NODE_MAX
    assert sum(len(d.processes) for d in devices) == wire.PROCESSES_PER_NODE_MAX


@pytest.mark.parametrize(
    "mutate,words",
    [
        pytest.param(_one_more_gpu, f"at most {wire.GPUS_PER_NODE_MAX} items", id="gpus"),
        pytest.param(_one_more("mig_devices"), f"{wire.MIG_SLICES_PER_NODE_MAX + 1} MIG slices", id="mig-slices"),
        pytest.param(_one_more("processes"), f"{wire.PROCESSES_PER_NODE_MAX + 1} processes", id="processes"),
        pytest.param(_one_more("attached_idle"), f"{wire.CONTAINERS_PER_NODE_MAX + 1} idle containers",
                     id="containers"),
        pytest.param(_one_more("xid_errors"), f"{wire.XIDS_PER_NODE_MAX + 1} Xid codes", id="xids"),
        pytest.param(_one_more_finding, f"at most {wire.FINDINGS_MAX} items", id="findings"),
    ],
)
def test_a_snapshot_one_over_a_bound_of_the_node_is_refused_and_writes_nothing(mutate, words, caplog):
    snap = _maximal_snapshot()
    mutate(snap)
    reason = _rejected(snap)
    assert words in reason
    assert words in caplog.text  # the log says which bound
    assert not Node.objects.exists() and not Device.objects.exists() and not DeviceSample.objects.exists()


@pytest.mark.parametrize(
    "key,per_gpu",
    [("mig_devices", wire.MIG_SLICES_PER_GPU_MAX), ("processes", wire.PROCESSES_PER_GPU_MAX),
     ("attached_idle", wire.CONTAINERS_PER_GPU_MAX), ("xid_errors", wire.XIDS_PER_GPU_MAX)],
)
def test_a_gpu_over_its_own_bound_is_refused(key, per_gpu):
    snap = snapshot("alpha", 2)
    snap["devices"][0][key] = [_ITEM[key](n) for n in range(per_gpu + 1)]
    assert f"devices.0.{key}" in _rejected(snap)
    assert not Node.objects.exists()


@pytest.mark.parametrize("key", [key for key, *_ in wire.DEVICE_LISTS])
def test_the_agent_cuts_a_node_to_its_bounds_and_says_so(key):
    snap = _maximal_snapshot()
    _one_more(key)(snap)
    snap["findings"] = snap["findings"][:10]
    fitted = fit_snapshot(copy.deepcopy(snap))
    parse_snapshot(fitted)  # the site takes what the agent now sends
    clipped = fitted["findings"][-1]
    assert clipped["code"] == "snapshot-clipped" and "on the node, kept" in clipped["message"]


def test_the_agent_cuts_the_gpus_of_a_node_to_the_bound():
    snap = snapshot("alpha", wire.GPUS_PER_NODE_MAX + 3)
    fitted = fit_snapshot(copy.deepcopy(snap))
    parse_snapshot(fitted)
    assert len(fitted["devices"]) == wire.GPUS_PER_NODE_MAX
    assert f"{wire.GPUS_PER_NODE_MAX + 3} GPUs, kept {wire.GPUS_PER_NODE_MAX}" in fitted["findings"][-1]["message"]


# Far under the 38 MB one node's page once was; the most it can hold now is findings
# at their longest text.
NODE_PAGE_MAX_BYTES = 3_500_000


def test_the_page_of_the_most_one_node_may_send_is_bounded(admin_role_client, django_assert_num_queries):
    assert ingest_snapshot(_maximal_snapshot()).outcome == ACCEPTED
    with django_assert_num_queries(NODE_PAGE_QUERIES):
        response = admin_role_client.get(reverse("fleet:node_detail", args=["alpha"]))
    assert response.status_code == 200
    assert len(response.content) < NODE_PAGE_MAX_BYTES, len(response.content)


def test_the_node_page_folds_long_lists_of_a_gpu_behind_a_count(viewer_client):
    snap = snapshot("alpha", 2)
    _fill(snap, "processes", 20)
    _fill(snap, "attached_idle", 9, start=1)
    snap["cdi_spec_files"] = [f"/etc/cdi/spec-{i}.yaml" for i in range(30)]
    ingest_snapshot(snap)
    page = viewer_client.get(reverse("fleet:node_detail", args=["alpha"])).content.decode()
    assert page.count("<details class=\"procs-more\">") == 2
    assert "12 more processes" in page and "1 more idle container" in page
    assert "/etc/cdi/spec-7.yaml" in page and "/etc/cdi/spec-8.yaml" not in page and "22 more" in page


# --- UUIDs --------------------------------------------------------------------


@pytest.mark.parametrize(
    "reuse",
    [
        pytest.param(lambda uuid: uuid, id="same"),
        pytest.param(lambda uuid: f"  {uuid.lower()} ", id="other-case-and-spaces"),
    ],
)
def test_a_mig_slice_with_another_gpus_uuid_is_refused_and_the_claim_keeps_its_gpu(reuse, operator):
    first = snapshot("alpha", 2)
    assert ingest_snapshot(first).outcome == ACCEPTED
    node = Node.objects.get(name="alpha")
    second_gpu = gpu_uuid("alpha", 1)
    save_claim(node, gpu.Claim(name="train", count=0, device_ids=(second_gpu,)), operator)
    stored = list(Device.objects.order_by("pk").values())

    bad = snapshot("alpha", 2, at=later(first))
    bad["devices"][0]["mig_mode"] = True
    bad["devices"][0]["mig_devices"] = [{"uuid": reuse(second_gpu), "profile": "7g.80gb", "device": 0}]
    assert "appears twice" in _rejected(bad)

    assert list(Device.objects.order_by("pk").values()) == stored
    ledger = Node.objects.get(name="alpha").ledger()
    assert ledger.holder_of(1) == "train" and ledger.holder_of(0) is None


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda d: d[1].update(uuid=d[0]["uuid"].upper() + " "), id="two-gpus"),
        pytest.param(lambda d: [g.update(mig_devices=[{"uuid": "MIG-1", "profile": "1g", "device": 0}]) for g in d],
                     id="two-slices"),
    ],
)
def test_gpu_and_mig_uuids_must_all_differ(mutate):
    snap = snapshot("alpha", 2)
    mutate(snap["devices"])
    assert "appears twice" in _rejected(snap)
    assert not Node.objects.exists()
