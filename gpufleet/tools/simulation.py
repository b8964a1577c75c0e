"""Simulated agents, for demos and for measuring the site at fleet size.

A simulated node is a seeded mix of a GPU model and, for a few, a trouble (a
nearly full GPU, a hot one, ECC errors, no NVIDIA runtime in Docker, or silence). Its
snapshot is made the way an agent makes one: `gpu.diagnose_host` reads
nvidia-smi text from an in-memory host, and `wire.build_snapshot` packs it; so
the site sees exactly what real agents send, through the real broker and ingest.

Simulated nodes are marked (`Node.simulated`), so one command removes them and a
real node of the same name is never touched."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from time import monotonic, sleep
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from redis import ConnectionError as BrokerUnreachable
from redis import TimeoutError as BrokerTimeout

from gpufleet import gpu, wire
from gpufleet.claims import services as claims
from gpufleet.core import broker
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node, NodeCredential
from gpufleet.teams.models import Team
from gpufleet.wire import build_snapshot

log = logging.getLogger(__name__)

PREFIX = "sim-"
# Claims made by the simulator are owned by this user, which owns nothing else.
SIMULATOR_USERNAME = "gpufleet-simulator"
SIMULATED_TEAM = "simulated"
DRIVER = "570.133.20"
TOOLKIT = "NVIDIA Container Toolkit CLI version 1.18.2\ncommit: 9e88ed3\n"


@dataclass(frozen=True)
class GpuModel:
    name: str
    vram_mib: int
    per_node: int
    power_limit_w: int


MODELS = (
    GpuModel("NVIDIA H100 80GB HBM3", 81559, 8, 700),
    GpuModel("NVIDIA H200", 143771, 8, 700),
    GpuModel("NVIDIA A100-SXM4-40GB", 40960, 8, 400),
    GpuModel("NVIDIA L40S", 46068, 4, 350),
    GpuModel("NVIDIA GeForce RTX 4090", 24564, 2, 450),
    GpuModel("NVIDIA A10", 23028, 1, 150),
)

# What goes wrong, and on how many nodes in a hundred. The rest are healthy.
TROUBLES = {
    "vram": 4,  # one GPU nearly full: warning
    "hot": 3,  # one GPU in software thermal slowdown: warning
    "ecc": 2,  # uncorrectable ECC errors: failing
    "no-runtime": 1,  # Docker has no NVIDIA runtime, so cannot attach GPUs: failing
    "offline": 2,  # reports once, then falls silent
}


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    model: GpuModel
    trouble: str  # "" or a key of TROUBLES
    seed: int

    @property
    def offline(self) -> bool:
        return self.trouble == "offline"


def simulated_fleet(count: int, seed: int = 0) -> list[SimulatedNode]:
    """`count` nodes, the same ones for the same seed."""
    rng = random.Random(seed)
    troubles = [key for key, share in TROUBLES.items() for _ in range(share)]
    troubles += [""] * (100 - len(troubles))
    return [
        SimulatedNode(f"{PREFIX}{i:05d}", rng.choice(MODELS), rng.choice(troubles), rng.randrange(2**32))
        for i in range(count)
    ]


class SimulatedHost:
    """The host side of one simulated node at one moment: answers nvidia-smi and
    nvidia-ctk as a real host would, and has no processes, containers or Xids."""

    def __init__(self, node: SimulatedNode, tick: int):
        self.node = node
        self.tick = tick

    def run(self, argv: Sequence[str], timeout: float = gpu.COMMAND_TIMEOUT_S) -> gpu.CommandResult:
        argv = tuple(argv)
        if list(argv) == gpu.SMI_QUERY_ARGV:
            return gpu.CommandResult(argv, 0, self._smi_rows())
        if list(argv) == gpu.TOOLKIT_ARGV:
            return gpu.CommandResult(argv, 0, TOOLKIT)
        return gpu.CommandResult(argv, 0, "")  # compute apps, the kernel log: nothing to report

    def info(self) -> gpu.DockerInfo:
        return gpu.DockerInfo(runtimes=("runc",) if self.node.trouble == "no-runtime" else ("runc", "nvidia"))

    def containers(self) -> list:
        return []

    def inspect(self, container_ids) -> dict:
        return {}

    def _smi_rows(self) -> str:
        rng = random.Random(self.node.seed + self.tick)
        model = self.node.model
        return "".join(self._smi_row(i, model, rng) for i in range(model.per_node))

    def _smi_row(self, index: int, model: GpuModel, rng: random.Random) -> str:
        troubled = index == 0 and self.node.trouble
        util = rng.randrange(0, 100)
        used = model.vram_mib * (97 if troubled == "vram" else rng.randrange(5, 80)) // 100
        temperature = 88 if troubled == "hot" else rng.randrange(32, 70)
        ecc_errors = 3 if troubled == "ecc" else 0
        power = model.power_limit_w * (40 + util // 2) / 100
        uuid = f"GPU-{self.node.seed:08x}-{index:04x}-4000-8000-{self.node.name.encode().hex()[-12:]:0>12}"
        values = {
            "index": index,
            "uuid": uuid,
            "name": model.name,
            "memory.total": model.vram_mib,
            "memory.used": used,
            "utilization.gpu": util,
            "driver_version": DRIVER,
            "pci.bus_id": f"00000000:{0x18 + 0x11 * index:02X}:00.0",
            "temperature.gpu": temperature,
            "temperature.memory": temperature + 8,
            "power.draw": f"{power:.2f}",
            "enforced.power.limit": f"{model.power_limit_w:.2f}",
            "fan.speed": "[N/A]",
            "pstate": "P0",
            "clocks.current.sm": 1980,
            "clocks.max.sm": 1980,
            "persistence_mode": "Enabled",
            "ecc.mode.current": "Enabled",
            "ecc.errors.corrected.volatile.total": 0,
            "ecc.errors.uncorrected.volatile.total": ecc_errors,
            "ecc.errors.uncorrected.aggregate.total": ecc_errors,
            "retired_pages.pending": "No",
            "remapped_rows.correctable": 0,
            "remapped_rows.uncorrectable": ecc_errors,
            "remapped_rows.pending": "No",
            "remapped_rows.failure": "No",
            "clocks_event_reasons.sw_thermal_slowdown": "Active" if troubled == "hot" else "Not Active",
            "mig.mode.current": "Disabled",
        }
        return ", ".join(str(values.get(field.query, "Not Active")) for field in gpu.ALL_FIELDS) + "\n"


def snapshot(node: SimulatedNode, at: datetime, tick: int = 0) -> dict[str, Any]:
    """The snapshot `node`'s agent would send at `at` (`tick` varies the figures)."""
    host = SimulatedHost(node, tick)
    return build_snapshot(gpu.diagnose_host(host, host, [], now=at), node.name, [], at)


