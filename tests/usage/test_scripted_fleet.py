"""Usage accounting end to end (issue #31): a scripted fleet of three nodes over three
simulated days, through the real ingest and the real beat, the clock moved with
time-machine. Claims are made and deleted, containers start and stop, GPUs are idle
and busy, with power known and unknown, one node is offline for an hour, and two
users are deleted; claims belong to teams, and one is moved to another team. Every grouping of the report must give the GPU-hours, kWh and cost
the script implies, worked out here from the script's own times (EXPECTED), not by
the code under test.

Tolerance: a snapshot counts the state it sees for the interval before it, so each
change (a claim made, a container started, the node back online) shows up to one
collect interval early or late. A figure may be off by one interval for every change
inside the period on the GPUs it counts, and no more."""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.teams.models import Team
from gpufleet.usage import report, rollup, tasks
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.claims.helpers import save_owned
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

INTERVAL = 900  # seconds between a node's snapshots: coarse, so three days stay quick
START = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday, midnight
DAYS = 3
END = START + timedelta(days=DAYS)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
PRICES = {H100: 3.0, "*": 1.5}  # per GPU-hour held
KWH_PRICE = 0.2


def at(day: int, hour: int, minute: int) -> datetime:
    """A moment of the script; changes fall between snapshots (off the five-minute grid)."""
    return START + timedelta(days=day, hours=hour, minutes=minute)


# --- The script -------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    name: str
    image: str
    label: str | None = None

    def wire(self) -> dict:
        return {"id": self.name.encode().hex()[:64], "name": self.name, "image": self.image, "claim": self.label}


TRAIN = Box("trainer", "pytorch/pytorch:2.5.1", "train")
EVAL = Box("evaluator", "vllm/vllm-openai:0.6", "eval")
NOTEBOOK = Box("notebook", "jupyter/base:4")
JAX = Box("jax", "jax:0.4")
FFMPEG = Box("encode", "ffmpeg:7")
TF = Box("batch-job", "tensorflow:2.16", "batch")

# name: (GPU model, GPU count, watts busy, watts idle; None: no power reading)
NODES = {
    "gpu-a": (H100, 4, 400.0, 60.0),
    "gpu-b": (A100, 2, None, None),
    "gpu-c": (H100, 2, 300.0, 50.0),
}
# What runs where: (node, GPUs, from, until, how, container). "process": a compute
# process (in the container, or outside any with None); "attached": the container
# holds the GPU and runs nothing there; "util": utilization and no process found.
WORK = [
    ("gpu-a", (0, 1), at(0, 3, 22), at(1, 3, 22), "process", TRAIN),
    ("gpu-a", (0, 1), at(1, 3, 22), at(1, 9, 47), "attached", TRAIN),
    ("gpu-a", (3,), at(0, 9, 3), at(1, 12, 3), "process", EVAL),
    ("gpu-a", (2,), at(2, 1, 13), at(2, 7, 43), "process", None),
    ("gpu-a", (3,), at(2, 10, 2), at(2, 14, 2), "attached", NOTEBOOK),
    ("gpu-b", (0,), at(0, 5, 8), at(0, 17, 8), "process", JAX),
    ("gpu-b", (1,), at(1, 0, 4), at(1, 12, 4), "util", None),
    ("gpu-b", (1,), at(1, 16, 10), at(1, 22, 40), "process", FFMPEG),
    ("gpu-c", (0, 1), at(0, 13, 1), at(2, 9, 1), "process", TF),
]
NO_POWER_READING = [("gpu-a", 3, at(0, 20, 2), at(1, 2, 2))]
OFFLINE = {"gpu-c": (at(1, 10, 32), at(1, 11, 32))}
# The team each claim is made for; scratch is in none.
TEAM_OF = {"train": "vision", "eval": "vision", "batch": "nlp"}
# (when, what, node, claim, user or team)
EVENTS = [
    (at(0, 0, 2), "claim", "gpu-b", gpu.Claim("scratch", device_ids=("0",)), "dave"),
    (at(0, 2, 12), "claim", "gpu-a", gpu.Claim("train", device_ids=("0", "1")), "alice"),
    (at(0, 8, 43), "claim", "gpu-a", gpu.Claim("eval", count=1), "bob"),
    (at(0, 12, 3), "claim", "gpu-c", gpu.Claim("batch"), "carol"),  # every GPU
    (at(1, 15, 33), "delete user", None, None, "dave"),  # while his claim still holds its GPU
    (at(1, 18, 22), "move claim", "gpu-a", "train", "nlp"),  # its hours before stay vision's
    (at(1, 20, 7), "delete claim", "gpu-a", "eval", None),
    (at(2, 2, 13), "delete user", None, None, "bob"),  # after his claim is gone
    (at(2, 12, 3), "delete claim", "gpu-c", "batch", None),
    (at(2, 18, 17), "delete claim", "gpu-b", "scratch", None),
]


