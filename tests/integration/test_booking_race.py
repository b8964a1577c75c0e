"""Many people booking at once through the real web: 800 bookings with random windows
(pinned GPUs by index or UUID, counts, whole nodes) from 50 writers at once, through
gunicorn's worker processes and threads, on a few nodes so that they collide. Afterwards
SQL over the stored windows finds no GPU held twice at any instant: no pinned GPU in two
overlapping windows, and on no node more GPUs asked for at once than it has. The node
lock (PostgreSQL) or the IMMEDIATE write transaction (SQLite) serialises the ledger's
check and the write; without it both of two racing bookings see the GPUs free."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from gpufleet.api.models import ApiToken
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Device, Node
from tests.claims.helpers import make_node
from tests.factories import gpu_uuid
from tests.integration.web import Web

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BOOKINGS, WRITERS = 800, 50
NODES, GPUS = 4, 8
# The web's size here: 32 requests served at once, so the writers' bookings meet in
# the ledger, not only in gunicorn's queue.
WEB_WORKERS, WEB_THREADS = 4, 8
HORIZON = timedelta(days=7)
LONGEST = timedelta(hours=36)


@dataclass(frozen=True)
class Booking:
    node: str
    body: dict


def _seed() -> int:
    """GPUFLEET_RACE_SEED replays a run; otherwise a fresh one, shown with any failure."""
    given = os.environ.get("GPUFLEET_RACE_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


def _bookings(rng: random.Random, nodes: list[str], now: datetime) -> list[Booking]:
    """Random windows over the next days: a start to the minute, a length from an hour to
    LONGEST, a few open-ended; GPUs pinned (each by index or by UUID), a count, or the
    whole node."""
    bookings = []
    for number in range(BOOKINGS):
        node = rng.choice(nodes)
        starts_at = now + timedelta(minutes=rng.randrange(10, int(HORIZON.total_seconds() // 60)))
        ends_at = None if rng.random() < 0.02 else starts_at + timedelta(minutes=rng.randrange(60, int(LONGEST.total_seconds() // 60)))
        body = {"name": f"b{number:03d}", "starts_at": starts_at.isoformat(),
                "ends_at": ends_at.isoformat() if ends_at else None}
        kind = rng.random()
        if kind < 0.45:
            indexes = rng.sample(range(GPUS), rng.randint(1, 3))
            body["device_ids"] = [i if rng.random() < 0.5 else gpu_uuid(node, i) for i in indexes]
        elif kind < 0.95:
            body["count"] = rng.randint(1, 4)
        # else: neither, so every GPU of the node
        bookings.append(Booking(node, body))
    return bookings


def writer_token(django_user_model, number: int) -> str:
    """A person who may book, and their API token (read-write): an operator in one of two
    teams sharing the fleet, whose bookings go to that team (their only one)."""
    from django.contrib.auth.models import Group

    from gpufleet.teams.models import Team

    user = django_user_model.objects.create_user(username=f"writer{number:02d}")
    user.groups.add(Group.objects.get(name="operator"))
    Team.objects.get_or_create(name=("vision", "nlp")[number % 2])[0].memberships.create(user=user)
    _, secret = ApiToken.issue(user, "race", "read_write")
    return secret


def _book_all(port: int, token: str, bookings: list[Booking], start: threading.Barrier) -> list[tuple[str, int, dict]]:
    """One writer: its bookings one after another on one connection, as a script would."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answers = []
    start.wait(timeout=60)
    try:
        for booking in bookings:
            conn.request("POST", f"/api/nodes/{booking.node}/claims/", json.dumps(booking.body), headers)
            response = conn.getresponse()
            answers.append((booking.body["name"], response.status, _body(response.read())))
    finally:
        conn.close()
    return answers


def _body(raw: bytes) -> dict:
    try:
        return json.loads(raw)
    except ValueError:  # a server error's page: its title, to be shown
        title = re.search(r"<title>(.*?)</title>", raw.decode(errors="replace"), re.S)
        return {"page": title.group(1) if title else raw[:200]}


