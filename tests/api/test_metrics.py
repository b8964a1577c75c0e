"""/metrics: the latest state in the Prometheus text format, for a token, a viewer or an
allowed address only; two queries whatever the fleet's size; ingest counters from
record_snapshot and record_batch, one batch observation per batch; the broker's queue depth, or broker_up 0 when it cannot be reached."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api.metrics import render
from gpufleet.api.models import ApiToken
from gpufleet.fleet.models import Device
from gpufleet.ingest.metrics import record_batch, record_snapshot

pytestmark = pytest.mark.django_db


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _token_client(user) -> Client:
    _, secret = ApiToken.issue(user, "prometheus", "read")
    return Client(headers={"authorization": f"Bearer {secret}"})


def test_it_serves_gpu_figures_to_a_read_token(viewer, make_fleet):
    make_fleet(1, gpus=2)
    response = _token_client(viewer).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = _samples(response.content.decode())
    device = Device.objects.get(node__name="node-00", index=1)
    labels = tuple(sorted({"node": "node-00", "gpu": "1", "uuid": device.uuid, "model": device.name}.items()))
    assert samples[("gpufleet_gpu_utilization_percent", labels)] == 35
    assert samples[("gpufleet_gpu_memory_used_bytes", labels)] == 1024 * 1024 * 1024
    assert samples[("gpufleet_node_online", (("node", "node-00"),))] == 1
    assert samples[("gpufleet_node_health", (("node", "node-00"),))] in (0, 1, 2)


def test_it_refuses_without_credentials_or_with_a_bad_token(outsider):
    anonymous = Client().get("/metrics")
    assert anonymous.status_code == 401
    assert "GPUFLEET_METRICS_ALLOWED_ADDRESSES" in anonymous.content.decode()
    assert Client(headers={"authorization": "Bearer nope"}).get("/metrics").status_code == 401
    assert _token_client(outsider).get("/metrics").status_code == 403


def test_it_lets_a_viewer_session_in_but_not_an_outsider(viewer_client, outsider):
    assert viewer_client.get("/metrics").status_code == 200
    client = Client()
    client.force_login(outsider)
    assert client.get("/metrics").status_code == 403


def test_it_lets_allowed_addresses_in_without_a_token(settings):
    settings.GPUFLEET_METRICS_ALLOWED_ADDRESSES = ["10.0.0.0/8", "192.0.2.7"]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="192.0.2.7").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="192.0.2.8").get("/metrics").status_code == 401


@pytest.mark.parametrize("nodes", [1, 5])
def test_it_reads_the_fleet_in_two_queries(nodes, make_fleet, django_assert_num_queries):
    make_fleet(nodes, gpus=3)
    with django_assert_num_queries(3):  # two for the fleet, one for the alert channels
        text = render().decode()
    assert text.count("gpufleet_gpu_utilization_percent{") == nodes * 3


def test_it_exports_ecc_and_xid_counts(make_fleet):
    make_fleet(1, gpus=1)
    device = Device.objects.get()
    device.health = {**device.health, "ecc_uncorrected_volatile": 3,
                     "xid_errors": [{"xid": 79, "count": 2, "last_seen": None, "description": "fell off the bus"}]}
    device.save()
    samples = _samples(render().decode())
    gpu = {"node": "node-00", "gpu": "0", "uuid": device.uuid, "model": device.name}
    assert samples[("gpufleet_gpu_ecc_errors_uncorrected", tuple(sorted(gpu.items())))] == 3
    assert samples[("gpufleet_gpu_xid_errors", tuple(sorted({**gpu, "xid": "79"}.items())))] == 2


def _growth(before: dict, after: dict):
    def grew(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)
    return grew


def test_it_counts_what_record_snapshot_and_record_batch_record():
    before = _samples(render().decode())
    record_snapshot("accepted")
    record_snapshot("rejected")
    record_batch(2, 0.02)
    grew = _growth(before, _samples(render().decode()))
    assert grew("gpufleet_ingest_snapshots_total", (("outcome", "accepted"),)) == 1
    assert grew("gpufleet_ingest_snapshots_total", (("outcome", "rejected"),)) == 1
    assert grew("gpufleet_ingest_batch_seconds_count") == 1
    assert grew("gpufleet_ingest_batch_size_count") == 1 and grew("gpufleet_ingest_batch_size_sum") == 2
    with pytest.raises(ValueError, match="unknown ingest outcome 'lost'"):
        record_snapshot("lost")


def test_a_batch_of_many_snapshots_is_one_batch_observation_of_its_size():
    from gpufleet.ingest import stream
    from tests.factories import agent_entry, snapshot

    entries = [agent_entry(snapshot(f"node-{n:02}", 1)) for n in range(50)]
    before = _samples(render().decode())
    assert stream.ingest_entries(entries) == ["accepted"] * 50
    samples = _samples(render().decode())
    grew = _growth(before, samples)
    assert grew("gpufleet_ingest_snapshots_total", (("outcome", "accepted"),)) == 50
    assert grew("gpufleet_ingest_batch_seconds_count") == 1
    assert grew("gpufleet_ingest_batch_size_count") == 1 and grew("gpufleet_ingest_batch_size_sum") == 50
    # Counted in the bucket of batches of 50 and over, not in the one below.
    assert grew("gpufleet_ingest_batch_size_bucket", (("le", "50.0"),)) == 1
    assert grew("gpufleet_ingest_batch_size_bucket", (("le", "20.0"),)) == 0
    # The time-per-snapshot histogram, which held each batch's time once per snapshot, is gone.
    assert not any(name.startswith("gpufleet_ingest_seconds") for name, _ in samples)


def test_it_still_answers_when_the_broker_is_unreachable(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    samples = _samples(render().decode())
    assert samples[("gpufleet_broker_up", ())] == 0
    assert not any(name == "gpufleet_broker_queue_depth" for name, _ in samples)


def test_the_ingest_consumer_counts_each_snapshot_it_handles():
    from gpufleet.ingest import stream
    from tests.factories import agent_entry, snapshot

    before = _samples(render().decode())
    good = agent_entry(snapshot("alpha", 1))
    assert stream.ingest_entries([good]) == ["accepted"]
    assert stream.ingest_entries([good]) == ["stale"]
    after = _samples(render().decode())
    for outcome in ("accepted", "stale"):
        key = ("gpufleet_ingest_snapshots_total", (("outcome", outcome),))
        assert after.get(key, 0) - before.get(key, 0) == 1


def test_label_values_with_quotes_backslashes_and_newlines_read_back_as_stored(make_fleet):
    make_fleet(1, gpus=1)
    model = 'NVIDIA "H200" \\ rev\n2'
    Device.objects.filter(node__name="node-00").update(name=model)
    families = {f.name: f for f in text_string_to_metric_families(render().decode())}
    (sample,) = families["gpufleet_gpu_utilization_percent"].samples
    assert sample.labels["model"] == model
    # Each family comes once, with its HELP and TYPE, whatever order the rows came in.
    assert families["gpufleet_gpu_utilization_percent"].type == "gauge"
    assert families["gpufleet_node_health"].documentation.startswith("The node's worst finding")


def test_it_shows_refusals_per_reason_and_per_node_only_for_recent_ones(make_fleet, django_assert_num_queries):
    from datetime import timedelta

    from django.utils import timezone

    from gpufleet.fleet.models import Refusal
    from gpufleet.ingest.refusals import count_refusals

    make_fleet(3)
    count_refusals({("node-00", Refusal.OVER_CAP): 7, ("junk", Refusal.UNKNOWN_NODE): 2})
    count_refusals({("node-01", Refusal.OLD_KEY): 1}, now=timezone.now() - timedelta(days=2))
    with django_assert_num_queries(3):  # two for the fleet, one for the alert channels
        samples = _samples(render().decode())
    assert samples[("gpufleet_node_refused_messages", (("node", "node-00"),))] == 7
    refused = {labels for name, labels in samples if name == "gpufleet_node_refused_messages"}
    assert refused == {(("node", "node-00"),)}, "node-01's refusals are old, node-02 has none"
    assert samples[("gpufleet_ingest_refused_total", (("reason", "over-cap"),))] >= 7
    assert samples[("gpufleet_ingest_refused_total", (("reason", "unknown-node"),))] >= 2
