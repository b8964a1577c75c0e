"""Two editors racing for the last free GPU: the node row lock (PostgreSQL) or the
IMMEDIATE write transaction (SQLite) serialises the saves, so exactly one wins and
the other gets the ledger's refusal, never a double booking."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import claim, make_node


def _slowed(monkeypatch, module, name: str) -> None:
    """Holds each call of `module.name` after its answer, so that two racing saves both
    pass that check before either writes."""
    real = getattr(module, name)

    def slow(*args, **kwargs):
        verdict = real(*args, **kwargs)
        time.sleep(0.3)
        return verdict

    monkeypatch.setattr(module, name, slow)


def _race(save, racers: dict[str, object]) -> dict[str, object]:
    """`save(name, user)` for each racer in a thread of its own, all let go at once; each
    name's outcome is what it saved or the exception it raised."""
    barrier = threading.Barrier(len(racers))
    outcomes: dict[str, object] = {}

    def run(name: str, user) -> None:
        try:
            barrier.wait(timeout=10)
            outcomes[name] = save(name, user)
        except Exception as exc:  # recorded and asserted by the test
            outcomes[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(name, user)) for name, user in racers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return outcomes


@pytest.mark.django_db(transaction=True)
def test_it_lets_exactly_one_of_two_racing_saves_take_the_last_gpu(operator, admin_user, monkeypatch):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=1)
    # Hold each save between the ledger check and the write, so without the lock
    # both would see one GPU free and both would book it.
    _slowed(monkeypatch, services, "check_claim")

    def save(name: str, user) -> Claim:
        return services.save_claim(node, gpu.Claim(name=name, count=1), user)

    outcomes = _race(save, {"infer": operator, "eval": admin_user})

    won = [n for n, o in outcomes.items() if isinstance(o, Claim)]
    lost = [o for o in outcomes.values() if not isinstance(o, Claim)]
    assert len(won) == 1, outcomes
    assert len(lost) == 1 and isinstance(lost[0], services.ClaimRejected), outcomes
    assert lost[0].code == "insufficient"
    assert lost[0].message == "Needs 1 GPU but only 0 of 2 are free."
    assert sorted(Claim.objects.filter(node=node).values_list("name", flat=True)) == sorted(["train", won[0]])
    assert Node.objects.get(pk=node.pk).gpus_reserved == 2


@pytest.mark.django_db(transaction=True)
def test_two_racing_bookings_of_one_gpu_in_overlapping_windows_never_both_hold_it(operator, admin_user, monkeypatch):
    node = make_node("alpha", 2)
    _slowed(monkeypatch, services, "check_claim")
    soon = timezone.now().replace(microsecond=0) + timedelta(days=1)
    windows = {"train": (soon, soon + timedelta(days=2)), "eval": (soon + timedelta(days=1), soon + timedelta(days=3))}

    def book(name: str, user) -> Claim:
        starts_at, ends_at = windows[name]
        return services.save_claim(node, gpu.Claim(name=name, device_ids=("0",)), user,
                                   terms=services.Terms(owner=user, starts_at=starts_at, ends_at=ends_at))

    outcomes = _race(book, {"train": operator, "eval": admin_user})

    won = [o for o in outcomes.values() if isinstance(o, Claim)]
    lost = [o for o in outcomes.values() if not isinstance(o, Claim)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], services.ClaimRejected) and lost[0].code == "device_taken", outcomes
    assert f"is already reserved by {won[0].name} {won[0].window()}" in lost[0].message
    assert list(Claim.objects.filter(node=node).values_list("name", flat=True)) == [won[0].name]


@pytest.mark.django_db(transaction=True)
def test_two_bookings_of_one_team_on_two_nodes_never_both_squeeze_under_its_quota(operator, admin_user, monkeypatch):
    from gpufleet.claims import quota
    from gpufleet.teams.models import Team

    team = Team.objects.create(name="vision", max_gpus=4)
    team.memberships.create(user=operator)
    nodes = {"train": make_node("alpha", 4), "eval": make_node("beta", 4)}
    # Hold each save between its quota check and its write: without the team's lock both
    # would see 4 GPUs free of the quota, each on its own node, and both would take 3.
    _slowed(monkeypatch, quota, "exceeded")
    soon = timezone.now().replace(microsecond=0) + timedelta(days=1)

    def book(name: str, user) -> Claim:
        terms = services.Terms(owner=user, starts_at=soon, ends_at=soon + timedelta(hours=8), team=team)
        return services.save_claim(nodes[name], gpu.Claim(name=name, count=3), user, terms=terms)

    outcomes = _race(book, {"train": operator, "eval": admin_user})

    won = [o for o in outcomes.values() if isinstance(o, Claim)]
    lost = [o for o in outcomes.values() if not isinstance(o, Claim)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert isinstance(lost[0], services.QuotaExceeded), outcomes
    assert (lost[0].exceeded.held, lost[0].exceeded.asks) == (3, 3)
    assert list(Claim.objects.filter(team=team).values_list("name", flat=True)) == [won[0].name]
