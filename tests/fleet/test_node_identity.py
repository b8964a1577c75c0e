"""Node identity on the central side: a snapshot or job report is written only when
the node it speaks for signed it with its current key (gpufleet.fleet.credentials,
wire.sign / wire.verify); everything else is refused, logged, and writes nothing."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from gpufleet import wire
from gpufleet.audit.models import AuditEntry
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node, NodeCredential
from gpufleet.ingest import tasks
from gpufleet.jobs import tasks as job_tasks
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import agent_auth, ingest, later, signed_ingest, snapshot

pytestmark = pytest.mark.django_db


def _run(snap, auth, job_id=None) -> str:
    return tasks.ingest_message(snap, job_id, auth=auth)


def _signed_by(node: str, snap: dict, job_id=None) -> dict:
    return agent_auth(node, wire.INGEST_TASK, [snap, job_id])


def test_a_snapshot_its_own_node_signed_is_stored():
    assert tasks.ingest_message(**signed_ingest(snapshot("alpha", 2))) == "accepted"
    assert Node.objects.get(name="alpha").gpu_count == 2


def test_an_unsigned_snapshot_is_refused_and_writes_nothing(caplog):
    assert _run(snapshot("alpha", 2), None) == "rejected"
    assert not Node.objects.exists()
    assert "refused a snapshot for node 'alpha': the message is not signed" in caplog.text


def test_a_snapshot_of_node_a_signed_by_node_b_is_refused(caplog):
    ingest("alpha", 2)
    before = Node.objects.get(name="alpha").collected_at
    forged = snapshot("alpha", 8, at=timezone.now() + timedelta(seconds=5))
    assert _run(forged, _signed_by("bravo", forged)) == "rejected"
    alpha = Node.objects.get(name="alpha")
    assert (alpha.collected_at, alpha.gpu_count) == (before, 2)
    assert not Node.objects.filter(name="bravo").exists()
    assert "node 'bravo' signed a snapshot of another node" in caplog.text
    # Someone else's refusal is not shown on alpha: it would let any node paint another failing.
    assert not alpha.findings.filter(code="rejected-snapshot").exists()


def test_a_snapshot_changed_after_signing_is_refused():
    snap = snapshot("alpha", 2)
    auth = _signed_by("alpha", snap)
    snap["devices"][0]["vram_used_mib"] += 1
    assert _run(snap, auth) == "rejected"
    assert not Node.objects.exists()


def test_a_snapshot_sent_as_text_is_stored_as_one_sent_as_the_object_was():
    first = snapshot("alpha", 2)
    text = wire.encode_snapshot(first)
    assert _run(text, _signed_by("alpha", text)) == "accepted"
    assert Node.objects.get(name="alpha").gpu_count == 2
    # Agents of before the text send the object: still taken.
    older_agent = snapshot("alpha", 4, at=later(first))
    assert _run(older_agent, _signed_by("alpha", older_agent)) == "accepted"
    assert Node.objects.get(name="alpha").gpu_count == 4


def test_snapshot_text_changed_after_signing_is_refused():
    text = wire.encode_snapshot(snapshot("alpha", 2))
    auth = _signed_by("alpha", text)
    changed = text.replace('"index":0', '"index":5', 1)
    assert changed != text
    assert _run(changed, auth) == "rejected"
    assert not Node.objects.exists()


def test_snapshot_text_of_node_a_signed_by_node_b_is_refused(caplog):
    text = wire.encode_snapshot(snapshot("alpha", 2))
    assert _run(text, _signed_by("bravo", text)) == "rejected"
    assert not Node.objects.exists()
    assert "node 'bravo' signed a snapshot of another node" in caplog.text


def test_signed_snapshot_text_its_node_sends_in_vain_shows_the_reason_on_the_node():
    ingest("alpha", 2)
    text = wire.encode_snapshot(snapshot("alpha", 2, at=timezone.now() + timedelta(hours=1)))
    assert _run(text, _signed_by("alpha", text)) == "rejected"
    finding = Node.objects.get(name="alpha").findings.get(code="rejected-snapshot")
    assert "is in the future" in finding.message


def test_signed_snapshot_text_that_is_not_json_is_rejected_with_the_reason(caplog):
    text = '{"schema_version": 2, "node": "alpha", '
    assert _run(text, _signed_by("alpha", text)) == "rejected"
    assert not Node.objects.exists()
    assert "snapshot is not JSON" in caplog.text


@pytest.mark.parametrize("broken", [
    {"v": 1, "node": "alpha", "key": 1, "at": "x"},  # no sig
    {"v": 2, "node": "alpha", "key": 1, "at": "x", "sig": "00"},
    {"v": 1, "node": ["alpha"], "key": 1, "at": "x", "sig": "00"},
    "v=1",
])
def test_a_malformed_signature_is_refused(broken, caplog):
    assert _run(snapshot("alpha", 2), broken) == "rejected"
    assert not Node.objects.exists()
    assert "the signature is malformed" in caplog.text


def test_a_node_never_enrolled_is_refused():
    snap = snapshot("ghost", 1)
    # Signed with the key ghost would have, but nobody enrolled it.
    auth = wire.sign(wire.derive_node_key(credentials.settings.GPUFLEET_SIGNING_KEY, "ghost", 1), "ghost",
                     wire.TO_CENTRE, wire.INGEST_TASK, [snap, None])
    assert _run(snap, auth) == "rejected"
    assert not Node.objects.exists()


def test_after_a_rotation_the_old_key_is_refused_and_the_node_page_says_why():
    ingest("alpha", 2)
    old = credentials.enroll("alpha")
    new = credentials.enroll("alpha", rotate=True)
    assert new.generation == old.generation + 1 and new.secret != old.secret
    snap = snapshot("alpha", 2, at=timezone.now() + timedelta(seconds=5))
    stale_auth = wire.sign(old, "alpha", wire.TO_CENTRE, wire.INGEST_TASK, [snap, None])
    assert _run(snap, stale_auth) == "rejected"
    finding = Node.objects.get(name="alpha").findings.get(code="rejected-snapshot")
    assert "has no valid key of generation 1" in finding.message
    assert "manage.py enroll alpha" in finding.fix
    fresh = wire.sign(new, "alpha", wire.TO_CENTRE, wire.INGEST_TASK, [snap, None])
    assert _run(snap, fresh) == "accepted"
    assert not Node.objects.get(name="alpha").findings.filter(code="rejected-snapshot").exists()


def test_a_revoked_node_is_refused_until_enrolled_again():
    key = credentials.enroll("alpha")
    assert credentials.revoke("alpha")
    snap = snapshot("alpha", 2)
    assert _run(snap, wire.sign(key, "alpha", wire.TO_CENTRE, wire.INGEST_TASK, [snap, None])) == "rejected"
    again = credentials.enroll("alpha")
    assert again.generation == key.generation + 1
    assert _run(snap, wire.sign(again, "alpha", wire.TO_CENTRE, wire.INGEST_TASK, [snap, None])) == "accepted"
    actions = list(AuditEntry.objects.filter(target="alpha").order_by("pk").values_list("action", flat=True))
    assert actions == ["node.enroll", "node.revoke_key", "node.rotate_key"]


@override_settings(GPUFLEET_ACCEPT_UNSIGNED=True)
def test_unsigned_snapshots_are_stored_only_while_the_upgrade_switch_is_on(caplog):
    assert _run(snapshot("alpha", 2), None) == "accepted"
    assert "accepted an unsigned" in caplog.text
    # A signature that is there must still be right.
    snap = snapshot("bravo", 1)
    assert _run(snap, _signed_by("charlie", snap)) == "rejected"


def test_the_database_holds_no_secret_and_another_signing_key_makes_other_keys():
    key = credentials.enroll("alpha")
    assert {f.name for f in NodeCredential._meta.fields} == {"id", "name", "generation", "issued_at", "revoked_at"}
    assert wire.derive_node_key(b"another site", "alpha", key.generation) != key


def test_a_node_reports_progress_only_on_its_own_jobs(caplog):
    alpha, bravo = ingest("alpha", 1), ingest("bravo", 1)
    job = Job.objects.create(node=alpha, kind=JobKind.DIAGNOSE)
    args = [job.pk, "failed", "", "forged"]
    assert not job_tasks.job_progress.run(*args, auth=agent_auth("bravo", wire.JOB_PROGRESS_TASK, args))
    assert not job_tasks.job_progress.run(*args, auth=None)
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert "refused progress of job" in caplog.text
    args = [job.pk, "running", "", ""]
    assert job_tasks.job_progress.run(*args, auth=agent_auth("alpha", wire.JOB_PROGRESS_TASK, args))
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    assert bravo.jobs.count() == 0


def test_a_snapshot_does_not_finish_another_nodes_job():
    alpha = ingest("alpha", 1)
    job = Job.objects.create(node=alpha, kind=JobKind.DIAGNOSE)
    assert tasks.ingest_message(**signed_ingest(snapshot("bravo", 1), job.pk)) == "accepted"
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


def test_enroll_prints_the_agents_settings_lines_and_rotates_and_revokes():
    out = StringIO()
    call_command("enroll", "gpu-017", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "GPUFLEET_NODE_NAME=gpu-017"
    key = wire.NodeKey.parse(lines[1].removeprefix("GPUFLEET_AGENT_KEY="))
    assert key == credentials.enroll("gpu-017")  # the same key again, not a new one
    out = StringIO()
    call_command("enroll", "gpu-017", "--rotate", stdout=out)
    assert wire.NodeKey.parse(out.getvalue().splitlines()[1].split("=", 1)[1]).generation == 2
    call_command("enroll", "gpu-017", "--revoke", stdout=StringIO(), stderr=StringIO())
    out = StringIO()
    call_command("enroll", "--list", stdout=out)
    assert out.getvalue().startswith("gpu-017 (revoked ")
    with pytest.raises(CommandError, match="is not enrolled"):
        call_command("enroll", "nobody", "--revoke")
    with pytest.raises(CommandError, match="give the node's name"):
        call_command("enroll", "bad name; rm -rf /")