def register(nodes: Sequence[SimulatedNode], now: datetime) -> list[str]:
    """Create the simulated nodes' rows, marked; returns the names that belong to a
    real node and must not be simulated."""
    names = [n.name for n in nodes]
    Node.objects.bulk_create(
        [Node(name=name, first_seen=now, last_seen=now, simulated=True) for name in names], ignore_conflicts=True
    )
    return list(Node.objects.filter(name__in=names, simulated=False).values_list("name", flat=True))


def send_round(nodes: Sequence[SimulatedNode], send: Callable[[dict], None], at: datetime, tick: int) -> int:
    """One snapshot from every node still reporting (an offline one reports only in
    the first round); returns how many were sent."""
    sent = 0
    for node in nodes:
        if node.offline and tick > 0:
            continue
        send(snapshot(node, at, tick))
        sent += 1
    return sent


# After the broker refused a round, wait this long before the next try, doubling up to
# the most: the agents' workers keep trying too, and a restarted Redis is back in seconds.
RETRY_FIRST_S, RETRY_MOST_S = 1.0, 32.0


def run(
    nodes: Sequence[SimulatedNode],
    send: Callable[[dict], None],
    interval: float,
    *,
    once: bool = False,
    say: Callable[[str], None],
    after_first_round: Callable[[int], None],
) -> None:
    """Send a round every `interval` seconds until interrupted, or one with `once`. A round
    the broker refused (down, restarting) is logged and sent again, with fresh timestamps,
    after a wait that doubles up to RETRY_MOST_S; with `once` the error is raised instead:
    a one-off run says at once that it could not send."""
    tick, delay = 0, RETRY_FIRST_S
    while True:
        started = monotonic()
        try:
            sent = send_round(nodes, send, timezone.now(), tick)
        except (BrokerUnreachable, BrokerTimeout) as exc:
            if once:
                raise
            log.warning("round %d: the broker is unreachable (%s); trying again in %.0f s", tick, exc, delay)
            sleep(delay)
            delay = min(2 * delay, RETRY_MOST_S)
            continue
        delay = RETRY_FIRST_S
        say(f"round {tick}: sent {sent} snapshot(s) in {monotonic() - started:.1f} s")
        if tick == 0:
            after_first_round(sent)
        if once:
            return
        tick += 1
        sleep(max(0.0, interval - (monotonic() - started)))


