"""Node identity on the central side: a stream entry (a snapshot or a job report) is
taken only when the node it names signed it with its current key (gpufleet.fleet.
credentials, wire.encode_entry / wire.entry_signed_with); everything else is refused,
counted on the node, and writes nothing else."""

from __future__ import annotations

import zlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from gpufleet import wire
from gpufleet.audit.models import AuditEntry
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node, NodeCredential, Refusal
from gpufleet.ingest import stream
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import agent_entry, ingest, ingest_entry, snapshot

pytestmark = pytest.mark.django_db


def _run(*entries) -> list[str]:
    return stream.ingest_entries(list(entries))


def test_a_snapshot_its_own_node_signed_is_stored():
    assert ingest_entry(snapshot("alpha", 2)) == "accepted"
    assert Node.objects.get(name="alpha").gpu_count == 2


def test_a_snapshot_of_node_a_signed_by_node_b_is_refused(caplog):
    ingest("alpha", 2)
    before = Node.objects.get(name="alpha").collected_at
    forged = snapshot("alpha", 8, at=timezone.now() + timedelta(seconds=5))
    assert ingest_entry(forged, node="bravo") == "rejected"
    alpha = Node.objects.get(name="alpha")
    assert (alpha.collected_at, alpha.gpu_count) == (before, 2)
    assert not Node.objects.filter(name="bravo").exists()
    assert "refused an ingest entry of node 'bravo': a snapshot of node 'alpha'" in caplog.text
    # Someone else's refusal is not shown on alpha: it would let any node paint another failing.
    assert not alpha.findings.filter(code="rejected-snapshot").exists() and alpha.refused_total == 0


def test_an_entry_changed_after_signing_is_refused():
    entry = agent_entry(snapshot("alpha", 2))
    text = zlib.decompress(entry[b"body"]).decode()
    changed = text.replace('\\"index\\":0', '\\"index\\":5', 1)
    assert changed != text
    assert _run({**entry, b"body": zlib.compress(changed.encode())}) == ["rejected"]
    assert not Node.objects.exists()
    assert NodeCredential.objects.filter(name="alpha").exists()


def test_an_entry_cannot_pass_for_another_kind_or_node():
    ingest("alpha", 1)
    entry = agent_entry(snapshot("alpha", 2, at=timezone.now() + timedelta(seconds=5)))
    credentials.enroll("bravo")
    assert _run({**entry, b"kind": b"progress"}, {**entry, b"node": b"bravo"}) == ["rejected", "rejected"]
    alpha = Node.objects.get(name="alpha")
    assert alpha.gpu_count == 1 and alpha.refused_last_reason == Refusal.BAD_SIGNATURE


def test_signed_snapshot_text_its_node_sends_in_vain_shows_the_reason_on_the_node():
    ingest("alpha", 2)
    assert ingest_entry(snapshot("alpha", 2, at=timezone.now() + timedelta(hours=1))) == "rejected"
    finding = Node.objects.get(name="alpha").findings.get(code="rejected-snapshot")
    assert "is in the future" in finding.message


def test_signed_snapshot_text_that_is_not_json_is_rejected_with_the_reason(caplog):
    assert ingest_entry('{"schema_version": 2, "node": "alpha", ', node="alpha") == "rejected"
    assert not Node.objects.exists()
    assert "snapshot is not JSON" in caplog.text


@pytest.mark.parametrize("broken", [
    {b"sig": None},  # no sig
    {b"gen": b"0"},
    {b"gen": b"one"},
    {b"sig": b"00"},
    {b"node": b"alpha; rm"},
    {b"kind": b"apply_fix"},
    {b"extra": b"1"},
])
def test_a_malformed_entry_is_refused(broken, caplog):
    entry = {k: v for k, v in {**agent_entry(snapshot("alpha", 2)), **broken}.items() if v is not None}
    assert _run(entry) == ["rejected"]
    assert not Node.objects.exists()
    assert "refused an ingest entry of node ''" in caplog.text


def test_a_node_never_enrolled_is_refused():
    # Signed with the key ghost would have, but nobody enrolled it.
    key = wire.derive_node_key(credentials.settings.GPUFLEET_SIGNING_KEY, "ghost", 1)
    entry = wire.encode_entry(key, "ghost", wire.SNAPSHOT, [wire.encode_snapshot(snapshot("ghost", 1)), None])
    assert _run(entry) == ["rejected"]
    assert not Node.objects.exists()


