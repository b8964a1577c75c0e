"""Shared fixtures: the host fakes, three personas (viewer, operator, admin; the last two
in the team "lab") and
the rule that a missing service skips on a developer's machine but fails in CI."""

from __future__ import annotations

import os
import time

import pytest

from tests.factories import ingest

pytest_plugins = ["tests.fakes.fixtures", "tests.receivers"]

IN_CI = os.environ.get("CI", "").lower() == "true"

# How long a test waits for something that ends by itself (a timeout in the code, a process
# told to stop, a file a process writes) before it calls it hung: far past anything a loaded
# machine adds, so a test never measures the machine's speed (`manage.py bench` does).
HANG_S = 120.0


def wait_until(predicate, what: str, timeout: float = HANG_S):
    """predicate()'s first true value, polled; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting after {timeout:g} s for {what}", pytrace=False)
        time.sleep(0.02)
    return value


def missing_service(reason: str) -> None:
    """Skip (developer machine) or fail (CI=true): CI never skips a missing service."""
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def needs_postgresql() -> None:
    """`missing_service` unless the test database is PostgreSQL."""
    from django.db import connection

    if connection.vendor != "postgresql":
        missing_service("the test database is not PostgreSQL (set DATABASE_URL=postgres://...)")


@pytest.fixture(autouse=True)
def _postgresql_only(request):
    # Marked tests need PostgreSQL; CI's SQLite pass deselects them (-m "not postgresql").
    if request.node.get_closest_marker("postgresql"):
        request.getfixturevalue("db")
        needs_postgresql()


@pytest.fixture(autouse=True)
def _empty_cache():
    # Django's cache outlives each test's database (the overview's kept summary is there):
    # every test starts with it empty, as with its own database.
    from django.core.cache import cache

    cache.clear()


DATABASE_FIXTURES = {"db", "transactional_db", "live_server"}


def pytest_addoption(parser):
    parser.addoption(
        "--database-tests-only", action="store_true",
        help="run only the tests that use the database (CI's second pass, on the other dialect)",
    )
    parser.addoption(
        "--tier", choices=("default", "slow", "all"), default="all",
        help="default: all but the slow kinds of test (SLOW_TIERS); slow: only those; all (what plain "
             "pytest runs). A marker expression (-m) chooses by itself and overrides it",
    )


# The kinds of test left out of the default tier (`sh gpufleet/bootstrap test`), which CI runs too.
SLOW_TIERS = ("integration", "browser", "fuzz", "bench")


def _keep(config, items, wanted) -> None:
    config.hook.pytest_deselected(items=[item for item in items if not wanted(item)])
    items[:] = [item for item in items if wanted(item)]


def _is_slow(item) -> bool:
    return any(item.get_closest_marker(kind) for kind in SLOW_TIERS)


# The tests that start processes, servers or a browser run one after another in one test
# process (with `-n`, as `sh gpufleet/bootstrap test` runs: their timing and ports stay
# their own), while the other process takes the rest; the bench's module runs once.
ONE_AT_A_TIME = pytest.mark.xdist_group("processes")


# First: pytest-xdist's worker reads each test's group from its marks in this same hook
# (registered after this file, so called before it unless this one goes first).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("integration") or item.get_closest_marker("browser")
                or item.module.__name__.endswith("test_bench")):
            item.add_marker(ONE_AT_A_TIME)
    tier = "all" if config.option.markexpr else config.getoption("--tier")
    if tier != "all":
        _keep(config, items, lambda item: _is_slow(item) == (tier == "slow"))
    if config.getoption("--database-tests-only"):
        _keep(config, items, lambda item: bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
                                               or item.get_closest_marker("django_db")))


@pytest.fixture
def monday():
    """The clock stopped at the bookings' tests' Monday noon (tests.claims.helpers.NOW)."""
    import time_machine

    from tests.claims.helpers import NOW

    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def _persona(django_user_model, username: str, role: str | None):
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def lab(db):
    """The team the operator and the admin are in (and book for by default); the viewer
    is in none, so reads only (gpufleet/claims/rights.py)."""
    from tests.claims.helpers import lab_team

    return lab_team()


@pytest.fixture
def viewer(db, django_user_model):
    return _persona(django_user_model, "vera", "viewer")


@pytest.fixture
def operator(lab, django_user_model):
    otto = _persona(django_user_model, "otto", "operator")
    lab.memberships.create(user=otto)
    return otto


@pytest.fixture
def admin_user(lab, django_user_model):
    ada = _persona(django_user_model, "ada", "admin")
    lab.memberships.create(user=ada)
    return ada


@pytest.fixture
def outsider(db, django_user_model):
    """Logged in, but in no role: may see nothing."""
    return _persona(django_user_model, "olga", None)


def _client_for(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(viewer):
    return _client_for(viewer)


@pytest.fixture
def operator_client(operator):
    return _client_for(operator)


@pytest.fixture
def admin_role_client(admin_user):
    return _client_for(admin_user)


@pytest.fixture
def sent_tasks(monkeypatch):
    """Records app.send_task calls instead of talking to a broker."""
    from gpufleet.celery import app

    calls: list[dict] = []

    def record(name, args=None, kwargs=None, **options):
        calls.append({"name": name, "args": list(args or []), **options})

    monkeypatch.setattr(app, "send_task", record)
    return calls


class StreamOutbox(list):
    """The entries an agent appended to the ingest stream (their fields), kept here
    instead of in Redis; `deliver()` hands them to the ingest consumer's code."""

    def xadd(self, name, fields, **options):
        self.append(fields)
        return b"0-%d" % len(self)

    def fcall(self, function, numkeys, *args):
        """The append function (gpufleet/core/broker.py): its arguments as the entry's fields."""
        from gpufleet.core import broker

        return self.xadd(function, dict(zip(broker.ENTRY_ORDER, args, strict=True)))

    def kinds(self) -> list[str]:
        return [fields[b"kind"].decode() for fields in self]

    def payloads(self, kind: str | None = None) -> list[list]:
        from gpufleet import wire

        entries = [wire.read_entry(fields) for fields in self]
        return [wire.entry_payload(entry)[0] for entry in entries if kind in (None, entry.kind)]

    def deliver(self) -> list[str]:
        from gpufleet.ingest import stream

        return stream.ingest_entries(list(self))


@pytest.fixture
def stream_outbox(monkeypatch):
    """What agents append to the ingest stream, kept (a StreamOutbox) instead of sent."""
    from gpufleet.core import broker

    box = StreamOutbox()
    monkeypatch.setattr(broker, "client", lambda: box)
    return box


@pytest.fixture
def make_fleet(db):
    """make_fleet(n, gpus=2, prefix="node") ingests n nodes named node-00, node-01, ..."""
    def make(count: int, gpus: int = 2, prefix: str = "node", **kwargs):
        return [ingest(f"{prefix}-{i:02d}", gpus, **kwargs) for i in range(count)]

    return make


@pytest.fixture
def alpha(db):
    """An 8-GPU node whose agent allows the cdi fix."""
    return ingest("alpha", 8, fixes=["cdi"])