class NamesTaken(Exception):
    """Real nodes hold names the simulated fleet would take."""


def simulate(count: int, interval: float, *, once: bool, claims_percent: int, seed: int, wait: float,
             say: Callable[[str], None], warn: Callable[[str], None]) -> None:
    """`manage.py simulate`: `count` simulated nodes (the same ones for `seed`) registered,
    then a round every `interval` seconds on the ingest stream, as `run` sends them; after the
    first round is stored (waiting up to `wait` seconds for the ingest consumers), claims on
    `claims_percent` of the nodes and the silent ones offline. Raises NamesTaken where real
    nodes have simulated names, and with `once` the broker's error where it cannot be reached."""
    fleet = simulated_fleet(count, seed)
    taken = register(fleet, timezone.now())
    if taken:
        raise NamesTaken(f"{len(taken)} real node(s) have simulated names, e.g. {taken[0]!r}: not simulating")
    run(fleet, signed_sender(fleet), interval, once=once, say=say,
        after_first_round=lambda sent: _after_first_round(fleet, sent, claims_percent, seed, wait, say, warn))


def signed_sender(nodes: Sequence[SimulatedNode]) -> Callable[[dict], None]:
    """A `send` for `run` that appends each snapshot to the ingest stream, signed as real
    agents sign, with keys of the simulated nodes' own."""
    keys = credentials.enroll_many([n.name for n in nodes])

    def send(snapshot: dict) -> None:
        name = snapshot["node"]
        if name in keys:  # a revoked one: its agent would have no key to sign with
            broker.append(wire.encode_entry(keys[name], name, wire.SNAPSHOT, [wire.encode_snapshot(snapshot), None]))

    return send


def _after_first_round(nodes: Sequence[SimulatedNode], sent: int, claims_percent: int, seed: int, wait: float,
                       say: Callable[[str], None], warn: Callable[[str], None]) -> None:
    """Claims need stored nodes: wait for the ingest consumers to store the first round."""
    deadline = monotonic() + wait
    names = [n.name for n in nodes]
    while (stored := Node.objects.filter(name__in=names, collected_at__isnull=False).count()) < sent:
        if monotonic() > deadline:
            warn(f"only {stored} of {sent} snapshots stored after {wait:.0f} s: is `manage.py ingest` running?")
            break
        sleep(0.5)
    made = add_claims(nodes, claims_percent, seed)
    offline = mark_offline(nodes)
    say(f"{stored} node(s) stored, {made} claim(s) made, {offline} node(s) silent from now on")


def add_claims(nodes: Sequence[SimulatedNode], percent: int, seed: int = 0) -> int:
    """Claims on `percent` of the reporting nodes, saved as any claim is (the ledger
    decides under the node lock) by the system, for the team "simulated" and owned by
    the simulator's user; a node that already has the simulator's claim is left alone.
    Returns how many were made."""
    rng = random.Random(seed)
    user = simulator_user()
    terms = claims.Terms(owner=user, team=Team.objects.get_or_create(name=SIMULATED_TEAM)[0])
    wanted = [n for n in nodes if not n.offline and rng.randrange(100) < percent]
    stored = Node.objects.filter(name__in=[n.name for n in wanted], simulated=True, gpu_count__gt=0)
    made = 0
    for node in stored.exclude(claims__owner=user):
        count = max(1, node.gpu_count // 2)
        try:
            claims.save_claim(node, gpu.Claim(name=f"sim-job-{node.pk}", count=count), None, terms=terms)
        except claims.ClaimError:
            continue  # the ledger said no (a GPU vanished meanwhile): simulate what fits
        made += 1
    return made


def mark_offline(nodes: Sequence[SimulatedNode]) -> int:
    """The silent nodes go offline at once rather than after the offline delay, so a
    demo shows them from the start."""
    names = [n.name for n in nodes if n.offline]
    return Node.objects.filter(name__in=names, simulated=True).update(offline=True)


def remove() -> int:
    """Delete every simulated node (its devices, history, findings and claims go
    with it) and the simulator's user; returns how many nodes."""
    with transaction.atomic():
        deleted = Node.objects.filter(simulated=True).count()
        names = list(Node.objects.filter(simulated=True).values_list("name", flat=True))
        Node.objects.filter(simulated=True).delete()
        NodeCredential.objects.filter(name__in=names).delete()
        get_user_model().objects.filter(username=SIMULATOR_USERNAME).delete()
    return deleted


def simulator_user():
    user, created = get_user_model().objects.get_or_create(username=SIMULATOR_USERNAME, defaults={"is_active": False})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user