def test_after_a_rotation_the_old_key_is_refused_and_counted_never_failing_the_node():
    ingest("alpha", 2)
    old = credentials.enroll("alpha")
    new = credentials.enroll("alpha", rotate=True)
    assert new.generation == old.generation + 1 and new.secret != old.secret
    snap = snapshot("alpha", 2, at=timezone.now() + timedelta(seconds=5))
    assert ingest_entry(snap, key=old) == "rejected"
    alpha = Node.objects.get(name="alpha")
    assert not alpha.findings.filter(code="rejected-snapshot").exists()
    assert (alpha.refused_total, alpha.refused_last_reason) == (1, Refusal.OLD_KEY)
    assert ingest_entry(snap, key=new) == "accepted"


def test_a_revoked_node_is_refused_until_enrolled_again():
    key = credentials.enroll("alpha")
    assert credentials.revoke("alpha")
    snap = snapshot("alpha", 2)
    assert ingest_entry(snap, key=key) == "rejected"
    again = credentials.enroll("alpha")
    assert again.generation == key.generation + 1
    assert ingest_entry(snap, key=again) == "accepted"
    actions = list(AuditEntry.objects.filter(target="alpha").order_by("pk").values_list("action", flat=True))
    assert actions == ["node.enroll", "node.revoke_key", "node.rotate_key"]


def test_the_database_holds_no_secret_and_another_signing_key_makes_other_keys():
    key = credentials.enroll("alpha")
    assert {f.name for f in NodeCredential._meta.fields} == {"id", "name", "generation", "issued_at", "revoked_at"}
    assert wire.derive_node_key(b"another site", "alpha", key.generation) != key


def test_a_node_reports_progress_only_on_its_own_jobs():
    alpha, bravo = ingest("alpha", 1), ingest("bravo", 1)
    job = Job.objects.create(node=alpha, kind=JobKind.DIAGNOSE)
    assert _run(agent_entry([job.pk, "failed", "", "forged"], node="bravo")) == ["progress"]
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert _run(agent_entry([job.pk, "running", "", ""], node="alpha")) == ["progress"]
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert bravo.jobs.count() == 0


def test_progress_with_an_unknown_status_is_refused():
    job = Job.objects.create(node=ingest("alpha", 1), kind=JobKind.DIAGNOSE)
    assert _run(agent_entry([job.pk, "exploded", "", ""], node="alpha")) == ["rejected"]
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and Node.objects.get(name="alpha").refused_last_reason == Refusal.MALFORMED


def test_a_snapshot_does_not_finish_another_nodes_job():
    alpha = ingest("alpha", 1)
    job = Job.objects.create(node=alpha, kind=JobKind.DIAGNOSE)
    assert ingest_entry(snapshot("bravo", 1), job.pk) == "accepted"
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


def test_enroll_prints_the_agents_settings_lines_and_rotates_and_revokes():
    # The key only: the broker user it also makes is fleet/test_enroll_broker_user.py's.
    out = StringIO()
    call_command("enroll", "gpu-017", "--key-only", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "GPUFLEET_NODE_NAME=gpu-017"
    key = wire.NodeKey.parse(lines[1].removeprefix("GPUFLEET_AGENT_KEY="))
    assert key == credentials.enroll("gpu-017")  # the same key again, not a new one
    out = StringIO()
    call_command("enroll", "gpu-017", "--rotate", "--key-only", stdout=out)
    assert wire.NodeKey.parse(out.getvalue().splitlines()[1].split("=", 1)[1]).generation == 2
    call_command("enroll", "gpu-017", "--revoke", "--key-only", stdout=StringIO(), stderr=StringIO())
    out = StringIO()
    call_command("enroll", "--list", stdout=out)
    assert out.getvalue().startswith("gpu-017 (revoked ")
    with pytest.raises(CommandError, match="is not enrolled"):
        call_command("enroll", "nobody", "--revoke")
    with pytest.raises(CommandError, match="give the node's name"):
        call_command("enroll", "bad name; rm -rf /")
