"""The history's housekeeping (gpufleet.fleet.history): each bucket rolled up once,
after its grace, into five-minute and hourly min/avg/max (one row per node and bucket),
in bounded steps, and each series pruned after its own retention. On SQLite and
PostgreSQL alike; what only PostgreSQL does (partitions) is in test_history_partitions.py."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gpufleet.fleet import history
from gpufleet.fleet.models import Device, DeviceSample, NodeRollup1h, NodeRollup5m
from gpufleet.gpu import rollups
from tests.factories import ingest

REPO = Path(__file__).resolve().parents[2]
GRACE = history.GRACE


@pytest.fixture
def gpu(db) -> Device:
    # Ingested two days back, so its own sample is out of the raw series' way.
    return Device.objects.get(node=ingest("alpha", 1, at=datetime.now(UTC) - timedelta(days=2)))


def _now() -> datetime:
    """A recent whole hour, so the buckets of a test sit where the test says."""
    return timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)


def _sample(device, at, util=None, vram=None, temp=None, watts=None) -> DeviceSample:
    return DeviceSample.objects.create(device=device, collected_at=at, utilization_percent=util, vram_used_mib=vram,
                                       temperature_c=temp, power_draw_w=watts)


def _known(figure: float) -> float | None:
    return None if figure != figure else figure


def _rollups(model) -> list[tuple]:
    """(bucket, samples, utilization min, mean, max, temperature mean) of each GPU's rollup."""
    return [(row.bucket, gpu.samples, *map(_known, gpu.figures[3:6]), _known(gpu.figures[7]))
            for row in model.objects.order_by("bucket", "node_id") for gpu in row.gpus()]


def _rollup(model, device, bucket, samples=1) -> None:
    model.objects.create(node=device.node, bucket=bucket, figures=rollups.pack([(device.pk, samples, [1.0] * 12)]))


