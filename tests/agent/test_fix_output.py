"""A fix's output goes to the job as the command printed it, cleaned as snapshot text
is: a NUL byte (which PostgreSQL refuses to store) no longer loses the output and
leaves the job to expire."""

from __future__ import annotations

import pytest

from gpufleet import wire
from gpufleet.agent import tasks as agent
from gpufleet.fleet import credentials
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import ingest, snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha_agent(settings, monkeypatch, stream_outbox):
    """The agent of node alpha, enrolled, allowing the cdi fix; what it sends is kept."""
    key = credentials.enroll("alpha")
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_AGENT_KEY = "alpha", str(key)
    settings.GPUFLEET_AGENT_FIXES = ["cdi"]
    monkeypatch.setattr(agent, "snapshot_this_host", lambda: snapshot("alpha", 2, fixes=["cdi"]))
    return stream_outbox


def test_a_fix_printing_a_nul_byte_finishes_with_its_output(fake_host, alpha_agent):
    fake_host.ctk_text(stdout=b"INFO Generated CDI spec\x00with 8 devices\n", stderr=b"warn\x00\x07ing\n")
    job = Job.objects.create(node=ingest("alpha", 2, fixes=["cdi"]), kind=JobKind.FIX, fix_code="cdi")
    agent.apply_fix.run(job.pk, "cdi", auth=credentials.sign_for_agent("alpha", wire.APPLY_FIX_TASK, [job.pk, "cdi"]))

    assert [status for _, status, *_ in alpha_agent.payloads(wire.PROGRESS)] == ["running", "done"]
    # Delivered as the ingest consumer would: the signatures hold.
    assert alpha_agent.deliver() == ["progress", "progress", "accepted"]
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    assert job.output == (
        "$ nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml\n"
        "INFO Generated CDI spec with 8 devices\n"
        "warn  ing"
    )
