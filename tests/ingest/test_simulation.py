"""`manage.py simulate`: a seeded fleet of simulated agents whose snapshots the real
ingest stores with the health their troubles should give, claims the ledger
accepts, and removal that never touches a real node."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node, NodeCredential
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.tools import simulation
from tests.factories import ingest
from tests.integration.conftest import own_redis  # noqa: F401  (a redis-server of the test's own)

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def delivered(monkeypatch):
    """Stands in for Redis and one ingest consumer: each entry appended is stored at
    once by the consumer's code, which checks the simulated agent's signature."""
    from gpufleet.core import broker
    from gpufleet.ingest import stream

    outcomes: list[str] = []

    class Deliver:
        def fcall(self, function, numkeys, *args):  # the append function's arguments
            outcomes.extend(stream.ingest_entries([dict(zip(broker.ENTRY_ORDER, args, strict=True))]))

    monkeypatch.setattr(broker, "client", Deliver)
    return outcomes


def test_the_same_seed_makes_the_same_mixed_fleet():
    fleet = simulation.simulated_fleet(400, seed=7)
    assert fleet == simulation.simulated_fleet(400, seed=7)
    assert fleet != simulation.simulated_fleet(400, seed=8)
    troubles = Counter(n.trouble for n in fleet)
    assert set(troubles) == {"", *simulation.TROUBLES}  # every trouble occurs in 400 nodes
    assert troubles[""] > 300
    assert len({n.model.name for n in fleet}) == len(simulation.MODELS)


@pytest.mark.parametrize(
    "trouble, health, codes",
    [("", "ok", set()), ("vram", "warn", {"gpu0"}), ("hot", "warn", {"gpu0.thermal"}),
     ("ecc", "fail", {"gpu0.ecc"}), ("no-runtime", "fail", {"runtime", "attach"})],
)
def test_each_trouble_gives_its_health_through_the_real_ingest(trouble, health, codes):
    node = simulation.SimulatedNode("sim-00001", simulation.MODELS[0], trouble, seed=42)
    assert ingest_snapshot(simulation.snapshot(node, NOW)).outcome == "accepted"
    stored = Node.objects.get(name="sim-00001")
    assert (stored.health, stored.gpu_count, stored.gpu_models) == (health, 8, "NVIDIA H100 80GB HBM3")
    failing = {f.code for f in stored.findings.exclude(status="ok")}
    assert failing == codes
    device = stored.devices.get(index=0)
    assert device.temperature_c is not None and device.power_limit_w == 700


def test_once_sends_a_round_claims_some_nodes_and_silences_the_offline_ones(delivered):
    call_command("simulate", "--nodes", "60", "--once", "--seed", "3", "--claims-percent", "50")
    fleet = simulation.simulated_fleet(60, seed=3)
    assert delivered == ["accepted"] * 60
    assert Node.objects.filter(simulated=True).count() == 60
    offline = {n.name for n in fleet if n.offline}
    assert offline and set(Node.objects.filter(offline=True).values_list("name", flat=True)) == offline
    claimed = Claim.objects.filter(owner__username=simulation.SIMULATOR_USERNAME)
    assert 15 <= claimed.count() <= 45
    for claim in claimed.select_related("node"):
        # Saved through the ledger, so each node's reserved count says so.
        assert claim.node.gpus_reserved == claim.count == max(1, claim.node.gpu_count // 2)

    # A second run claims nothing twice.
    call_command("simulate", "--nodes", "60", "--once", "--seed", "3", "--claims-percent", "50")
    assert claimed.count() == Claim.objects.filter(owner__username=simulation.SIMULATOR_USERNAME).count()


def test_remove_deletes_the_simulated_nodes_only(delivered):
    ingest("real-01", 2)
    call_command("simulate", "--nodes", "5", "--once")
    assert Node.objects.count() == 6
    assert NodeCredential.objects.filter(name__startswith="sim-").count() == 5
    call_command("simulate", "--remove")
    assert list(Node.objects.values_list("name", flat=True)) == ["real-01"]
    assert not Claim.objects.exists()
    assert not NodeCredential.objects.filter(name__startswith="sim-").exists()  # their keys go with them


def test_it_refuses_to_simulate_over_a_real_node_of_the_same_name(delivered):
    ingest("sim-00002", 2)
    with pytest.raises(CommandError, match="real node"):
        call_command("simulate", "--nodes", "5", "--once")
    assert delivered == [] and not Node.objects.get(name="sim-00002").simulated
    call_command("simulate", "--remove")
    assert Node.objects.filter(name="sim-00002").exists()


def test_an_unreachable_broker_is_a_clear_error(monkeypatch, settings):
    from gpufleet.core import broker

    monkeypatch.setattr(broker, "client", lambda: broker.connect("redis://127.0.0.1:1/0", retries=0))
    with pytest.raises(CommandError, match="cannot reach the broker"):
        call_command("simulate", "--nodes", "2", "--once")


def test_it_keeps_sending_through_a_broker_outage_as_the_workers_do(own_redis, capsys, caplog, monkeypatch):  # noqa: F811
    """The broker is killed after the first round and started again after a try has
    failed: the command logs it, waits, reconnects and sends the next round (stopped
    then by Ctrl-C, as a person stops it)."""
    import redis

    from gpufleet.core import broker

    real = broker.connect(own_redis.url, timeout=2, retries=0)
    sent, refused = [], []

    class Outage:
        def fcall(self, function, *args):
            if len(sent) == 4:
                raise KeyboardInterrupt  # in the third round
            if own_redis.proc.poll() is not None and refused:
                own_redis.start()  # the outage ends after the command has tried at least once
            try:
                real.fcall(function, *args)
            except redis.ConnectionError:
                refused.append(function)
                raise
            sent.append(function)
            if len(sent) == 2:
                own_redis.kill()  # after the first round: a Redis outage

    monkeypatch.setattr(broker, "client", Outage)
    call_command("simulate", "--nodes", "2", "--interval", "0.1", "--wait", "0", "--claims-percent", "0")

    out = capsys.readouterr().out
    assert "round 0: sent 2 snapshot(s)" in out and "round 1: sent 2 snapshot(s)" in out and "stopped" in out
    assert refused and "the broker is unreachable" in caplog.text
    # Both rounds reached the broker: the first survived in its append-only file.
    assert own_redis.client().xlen(broker.ingest_key()) == 4