# --- What the script implies -------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """GPUs of one node in one state from `start` until before `end`, as the script
    says: held by `claim` (owned by `owner`) or none, busy or not, under `image` and
    `label`, drawing `watts` each (None: no reading), or `unknown` (node offline)."""

    node: str
    gpus: int
    start: datetime
    end: datetime
    claim: str | None = None
    owner: str = ""
    team: str = ""
    image: str = ""
    label: str = ""
    busy: bool = False
    unknown: bool = False
    watts: float | None = "node"  # type: ignore[assignment]  # "node": the node's busy or idle draw

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600 * self.gpus

    @property
    def model(self) -> str:
        return NODES[self.node][0]

    @property
    def draw(self) -> float | None:
        if self.watts != "node":
            return self.watts
        return NODES[self.node][2 if self.busy else 3]

    @property
    def changes(self) -> int:
        """GPU-changes at its ends inside the period: each may move by an interval."""
        return self.gpus * sum(START < moment < END for moment in (self.start, self.end))


def spans(node, gpus, *cuts) -> list[Span]:
    """Consecutive spans of the same GPUs: cuts are (until, {state}) in order."""
    found, start = [], START
    for end, state in cuts:
        found.append(Span(node, gpus, start, end, **state))
        start = end
    return found


UNRESERVED: dict = {}
TRAIN_IDLE = {"claim": "train", "owner": "alice", "team": "vision"}
EVAL_IDLE = {"claim": "eval", "owner": "bob", "team": "vision"}
BATCH_IDLE = {"claim": "batch", "owner": "carol", "team": "nlp"}
BATCH_BUSY = {**BATCH_IDLE, "image": TF.image, "label": "batch", "busy": True}
EVAL_BUSY = {**EVAL_IDLE, "image": EVAL.image, "label": "eval", "busy": True}
SCRATCH = {"claim": "scratch", "owner": "dave"}

EXPECTED = [
    # gpu-a GPUs 0 and 1: "train" pinned; its container works a day, then sits attached.
    *spans("gpu-a", 2,
           (at(0, 2, 12), UNRESERVED),
           (at(0, 3, 22), TRAIN_IDLE),
           (at(1, 3, 22), {**TRAIN_IDLE, "image": TRAIN.image, "label": "train", "busy": True}),
           (at(1, 9, 47), {**TRAIN_IDLE, "image": TRAIN.image, "label": "train"}),
           (at(1, 18, 22), TRAIN_IDLE),
           (END, {**TRAIN_IDLE, "team": "nlp"})),
    # gpu-a GPU 2: "eval" (a count of one) is counted here while its own GPU is idle;
    # later a process outside any container, no claim.
    *spans("gpu-a", 1,
           (at(0, 8, 43), UNRESERVED),
           (at(0, 9, 3), EVAL_IDLE),
           (at(1, 12, 3), UNRESERVED),
           (at(1, 20, 7), EVAL_IDLE),
           (at(2, 1, 13), UNRESERVED),
           (at(2, 7, 43), {"busy": True}),
           (END, UNRESERVED)),
    # gpu-a GPU 3: "eval"'s labelled container works here (six hours of it with no
    # power reading); later a notebook sits attached to it, no claim.
    *spans("gpu-a", 1,
           (at(0, 9, 3), UNRESERVED),
           (at(0, 20, 2), EVAL_BUSY),
           (at(1, 2, 2), {**EVAL_BUSY, "watts": None}),
           (at(1, 12, 3), EVAL_BUSY),
           (at(2, 10, 2), UNRESERVED),
           (at(2, 14, 2), {"image": NOTEBOOK.image}),
           (END, UNRESERVED)),
    # gpu-b GPU 0: "scratch", owned by dave until his account is deleted, by nobody after.
    *spans("gpu-b", 1,
           (at(0, 0, 2), UNRESERVED),
           (at(0, 5, 8), SCRATCH),
           (at(0, 17, 8), {**SCRATCH, "image": JAX.image, "busy": True}),
           (at(1, 15, 33), SCRATCH),
           (at(2, 18, 17), {**SCRATCH, "owner": ""}),
           (END, UNRESERVED)),
    # gpu-b GPU 1: no claim; busy by utilization alone, later an encoder's container.
    *spans("gpu-b", 1,
           (at(1, 0, 4), UNRESERVED),
           (at(1, 12, 4), {"busy": True}),
           (at(1, 16, 10), UNRESERVED),
           (at(1, 22, 40), {"image": FFMPEG.image, "busy": True}),
           (END, UNRESERVED)),
    # gpu-c: "batch" takes every GPU; the node is offline for an hour while it works.
    *spans("gpu-c", 2,
           (at(0, 12, 3), UNRESERVED),
           (at(0, 13, 1), BATCH_IDLE),
           (at(1, 10, 32), BATCH_BUSY),
           (at(1, 11, 32), {"unknown": True}),
           (at(2, 9, 1), BATCH_BUSY),
           (at(2, 12, 3), BATCH_IDLE),
           (END, UNRESERVED)),
]

FIGURES = ("reserved", "used", "idle_reserved", "used_unreserved", "unknown", "power_unknown", "energy_kwh", "cost")


def figures(found: list[Span]) -> dict[str, float | None]:
    """A group's figures from its spans, and their tolerance in GPU-hours."""
    seen = [s for s in found if not s.unknown]
    energy = sum(s.hours * s.draw / 1000 for s in seen if s.draw is not None)
    priced = sum(s.hours * PRICES.get(s.model, PRICES["*"]) for s in seen if s.claim or s.busy)
    return {
        "reserved": sum(s.hours for s in seen if s.claim),
        "used": sum(s.hours for s in seen if s.busy),
        "idle_reserved": sum(s.hours for s in seen if s.claim and not s.busy),
        "used_unreserved": sum(s.hours for s in seen if not s.claim and s.busy),
        "unknown": sum(s.hours for s in found if s.unknown),
        "power_unknown": sum(s.hours for s in seen if s.draw is None),
        "energy_kwh": energy if any(s.draw is not None for s in seen) else None,
        "cost": priced + energy * KWH_PRICE,
        "tolerance": sum(s.changes for s in found) * INTERVAL / 3600,
    }


