"""Headless Chromium (Debian's, driven by Playwright) against the live test server.

Missing Chromium skips these tests on a developer's machine and fails them in CI.
Screenshots go to GPUFLEET_ARTIFACTS (default test-artifacts/ in the checkout)."""

from __future__ import annotations

import os
import shutil
from datetime import UTC
from pathlib import Path

import pytest

from tests.conftest import missing_service
from tests.integration import conftest as integration

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests
# make around it are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("GPUFLEET_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))

# The integration tests' real Redis (an ingest stream of the test's own), for journeys
# through it; `broker_here` below stands in for it inside the process.
broker = integration.broker


@pytest.fixture(scope="session")
def browser():
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        missing_service(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True,
                                  base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def log_in(page, user, password: str | None = None):
    """Log in through the real login form."""
    page.goto("/accounts/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", password or "pw-" + user.get_username())
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" not in url)
    return page


def assert_cells_line_up(row) -> None:
    """A table row's first and last cells (its name and its buttons) are as tall as each
    other and start at the same height: the buttons are a cell of the row."""
    first, last = row.locator("th, td").first.bounding_box(), row.locator("th, td").last.bounding_box()
    assert (last["y"], last["height"]) == pytest.approx((first["y"], first["height"]), abs=1), row.inner_text()


# --- a small fleet, ingested through the real snapshot path -------------------

HEALTHY, HOT, BROKEN, GONE, SPEC = "h200-a01", "h200-a02", "h200-b01", "h200-b02", "a40-c01"
CDI_SPEC_FILE = "/etc/cdi/nvidia.yaml"


def _ingest(snap: dict, now=None):
    from gpufleet.fleet.models import Node
    from gpufleet.ingest.services import ingest_snapshot

    result = ingest_snapshot(snap, now=now)
    assert result.outcome == "accepted", result
    return Node.objects.get(name=snap["node"])


def cdi_spec_snapshot(name: str, gpus: int = 8, fixes=("cdi",), at=None, **smi) -> dict:
    """A node with an NVIDIA CDI spec on disk that Docker does not list: the "cdi"
    finding warns (and its fix is allowed when `fixes` says so)."""
    from datetime import datetime

    from gpufleet import gpu
    from gpufleet.wire import build_snapshot
    from tests.factories import smi_rows
    from tests.fakes.memory import FakeDocker, host

    runner = host(smi=smi_rows(name, gpus, name="NVIDIA A40", total_mib=46068, **smi),
                  ctk="NVIDIA Container Toolkit CLI version 1.18.2\ncommit: 9e88ed3\n")
    docker = FakeDocker(gpu.DockerInfo(runtimes=("runc", "nvidia"), cdi_devices=()))
    diagnosis = gpu.diagnose_host(runner, docker, [CDI_SPEC_FILE])
    return build_snapshot(diagnosis, name, list(fixes), at or datetime.now(UTC))


def failing_gpu_snapshot(name: str) -> dict:
    """An 8×H100 node from recorded nvidia-smi output of GPUs in trouble (thermal
    and power-brake slowdown, uncorrectable ECC errors, a pending remap) with Xid
    errors in its kernel log: the node fails on its GPUs, not its container stack."""
    from datetime import datetime

    from gpufleet import gpu
    from gpufleet.wire import build_snapshot
    from tests.fakes.memory import FakeDocker, host
    from tests.fakes.recorded import recording

    runner = host(smi=recording("health/smi-8x-h100-failing.csv"), dmesg=recording("health/kernel-iso.txt"),
                  ctk="NVIDIA Container Toolkit CLI version 1.18.2\ncommit: 9e88ed3\n")
    docker = FakeDocker(gpu.DockerInfo(runtimes=("runc", "nvidia")))
    # The recorded kernel log's Xid lines are of 3 December 2026: judge them from then.
    diagnosis = gpu.diagnose_host(runner, docker, [], now=datetime(2026, 12, 3, 17, 0, tzinfo=UTC))
    return build_snapshot(diagnosis, name, [], datetime.now(UTC))


@pytest.fixture
def fleet(transactional_db):
    """Five nodes: healthy (8 GPUs, CDI), warning (VRAM nearly full, 4 GPUs), failing
    (no toolkit, Docker cannot attach GPUs; 8 GPUs), offline (8 GPUs) and one whose
    CDI spec Docker ignores (warning, remote "cdi" fix allowed; 8 GPUs)."""
    from datetime import datetime, timedelta

    from gpufleet.fleet.models import Node
    from tests.factories import snapshot

    now = datetime.now(UTC)
    nodes = {
        HEALTHY: _ingest(snapshot(HEALTHY, 8, attach="cdi", used_mib=30000, util="40")),
        HOT: _ingest(snapshot(HOT, 4, used_mib=140000, util="97")),
        BROKEN: _ingest(snapshot(BROKEN, 8, attach="none", toolkit=None, util="0")),
        GONE: _ingest(snapshot(GONE, 8, at=now - timedelta(hours=2)), now=now - timedelta(hours=2)),
        SPEC: _ingest(cdi_spec_snapshot(SPEC, used_mib=12000, util="55")),
    }
    Node.objects.filter(name=GONE).update(offline=True)
    nodes[GONE].refresh_from_db()
    return nodes


def add_history(node, hours: int = 24, every_minutes: int = 5) -> int:
    """24 h of samples for the node's GPUs, as if it had reported every 5 minutes
    (samples only, written directly). Every five-minute bucket must hold one: the
    24 h chart draws a rollup at its bucket's start, and at 10 minutes a sample
    drawn 5 minutes early beside the raw tail could leave a 24-minute hole, which
    the line shows as a gap (over 15 min) on some seconds of the clock."""
    import math
    from datetime import timedelta

    from django.utils import timezone

    from gpufleet.fleet.models import DeviceSample

    now = timezone.now()
    samples = []
    for device in node.devices.all():
        total = device.vram_total_mib or 1
        for step in range(1, hours * 60 // every_minutes):
            at = now - timedelta(minutes=step * every_minutes)
            phase = step / 18 + device.index
            samples.append(DeviceSample(device=device, collected_at=at,
                                        vram_used_mib=int(total * (0.35 + 0.25 * math.sin(phase))),
                                        utilization_percent=int(50 + 40 * math.sin(phase * 1.7))))
    DeviceSample.objects.bulk_create(samples)
    # The 24 h chart reads five-minute rollups: roll them with the housekeeping's code
    # (the beat rolls each bucket once, and these may be older than what it rolled).
    from gpufleet.fleet import history

    history.roll_between(now - timedelta(hours=hours), now)
    return len(samples)


# --- the broker, in-process --------------------------------------------------


class InProcessBroker:
    """Stands in for Redis: app.send_task (the centre's tasks for agents) and the agents'
    appends to the ingest stream put messages here, and the test delivers them one by
    one to the real code (agent collect, the ingest consumer's) in this process, so each
    step of a job can be watched on the page. Stream entries are named by their kind:
    INGEST for a snapshot, JOB_PROGRESS for a job report."""

    KINDS = {b"snapshot": "gpufleet.fleet.tasks.ingest", b"progress": "gpufleet.jobs.tasks.job_progress"}

    def __init__(self):
        import queue

        self.messages = queue.Queue()
        self.sent: list[tuple[str, list, str | None]] = []

    def send_task(self, name, args=None, kwargs=None, queue=None, **options):
        message = (name, list(args or []), queue)
        self.sent.append(message)
        self.messages.put((message, dict(kwargs or {})))  # kwargs: the signature

    def xadd(self, stream, fields, **options):
        message = (self.KINDS[fields[b"kind"]], [], stream)
        self.sent.append(message)
        self.messages.put((message, fields))

    def fcall(self, function, numkeys, *args):
        """The append function (gpufleet/core/broker.py): its arguments as the entry's fields."""
        from gpufleet.core import broker

        self.xadd(function, dict(zip(broker.ENTRY_ORDER, args, strict=True)))

    def take(self, name: str, timeout: float = 10) -> tuple[str, list, str | None]:
        return self._take(name, timeout)[0]

    def _take(self, name: str, timeout: float) -> tuple[tuple[str, list, str | None], dict]:
        got, kwargs = self.messages.get(timeout=timeout)
        assert got[0] == name, f"expected a {name} message, got {got}"
        return got, kwargs

    def deliver(self, name: str, timeout: float = 10) -> tuple[str, list, str | None]:
        """Run the next message (which must be a `name` task or entry) as a worker or the
        ingest consumer would."""
        from gpufleet.celery import app
        from gpufleet.ingest import stream

        message, kwargs = self._take(name, timeout)
        if name in self.KINDS.values():
            stream.ingest_entries([kwargs])
        else:
            app.tasks[name].apply(args=message[1], kwargs=kwargs, throw=True)
        return message

    def empty(self) -> bool:
        return self.messages.empty()


@pytest.fixture
def broker_here(monkeypatch):
    """app.send_task and the ingest stream go to an InProcessBroker for the test; see deliver()."""
    # Registers the tasks the broker delivers to (collect, apply_fix).
    import gpufleet.agent.tasks
    import gpufleet.fleet.tasks  # noqa: F401
    from gpufleet.celery import app
    from gpufleet.core import broker as redis_broker

    broker = InProcessBroker()
    monkeypatch.setattr(app, "send_task", broker.send_task)
    monkeypatch.setattr(redis_broker, "client", lambda: broker)
    return broker