def _refused_by_ledger(status: int, body: dict) -> bool:
    return status == 409 and body.get("error", {}).get("code") in {"device_taken", "insufficient"}


def _elements(column: str) -> str:
    """A claim's device ids as rows of one column `value`, in this database's SQL."""
    if connection.vendor == "postgresql":
        return f"jsonb_array_elements_text({column}) AS ids(value)"
    return f"json_each({column}) AS ids"


def _tables() -> dict[str, str]:
    return {"claim": Claim._meta.db_table, "device": Device._meta.db_table, "node": Node._meta.db_table}


def _query(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def gpus_held_twice() -> list[tuple]:
    """Two claims holding one GPU at one instant: each pinned id resolved to its GPU (an
    index, or a UUID of the node's), every GPU of the node for a whole-node claim, and
    the windows [starts_at, ends_at) (no end: open) of the two overlapping."""
    t = _tables()
    sql = f"""
        WITH held AS (
            SELECT c.id, c.node_id, c.name, c.starts_at, c.ends_at, d."index" AS gpu
            FROM {t["claim"]} c CROSS JOIN {_elements("c.device_ids")}
            JOIN {t["device"]} d ON d.node_id = c.node_id AND d.vanished_at IS NULL
                AND (d.uuid = ids.value OR CAST(d."index" AS TEXT) = ids.value)
            UNION ALL
            SELECT c.id, c.node_id, c.name, c.starts_at, c.ends_at, d."index"
            FROM {t["claim"]} c JOIN {t["device"]} d ON d.node_id = c.node_id AND d.vanished_at IS NULL
            WHERE c.count = 0 AND NOT EXISTS (SELECT 1 FROM {_elements("c.device_ids")})
        )
        SELECT n.name, a.gpu, a.name, a.starts_at, a.ends_at, b.name, b.starts_at, b.ends_at
        FROM held a
        JOIN held b ON b.node_id = a.node_id AND b.gpu = a.gpu AND a.id < b.id
            AND (b.ends_at IS NULL OR a.starts_at < b.ends_at)
            AND (a.ends_at IS NULL OR b.starts_at < a.ends_at)
        JOIN {t["node"]} n ON n.id = a.node_id
        ORDER BY n.name, a.gpu, a.starts_at
    """
    return _query(sql)


def nodes_overbooked() -> list[tuple]:
    """Instants where a node's claims in force ask for more GPUs than it has: pinned GPUs,
    counts and whole nodes added up. What is asked only grows where a claim starts, so
    the claims' starts are the instants to check."""
    t = _tables()
    sql = f"""
        WITH total AS (
            SELECT node_id, COUNT(*) AS gpus FROM {t["device"]} WHERE vanished_at IS NULL GROUP BY node_id
        ), asks AS (
            SELECT c.id, c.node_id, c.starts_at, c.ends_at,
                CASE WHEN EXISTS (SELECT 1 FROM {_elements("c.device_ids")})
                         THEN (SELECT COUNT(*) FROM {_elements("c.device_ids")})
                     WHEN c.count > 0 THEN c.count
                     ELSE total.gpus END AS gpus
            FROM {t["claim"]} c JOIN total ON total.node_id = c.node_id
        )
        SELECT n.name, moment.starts_at, SUM(held.gpus) AS asked, total.gpus
        FROM asks moment
        JOIN asks held ON held.node_id = moment.node_id AND held.starts_at <= moment.starts_at
            AND (held.ends_at IS NULL OR moment.starts_at < held.ends_at)
        JOIN total ON total.node_id = moment.node_id
        JOIN {t["node"]} n ON n.id = moment.node_id
        GROUP BY n.name, moment.id, moment.starts_at, total.gpus
        HAVING SUM(held.gpus) > total.gpus
        ORDER BY n.name, moment.starts_at
    """
    return _query(sql)


def test_fifty_writers_booking_at_once_never_hold_a_gpu_twice(django_user_model, tmp_path):
    seed = _seed()
    print(f"booking race seed {seed} (GPUFLEET_RACE_SEED={seed} replays it)")
    rng = random.Random(seed)
    web = Web(tmp_path / "web.log", {"GPUFLEET_WEB_THREADS": str(WEB_THREADS)}, workers=WEB_WORKERS)
    try:
        nodes = [make_node(f"race-{n}", GPUS).name for n in range(NODES)]
        tokens = [writer_token(django_user_model, number) for number in range(WRITERS)]
        bookings = _bookings(rng, nodes, datetime.now(UTC).replace(second=0, microsecond=0))
        web.wait_ready()
        start = threading.Barrier(WRITERS)
        with ThreadPoolExecutor(WRITERS) as pool:
            runs = [pool.submit(_book_all, web.port, token, bookings[number::WRITERS], start)
                    for number, token in enumerate(tokens)]
            answers = [answer for run in runs for answer in run.result()]
    finally:
        web.stop()

    unexpected = [(name, status, body) for name, status, body in answers
                  if status != 201 and not _refused_by_ledger(status, body)]
    assert not unexpected, f"seed {seed}: answers other than booked or refused by the ledger: {unexpected[:5]}\n{web.log()}"
    booked = {name for name, status, _ in answers if status == 201}
    print(f"{len(booked)} of {BOOKINGS} booked")
    assert len(answers) == BOOKINGS
    # Both outcomes, many of each: the writers did compete for the same GPUs.
    assert BOOKINGS // 10 < len(booked) < BOOKINGS - BOOKINGS // 10, f"seed {seed}: {len(booked)} of {BOOKINGS} booked"
    assert set(Claim.objects.values_list("name", flat=True)) == booked, f"seed {seed}"
    assert set(Claim.objects.values_list("team__name", flat=True)) == {"vision", "nlp"}, f"seed {seed}"

    twice = gpus_held_twice()
    assert not twice, f"seed {seed}: GPUs held twice at once (node, GPU, claim, window, claim, window): {twice[:10]}"
    over = nodes_overbooked()
    assert not over, f"seed {seed}: more GPUs asked for at once than the node has (node, at, asked, GPUs): {over[:10]}"


def test_the_queries_find_gpus_held_twice_and_nodes_overbooked():
    # The queries above, over claims written past the ledger, as a lost lock would leave them.
    alpha, beta = make_node("alpha", 2), make_node("beta", 1)
    soon = datetime.now(UTC) + timedelta(days=1)
    rows = [(alpha, "pinned-by-index", 0, ["0"], soon, soon + timedelta(hours=4)),
            (alpha, "pinned-by-uuid", 0, [gpu_uuid("alpha", 0)], soon + timedelta(hours=3), None),
            (alpha, "counted", 2, [], soon + timedelta(hours=1), soon + timedelta(hours=2)),
            (alpha, "after", 0, ["1"], soon + timedelta(hours=4), soon + timedelta(hours=5)),
            (beta, "whole", 0, [], soon, soon + timedelta(hours=2)),
            (beta, "pinned", 0, ["0"], soon + timedelta(hours=1), soon + timedelta(hours=3))]
    for node, name, count, device_ids, starts_at, ends_at in rows:
        Claim.objects.create(node=node, name=name, count=count, device_ids=device_ids, starts_at=starts_at, ends_at=ends_at)

    twice = [(node, gpu, a, b) for node, gpu, a, _, _, b, _, _ in gpus_held_twice()]
    assert twice == [("alpha", 0, "pinned-by-index", "pinned-by-uuid"), ("beta", 0, "whole", "pinned")]
    over = [(node, asked, gpus) for node, _, asked, gpus in nodes_overbooked()]
    assert over == [("alpha", 3, 2), ("beta", 2, 1)]