GROUP_OF = {
    "owner": lambda s: (s.owner,),
    "team": lambda s: (s.team,),
    "claim": lambda s: (s.claim or "", s.node, s.owner),
    "image": lambda s: (s.image,),
    "label": lambda s: (s.label,),
    "node": lambda s: (s.node,),
    "model": lambda s: (s.model,),
}
KEY_OF = {
    "owner": lambda k: (k["owner"],),
    "team": lambda k: (k["team"],),
    "claim": lambda k: (k["claim"], k["node"], k["owner"]),
    "image": lambda k: (k["image"],),
    "label": lambda k: (k["label"],),
    "node": lambda k: (k["node"],),
    "model": lambda k: (k["model"],),
}


def expected(by: str) -> dict[tuple, dict]:
    groups: dict[tuple, list[Span]] = defaultdict(list)
    for span in EXPECTED:
        groups[GROUP_OF[by](span)].append(span)
    return {key: figures(found) for key, found in groups.items()}


def test_the_script_covers_every_gpu_of_every_node_for_the_whole_period():
    for node, (_, count, _, _) in NODES.items():
        hours = sum(s.hours for s in EXPECTED if s.node == node)
        assert hours == pytest.approx(count * 24 * DAYS), node


# --- Running it -------------------------------------------------------------------------


def _device(node: str, index: int, moment: datetime, device: dict) -> None:
    _, _, busy_w, idle_w = NODES[node]
    processes, attached, util_only = [], [], False
    for where, gpus, start, end, how, box in WORK:
        if where != node or index not in gpus or not start <= moment < end:
            continue
        if how == "process":
            processes.append({"pid": 1000 + index, "name": "python3", "used_mib": 20480,
                              "container": box.wire() if box else None})
        elif how == "attached":
            attached.append(box.wire())
        else:
            util_only = True
    busy = bool(processes) or util_only
    device["utilization_percent"] = 90 if busy else 0
    device["processes"], device["attached_idle"] = processes, attached
    device["power_draw_w"] = busy_w if busy else idle_w
    for where, gpu_index, start, end in NO_POWER_READING:
        if where == node and gpu_index == index and start <= moment < end:
            device["power_draw_w"] = None


