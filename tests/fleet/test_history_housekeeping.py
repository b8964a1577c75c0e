"""The history's housekeeping (gpufleet.fleet.history): finished buckets rolled up
into five-minute and hourly min/avg/max, idempotently, in bounded steps, and each
series pruned after its own retention. On SQLite and PostgreSQL alike; what only
PostgreSQL does (partitions) is in test_history_partitions.py."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gpufleet.fleet import history
from gpufleet.fleet.models import Device, DeviceSample, DeviceSample1h, DeviceSample5m
from tests.factories import ingest

REPO = Path(__file__).resolve().parents[2]


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


def _rollups(model) -> list[tuple]:
    return list(model.objects.order_by("bucket").values_list(
        "bucket", "samples", "utilization_percent_min", "utilization_percent_avg", "utilization_percent_max",
        "temperature_c_avg"))


def test_it_rolls_finished_five_minute_buckets_into_min_avg_max(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    _sample(gpu, t + timedelta(seconds=10), util=10, vram=1000, watts=100.0)
    _sample(gpu, t + timedelta(seconds=100), util=20, vram=3000, watts=200.0)
    _sample(gpu, t + timedelta(seconds=290), util=60, vram=2000, watts=None)
    _sample(gpu, t + timedelta(minutes=5, seconds=10), util=99)  # in a bucket not finished yet
    assert history.roll(now=t + timedelta(minutes=6)) == {"5m": 1, "1h": 0}
    assert _rollups(DeviceSample5m) == [(t, 3, 10, 30.0, 60, None)]  # no temperature at all: none, not 0
    row = DeviceSample5m.objects.get()
    assert (row.vram_used_mib_min, row.vram_used_mib_avg, row.vram_used_mib_max) == (1000, 2000.0, 3000)
    assert (row.power_draw_w_min, row.power_draw_w_avg, row.power_draw_w_max) == (100.0, 150.0, 200.0)
    assert row.device_id == gpu.pk and str(row).endswith(", 3 samples")


def test_rolling_again_rewrites_buckets_and_never_double_counts(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    for second in (0, 30, 60):
        _sample(gpu, t + timedelta(seconds=second), util=30)
    history.roll(now=t + timedelta(minutes=5))
    history.roll(now=t + timedelta(minutes=5))
    assert _rollups(DeviceSample5m) == [(t, 3, 30, 30.0, 30, None)]
    # A snapshot that was in flight at the bucket's end arrives: the next run counts it.
    _sample(gpu, t + timedelta(seconds=299), util=70)
    _sample(gpu, t + timedelta(minutes=6), util=50)
    history.roll(now=t + timedelta(minutes=10))
    assert _rollups(DeviceSample5m) == [(t, 4, 30, 40.0, 70, None), (t + timedelta(minutes=5), 1, 50, 50.0, 50, None)]


def test_hours_roll_up_from_the_five_minute_buckets_weighted_by_their_samples(gpu):
    t = _now()
    DeviceSample.objects.filter(device=gpu).delete()
    # Two collections in the first bucket, one in each of the other eleven.
    _sample(gpu, t + timedelta(seconds=1), util=0, temp=40)
    for minute in range(0, 60, 5):
        _sample(gpu, t + timedelta(minutes=minute, seconds=30), util=12 * (minute // 5), temp=None if minute else 40)
    written = history.roll(now=t + timedelta(hours=1, minutes=1))
    assert written == {"5m": 12, "1h": 1}
    (hour,) = _rollups(DeviceSample1h)
    utils = [0, 0] + [12 * i for i in range(1, 12)]
    assert hour[:3] == (t, 13, 0) and hour[4] == 132
    assert hour[3] == pytest.approx(sum(utils) / 13)
    assert hour[5] == 40.0  # the mean of the samples that had a temperature
    assert DeviceSample1h.objects.get().temperature_c_max == 40


def test_a_stopped_beat_catches_up_a_bounded_step_at_a_time(gpu):
    t = _now() - timedelta(hours=3)
    DeviceSample.objects.filter(device=gpu).delete()
    DeviceSample.objects.bulk_create(
        DeviceSample(device=gpu, collected_at=t + timedelta(minutes=minute), utilization_percent=1) for minute in range(180)
    )
    now = t + timedelta(hours=3)
    assert history.roll(now=now)["5m"] == history.ROLL_AT_MOST
    # The next run rewrites the last bucket it rolled and adds twelve more.
    assert history.roll(now=now)["5m"] == history.ROLL_AT_MOST + 1
    history.roll(now=now)
    assert DeviceSample5m.objects.count() == 36 and DeviceSample5m.objects.filter(samples=5).count() == 36
    assert history.roll(now=now)["5m"] == 1  # caught up: only the last bucket, again


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
    for model, old, kept in ((DeviceSample5m, timedelta(days=10), timedelta(days=2)),
                             (DeviceSample1h, timedelta(days=120), timedelta(days=30))):
        for age in (old, kept):
            model.objects.create(device=gpu, bucket=now - age, samples=1)
    pruned = {p.series: p for p in history.prune(now=now)}
    assert set(pruned) == {"raw", "5m", "1h"}
    assert list(DeviceSample.objects.values_list("utilization_percent", flat=True)) == [2]
    assert DeviceSample5m.objects.get().bucket == now - timedelta(days=2)
    assert DeviceSample1h.objects.get().bucket == now - timedelta(days=30)


def test_a_deleted_gpu_takes_its_rollups_along(gpu):
    DeviceSample5m.objects.create(device=gpu, bucket=_now(), samples=1)
    DeviceSample1h.objects.create(device=gpu, bucket=_now(), samples=1)
    gpu.delete()
    assert (DeviceSample.objects.count(), DeviceSample5m.objects.count(), DeviceSample1h.objects.count()) == (0, 0, 0)


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