def test_it_rolls_finished_five_minute_buckets_into_min_avg_max(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    _sample(gpu, t + timedelta(seconds=10), util=10, vram=1000, watts=100.0)
    _sample(gpu, t + timedelta(seconds=100), util=20, vram=3000, watts=200.0)
    _sample(gpu, t + timedelta(seconds=290), util=60, vram=2000, watts=None)
    _sample(gpu, t + timedelta(minutes=5, seconds=10), util=99)  # in a bucket not finished yet
    assert history.roll(now=t + timedelta(minutes=5) + GRACE) == {"5m": 1, "1h": 0}
    assert _rollups(NodeRollup5m) == [(t, 3, 10, 30.0, 60, None)]  # no temperature at all: none, not 0
    row = NodeRollup5m.objects.get()
    (one,) = row.gpus()
    assert one.figures[:3] == (1000, 2000.0, 3000) and one.figures[9:] == (100.0, 150.0, 200.0)
    assert row.node_id == gpu.node_id and one.device_id == gpu.pk and str(row).endswith(", 1 GPU")


def test_a_bucket_is_rolled_once_after_its_grace_counting_a_late_snapshot(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    for second in (0, 30, 60):
        _sample(gpu, t + timedelta(seconds=second), util=30)
    assert history.roll(now=t + timedelta(minutes=5)) == {"5m": 0, "1h": 0}  # still in its grace
    # A snapshot that was in flight at the bucket's end arrives within the grace: it counts.
    _sample(gpu, t + timedelta(seconds=299), util=70)
    assert history.roll(now=t + timedelta(minutes=5) + GRACE)["5m"] == 1
    assert history.roll(now=t + timedelta(minutes=5) + GRACE)["5m"] == 0  # never twice
    assert _rollups(NodeRollup5m) == [(t, 4, 30, 40.0, 70, None)]
    _sample(gpu, t + timedelta(minutes=6), util=50)
    assert history.roll(now=t + timedelta(minutes=10) + GRACE)["5m"] == 1
    assert _rollups(NodeRollup5m) == [(t, 4, 30, 40.0, 70, None), (t + timedelta(minutes=5), 1, 50, 50.0, 50, None)]


def test_a_node_s_gpus_share_one_row_per_bucket(db):
    t = _now()
    node = ingest("octo", 8, at=t - timedelta(days=2))
    other = ingest("solo", 1, at=t - timedelta(days=2))
    devices = list(node.devices.all()) + list(other.devices.all())
    DeviceSample.objects.bulk_create(DeviceSample(device=d, collected_at=t + timedelta(seconds=s), utilization_percent=d.index)
                                     for d in devices for s in (0, 30))
    assert history.roll(now=t + timedelta(minutes=5) + GRACE)["5m"] == 2
    rows = {row.node_id: row.gpus() for row in NodeRollup5m.objects.all()}
    assert [(g.device_id, g.samples, g.figures[4]) for g in rows[node.pk]] == [(d.pk, 2, d.index) for d in
                                                                                sorted(node.devices.all(), key=lambda d: d.pk)]
    assert len(rows[other.pk]) == 1


def test_hours_roll_up_from_the_five_minute_buckets_weighted_by_their_samples(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    # Two collections in the first bucket, one in each of the other eleven.
    _sample(gpu, t + timedelta(seconds=1), util=0, temp=40)
    for minute in range(0, 60, 5):
        _sample(gpu, t + timedelta(minutes=minute, seconds=30), util=12 * (minute // 5), temp=None if minute else 40)
    written = history.roll(now=t + timedelta(hours=1) + GRACE)
    assert written == {"5m": 12, "1h": 1}
    (hour,) = _rollups(NodeRollup1h)
    utils = [0, 0] + [12 * i for i in range(1, 12)]
    assert hour[:3] == (t, 13, 0) and hour[4] == 132
    assert hour[3] == pytest.approx(sum(utils) / 13)
    assert hour[5] == 40.0  # the mean of the samples that had a temperature
    assert NodeRollup1h.objects.get().gpus()[0].figures[8] == 40
    assert history.roll(now=t + timedelta(hours=1, minutes=30)) == {"5m": 0, "1h": 0}  # each hour once


def test_a_stopped_beat_catches_up_a_bounded_step_at_a_time(gpu):
    t = _now() - timedelta(hours=3)
    DeviceSample.objects.filter(device=gpu).delete()
    DeviceSample.objects.bulk_create(
        DeviceSample(device=gpu, collected_at=t + timedelta(minutes=minute), utilization_percent=1) for minute in range(180)
    )
    now = t + timedelta(hours=3) + GRACE
    assert [history.roll(now=now)["5m"] for _ in range(4)] == [history.ROLL_AT_MOST] * 3 + [0]
    assert [g.samples for g, in (row.gpus() for row in NodeRollup5m.objects.all())] == [5] * 36


def test_a_silence_longer_than_a_run_s_step_is_skipped(gpu):
    t = _now() - timedelta(hours=3)
    DeviceSample.objects.filter(device=gpu).delete()
    _sample(gpu, t, util=1)
    _sample(gpu, t + timedelta(hours=2), util=2)
    now = t + timedelta(hours=3)
    assert [history.roll(now=now)["5m"] for _ in range(2)] == [2, 0]
    assert [row[4] for row in _rollups(NodeRollup5m)] == [1, 2]


def test_history_written_into_the_past_is_rolled_between_two_times_keeping_what_was_rolled(gpu):
    t = _now() - timedelta(hours=2)
    DeviceSample.objects.filter(device=gpu).delete()
    late = Device.objects.get(node=ingest("late", 1, at=t - timedelta(days=2)))
    _sample(gpu, t, util=1)
    history.roll(now=t + timedelta(hours=2))
    _sample(gpu, t + timedelta(seconds=30), util=3)  # too late: its bucket was rolled
    _sample(late, t, util=2)  # written into the past, after the beat rolled its bucket
    assert history.roll(now=t + timedelta(hours=2)) == {"5m": 0, "1h": 0}
    assert history.roll_between(t, t + timedelta(hours=2)) == {"5m": 2, "1h": 2}
    assert [row[4] for row in _rollups(NodeRollup5m)] == [1, 2]
    assert [row[4] for row in _rollups(NodeRollup1h)] == [1, 2]


def test_nothing_to_roll_writes_nothing(db):
    assert history.roll() == {"5m": 0, "1h": 0}


def test_each_series_is_pruned_after_its_own_retention(gpu, settings):
    settings.GPUFLEET_HISTORY_RAW_HOURS = 6
    settings.GPUFLEET_HISTORY_5M_DAYS = 7
    settings.GPUFLEET_HISTORY_HOURLY_DAYS = 90
    now = timezone.now()
    history.prepare_partitions(now=now, since=now - timedelta(days=200))
    DeviceSample.objects.filter(device=gpu).delete()
    _sample(gpu, now - timedelta(hours=9), util=1)
    _sample(gpu, now - timedelta(minutes=30), util=2)
    for model, old, kept in ((NodeRollup5m, timedelta(days=10), timedelta(days=2)),
                             (NodeRollup1h, timedelta(days=120), timedelta(days=30))):
        for age in (old, kept):
            _rollup(model, gpu, now - age)
    pruned = {p.series: p for p in history.prune(now=now)}
    assert set(pruned) == {"raw", "5m", "1h"}
    assert list(DeviceSample.objects.values_list("utilization_percent", flat=True)) == [2]
    assert NodeRollup5m.objects.get().bucket == now - timedelta(days=2)
    assert NodeRollup1h.objects.get().bucket == now - timedelta(days=30)


def test_a_deleted_node_takes_its_rollups_along(gpu):
    _rollup(NodeRollup5m, gpu, _now())
    _rollup(NodeRollup1h, gpu, _now())
    gpu.node.delete()
    assert (DeviceSample.objects.count(), NodeRollup5m.objects.count(), NodeRollup1h.objects.count()) == (0, 0, 0)


def _settings_in_a_fresh_process(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_HISTORY_")}
    code = ("from gpufleet import settings as s; "
            "print(s.GPUFLEET_HISTORY_RAW_HOURS, s.GPUFLEET_HISTORY_5M_DAYS, s.GPUFLEET_HISTORY_HOURLY_DAYS)")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**clean, **env}, capture_output=True, text=True)


def test_retention_settings_have_defaults():
    assert _settings_in_a_fresh_process().stdout.split() == ["6.0", "7.0", "90.0"]
    assert _settings_in_a_fresh_process(GPUFLEET_HISTORY_RAW_HOURS="3").stdout.split()[0] == "3.0"
    bad = _settings_in_a_fresh_process(GPUFLEET_HISTORY_5M_DAYS="a week")
    assert bad.returncode != 0 and "GPUFLEET_HISTORY_5M_DAYS='a week' is not a number" in bad.stderr