def _snapshot(node: str, moment: datetime, templates: dict) -> dict:
    snap = copy.deepcopy(templates[node])
    snap["collected_at"] = moment.isoformat()
    for device in snap["devices"]:
        _device(node, device["index"], moment, device)
    return snap


def _apply(what: str, node: str | None, claim, user: str) -> None:
    users = get_user_model().objects
    if what == "claim":
        owner = users.get(username=user)
        saved = save_owned(Node.objects.get(name=node), claim, owner)
        # The script's teams, or none: a claim of no team is counted as one.
        team = Team.objects.get_or_create(name=TEAM_OF[claim.name])[0] if claim.name in TEAM_OF else None
        Claim.objects.filter(pk=saved.pk).update(team=team)
    elif what == "move claim":
        Claim.objects.filter(node__name=node, name=claim).update(team=Team.objects.get_or_create(name=user)[0])
    elif what == "delete claim":
        claims.delete_claim(Claim.objects.get(node__name=node, name=claim), None)
    else:
        users.get(username=user).delete()


def _run(settings, clock) -> None:
    """Runs the script: every node's snapshot each interval (none while offline),
    the claims and users changed between snapshots, and the central beat's usage
    jobs (roll, prune) as it runs them."""
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL
    settings.GPUFLEET_IDLE_UTIL_PERCENT = 5.0
    settings.GPUFLEET_USAGE_5M_HOURS = 24.0
    settings.GPUFLEET_PRICE_GPU_HOUR = PRICES
    settings.GPUFLEET_PRICE_KWH = KWH_PRICE
    for name in ("alice", "bob", "carol", "dave"):
        get_user_model().objects.create_user(name)
    templates = {name: snapshot(name, count, at=START, name=model) for name, (model, count, _, _) in NODES.items()}
    events = sorted(EVENTS, key=lambda event: event[0])
    moment = START
    while moment < END:
        while events and events[0][0] < moment:
            clock.move_to(events[0][0])
            _apply(*events.pop(0)[1:])
        clock.move_to(moment)
        online = [n for n in NODES if not (n in OFFLINE and OFFLINE[n][0] <= moment < OFFLINE[n][1])]
        results = ingest_snapshots([_snapshot(n, moment, templates) for n in online])
        assert [r.outcome for r in results] == ["accepted"] * len(online), results
        tasks.roll_usage()  # the beat rolls every five minutes: each snapshot's moment will do
        if moment.minute == 0:
            tasks.prune_usage()  # hourly
        moment += timedelta(seconds=INTERVAL)
    assert not events


def _check(found: report.Report, wanted: dict[tuple, dict], by: str) -> None:
    got = {KEY_OF[by](row.key): row for row in found.rows}
    assert sorted(got) == sorted(wanted), by
    for key, want in wanted.items():
        for name in FIGURES:
            _close(getattr(got[key], name), want, name, (by, key))


def _close(value, want: dict, name: str, where) -> None:
    """`value` is the figure `name` of `want` within its tolerance."""
    target = want[name]
    if target is None:
        assert value is None, (where, name, value)
        return
    # kWh and cost scale an hour's error by the most a GPU-hour can draw or cost.
    scale = {"energy_kwh": 0.4, "cost": max(PRICES.values()) + 0.4 * KWH_PRICE}.get(name, 1.0)
    tolerance = want["tolerance"] * scale + 1e-6
    assert value == pytest.approx(target, abs=tolerance), (where, name, value, target, tolerance)


def _check_all(end: datetime) -> None:
    for by in report.GROUPS:
        found = report.report(START, end, by)
        _check(found, expected(by), by)
        whole = figures(EXPECTED)
        for name in FIGURES:
            _close(getattr(found.total, name), whole, name, (by, "total"))
            if name not in ("energy_kwh", "cost"):  # every grouping adds up to the total
                assert sum(getattr(r, name) for r in found.rows) == pytest.approx(getattr(found.total, name)), (by, name)


