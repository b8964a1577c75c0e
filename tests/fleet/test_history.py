"""The node page's history: 1 h / 6 h / 24 h / 7 d, with temperature and power
beside VRAM and utilization, axes, and the figures of each stretch on hover."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpufleet.fleet.charts import HOVER_COLUMNS, Sample, gpu_chart
from gpufleet.fleet.models import Device, DeviceSample
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


def test_a_silence_breaks_the_line_at_the_range_s_own_scale():
    # Samples 10 minutes apart: one line in 7 days, but broken lines in 1 hour.
    samples = [Sample(END - timedelta(minutes=10 * i), 1, 50) for i in range(6)]
    assert len(gpu_chart(samples, 10, END, hours=24 * 7).util) == 1
    assert len(gpu_chart(samples, 10, END, hours=1).util) == 6


@pytest.mark.django_db
@pytest.mark.parametrize("wanted,shown,hours", [("1h", "1h", 1), ("7d", "7d", 168), ("junk", "24h", 24), ("", "24h", 24)])
def test_the_node_page_offers_each_range(viewer_client, wanted, shown, hours):
    node = ingest("alpha", 1)
    device = Device.objects.get(node=node)
    now = timezone.now()
    DeviceSample.objects.bulk_create(
        DeviceSample(device=device, collected_at=now - timedelta(hours=h), vram_used_mib=1, utilization_percent=10,
                     temperature_c=50, power_draw_w=100.0)
        for h in (0.5, 3, 12, 100)
    )
    html = viewer_client.get(reverse("fleet:node_detail", args=["alpha"]), {"range": wanted}).content.decode()
    assert f'<strong aria-current="true">{shown}</strong>' in html
    expected = sum(1 for h in (0.5, 3, 12, 100) if h <= hours) + 1  # plus the ingested sample, now
    assert f"{shown}, {expected} samples" in html
    assert html.count("<title>GPU 0 ") >= 1
    assert 'class="spark-temp"' in html and 'class="spark-power"' in html
