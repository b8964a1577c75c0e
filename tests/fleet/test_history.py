"""The node page's history: 1 h / 6 h / 24 h / 7 d, each read from the coarsest
series that fills it (raw, 5-minute or hourly rollups), with temperature and power
beside VRAM and utilization, axes, and the figures of each stretch on hover."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpufleet.fleet import charts, history
from gpufleet.fleet.charts import HEIGHT, HOVER_COLUMNS, PAD, Sample, gpu_chart
from gpufleet.fleet.models import Device, DeviceSample, NodeRollup5m
from gpufleet.gpu import rollups
from gpufleet.tools.backfill import add_history
from tests.factories import ingest

END = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_a_chart_carries_temperature_and_power_and_hover_figures():
    samples = [Sample(END - timedelta(minutes=5 * i), 40_000, 50, 60 + i % 10, 400.0 + i) for i in range(12)]
    chart = gpu_chart(samples, 80_000, END, hours=1, power_limit_w=700.0)
    assert chart.temperature and chart.power and chart.vram and chart.util
    assert chart.temperature_peak == 69 and chart.power_peak_w == 411.0
    assert 0 < len(chart.columns) <= HOVER_COLUMNS
    last = chart.columns[-1].title
    assert "11:57–12:00" in last and "temp. peak 60 °C" in last and "power peak 400 W" in last and "VRAM peak 39.1 GiB" in last


def test_a_week_s_hover_figures_name_the_day():
    samples = [Sample(END - timedelta(hours=i), 1, 50) for i in range(0, 24 * 7, 6)]
    chart = gpu_chart(samples, 10, END, hours=24 * 7)
    # END is Thursday 3 December 2026, 12:00; the last of 24 columns covers its last 7 hours.
    assert chart.columns[-1].title.startswith("Thu 05:00–Thu 12:00 · ")
    assert chart.columns[0].title.startswith("Thu 12:00–Thu 19:00 · ")


def test_a_silence_breaks_the_line_at_the_range_s_own_scale():
    # Samples 10 minutes apart: one line in 7 days, but broken lines in 1 hour.
    samples = [Sample(END - timedelta(minutes=10 * i), 1, 50) for i in range(6)]
    assert len(gpu_chart(samples, 10, END, hours=24 * 7).util) == 1
    assert len(gpu_chart(samples, 10, END, hours=1).util) == 6


@pytest.mark.django_db
@pytest.mark.parametrize("wanted,shown,hours", [("1h", "1h", 1), ("7d", "7d", 168), ("junk", "24h", 24), ("", "24h", 24)])
def test_the_node_page_offers_each_range(viewer_client, wanted, shown, hours):
    node = ingest("alpha", 1)
    now = timezone.now()
    # A day more than the range shows: the page cuts it at the range's start.
    add_history(list(node.devices.all()), now, hours=hours + 24, every=timedelta(minutes=10))
    html = viewer_client.get(reverse("fleet:node_detail", args=["alpha"]), {"range": wanted}).content.decode()
    assert f'<strong aria-current="true">{shown}</strong>' in html
    # One sample every 10 minutes over the range (the rollups count their samples),
    # give or take the bucket cut at the range's start; plus the ingested one, now.
    shown_samples = int(re.search(rf"{shown}, (\d+) samples", html).group(1))
    assert hours * 6 - 12 <= shown_samples <= hours * 6 + 1
    assert html.count("<title>GPU 0 ") >= 1
    assert 'class="spark-temp"' in html and 'class="spark-power"' in html
    # The y axis says what the height means.
    for label in ("100", "50", "0"):
        assert f'text-anchor="end">{label}</text>' in html


@pytest.mark.parametrize("hours,series", [(1, "raw"), (6, "raw"), (24, "5m"), (24 * 7, "1h")])
def test_each_range_reads_the_coarsest_series_that_fills_it(hours, series):
    assert history.series_for(timedelta(hours=hours)).name == series


def test_a_range_longer_than_a_series_is_kept_reads_a_coarser_one(settings):
    settings.GPUFLEET_HISTORY_RAW_HOURS = 2
    assert history.series_for(timedelta(hours=6)).name == "5m"
    settings.GPUFLEET_HISTORY_5M_DAYS = 0.5
    assert history.series_for(timedelta(hours=24)).name == "1h"


@pytest.mark.django_db
def test_the_24h_chart_reads_five_minute_rollups_then_the_raw_samples_after_them(django_assert_num_queries):
    device = Device.objects.get(node=ingest("alpha", 1, at=datetime.now(UTC) - timedelta(days=2)))
    now = timezone.now()
    add_history([device], now, hours=24, every=timedelta(minutes=1))
    DeviceSample.objects.create(device=device, collected_at=now - timedelta(seconds=20), utilization_percent=100)
    # Spoil the last half hour's rollups: none of them may be read (the raw samples are).
    spoilt = rollups.pack([(device.pk, 5, [0.0] * 12)])
    NodeRollup5m.objects.filter(bucket__gte=now - timedelta(minutes=30)).update(figures=spoilt)
    with django_assert_num_queries(2):
        samples = history.chart_samples([device], now - timedelta(hours=24), now)[device.pk]
    # One point per chart column (12 minutes); one sample a minute.
    assert charts.BUCKETS - 1 <= len(samples) <= charts.BUCKETS + 2
    assert sum(s.count for s in samples) == pytest.approx(24 * 60, abs=5)  # but the bucket cut at the start
    assert [s.at for s in samples] == sorted(s.at for s in samples) and samples[0].at >= now - timedelta(hours=24)
    # The stretch the rollups may not have rolled yet comes from the raw samples (the
    # rollups there were spoilt above, and are not read): it reaches up to now.
    assert samples[-1].peak("utilization_percent") == 100
    raw_from = now - history.tail(history.FIVE_MINUTES) - history.FIVE_MINUTES.resolution
    assert all(s.peak("utilization_percent") > 0 for s in samples if s.at >= raw_from)
    # Older ones come from the rollups: their figures as the raw samples', whole numbers whole.
    old = [s for s in samples if s.at < now - timedelta(hours=1)]
    assert all(isinstance(s.utilization_percent_max, int) and isinstance(s.utilization_percent, float) for s in old)


def test_a_rollup_draws_its_mean_and_reports_its_maximum():
    at = END - timedelta(minutes=30)
    rollup = Sample(at, 40_000.0, 50.0, 60.0, 300.0, count=10, vram_used_mib_max=70_000, utilization_percent_max=90,
                    temperature_c_max=81, power_draw_w_max=650.0)
    chart = gpu_chart([rollup], 80_000, END, hours=1, power_limit_w=700.0)
    assert chart.samples == 10
    assert (chart.util_peak, chart.vram_peak_mib, chart.temperature_peak, chart.power_peak_w) == (90, 70_000, 81, 650.0)
    (line,) = chart.util
    assert {y for _, y in (map(float, p.split(",")) for p in line.split())} == {PAD + (HEIGHT - 2 * PAD) * 0.5}
    assert "util. peak 90 %" in chart.columns[0].title