def test_a_scripted_fleet_over_three_days_gives_every_grouping_s_hours_and_energy(settings):
    with time_machine.travel(START, tick=False) as clock:
        _run(settings, clock)
        # The last hour is not rolled yet: the report reads it from the five-minute rows.
        assert rollup.rolled_until() == END - timedelta(hours=1)
        _check_all(END)
        # Five-minute rows older than a day are gone: the first two days come from hourly rows.
        assert not UsageFiveMinutes.objects.filter(bucket__lt=END - timedelta(hours=26)).exists()
        # The beat rolls the last hour; the report says the same from hourly rows alone.
        clock.move_to(END + timedelta(minutes=5))
        tasks.roll_usage()
        assert rollup.rolled_until() == END
        _check_all(END)
    _offline_hour_is_unknown()
    _deleted_claims_and_users_keep_their_hours()
    _idle_reserved_and_used_unreserved_by_image()


def _offline_hour_is_unknown() -> None:
    """Offline time counts as unknown, never as idle or used."""
    found = {row.key["node"]: row for row in report.report(START, END, "node").rows}
    gpu_c = found["gpu-c"]
    two_changes = 2 * 2 * INTERVAL / 3600  # going offline and back, on two GPUs
    assert gpu_c.unknown == pytest.approx(2.0, abs=two_changes)  # an hour, two GPUs
    assert found["gpu-a"].unknown == found["gpu-b"].unknown == 0
    # What the node's snapshots covered and the unknown hours make up its GPU time: an
    # hour short of it by no more than an interval a GPU is not called unknown (jitter).
    rows = UsageHour.objects.filter(node="gpu-c")
    seen = sum(row.seen_s for row in rows) / 3600
    assert 2 * 24 * DAYS - two_changes <= seen + gpu_c.unknown <= 2 * 24 * DAYS + 1e-6
    # The unknown hours are rows of the hours the node was silent, held by no claim.
    unknown = rows.filter(unknown_s__gt=0).order_by("bucket")
    assert {row.bucket for row in unknown} <= {at(1, 10, 0), at(1, 11, 0)} and unknown
    assert all(row.claim_id is None and row.seen_s == row.used_s == 0 for row in unknown)


def _deleted_claims_and_users_keep_their_hours() -> None:
    assert not Claim.objects.filter(name__in=["eval", "batch", "scratch"]).exists()
    assert not get_user_model().objects.filter(username__in=["bob", "dave"]).exists()
    by_claim = {(row.key["claim"], row.key["owner"]): row for row in report.report(START, END, "claim").rows}
    one_change = 2 * INTERVAL / 3600
    assert by_claim["eval", "bob"].reserved == pytest.approx(35 + 24 / 60, abs=one_change)  # 08:43 to 20:07 a day later
    assert by_claim["eval", "bob"].used == pytest.approx(27.0, abs=one_change)
    assert by_claim["batch", "carol"].reserved == pytest.approx(2 * (48 - 1), abs=2 * one_change)  # but offline
    # The claim outlived its owner's account: the hours before stay his, those after are nobody's.
    assert by_claim["scratch", "dave"].reserved == pytest.approx(39 + 31 / 60, abs=one_change)
    assert by_claim["scratch", ""].reserved == pytest.approx(26 + 44 / 60, abs=one_change)
    # A filter on a deleted user's name still finds his hours.
    rows = report.report(START, END, "image", {"owner": "bob"}).rows
    assert {row.key["image"] for row in rows} == {"", EVAL.image}


def _idle_reserved_and_used_unreserved_by_image() -> None:
    rows = {row.key["image"]: row for row in report.report(START, END, "image").rows}
    one_change = INTERVAL / 3600
    # The trainer's container sat attached to both its GPUs for 6 h 25 min: held, idle.
    assert rows[TRAIN.image].idle_reserved == pytest.approx(2 * (6 + 25 / 60), abs=4 * one_change)
    assert rows[TRAIN.image].used == pytest.approx(2 * 24.0, abs=4 * one_change)
    # Work no claim held: the encoder's container; under no image a process outside any
    # container and a GPU busy with no process found.
    assert rows[FFMPEG.image].used_unreserved == pytest.approx(6.5, abs=2 * one_change)
    assert rows[""].used_unreserved == pytest.approx(6.5 + 12.0, abs=4 * one_change)
    assert rows[NOTEBOOK.image].used == rows[NOTEBOOK.image].reserved == 0
    # A model with no power reading at all has no energy, not 0 kWh.
    models = {row.key["model"]: row for row in report.report(START, END, "model").rows}
    assert models[A100].energy_kwh is None and models[A100].power_unknown == pytest.approx(2 * 24 * DAYS)
    assert models[H100].power_unknown == pytest.approx(6.0, abs=2 * one_change)
