"""gpufleet.fleet.charts: pure SVG polyline points for the node page's history charts."""

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.fleet.charts import HEIGHT, PAD, WIDTH, Sample, gpu_chart, segments

END = datetime(2025, 1, 2, 12, 0, tzinfo=UTC)
START = END - timedelta(hours=24)


def _xy(points: str) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in points.split()]


def test_it_scales_values_into_the_box():
    points = [(START + timedelta(minutes=m), v) for m, v in ((0, 0), (720, 50), (1439, 100))]
    runs = segments(points, START, END, 100, max_gap=timedelta(days=1))
    assert len(runs) == 1
    xy = _xy(runs[0])
    assert [y for _, y in xy] == [HEIGHT - PAD, HEIGHT / 2, PAD]
    assert xy[0][0] < xy[1][0] < xy[2][0] <= WIDTH


def test_it_clips_and_ignores_samples_outside_the_window():
    runs = segments([(START - timedelta(hours=1), 10), (START + timedelta(hours=1), 500), (END + timedelta(hours=1), 10)], START, END, 100)
    assert len(runs) == 1
    assert {y for _, y in _xy(runs[0])} == {float(PAD)}  # 500 clipped to the top; a lone point drawn as a stroke


def test_it_breaks_the_line_at_missing_values_and_long_silences():
    # One bucket is 12 minutes; values in every other bucket, a missing one between.
    points = [(START + timedelta(minutes=24 * i), 50) for i in range(6)]
    assert len(segments(points, START, END, 100, max_gap=timedelta(hours=1))) == 1
    points.append((START + timedelta(minutes=24 * 2 + 12), None))
    assert len(segments(points, START, END, 100, max_gap=timedelta(hours=1))) == 2
    silent = [(START + timedelta(minutes=m), 50) for m in (0, 12, 24, 300, 312)]
    assert len(segments(silent, START, END, 100)) == 2


def test_it_keeps_the_peak_of_each_bucket():
    runs = segments([(START + timedelta(seconds=s), v) for s, v in ((0, 10), (30, 90), (60, 20), (7200, 20))], START, END, 100)
    first_y = _xy(runs[0])[0][1]
    assert first_y == pytest.approx(PAD + (HEIGHT - 2 * PAD) * (1 - 0.9), abs=0.05)


def test_it_draws_nothing_without_data_or_scale():
    assert segments([], START, END, 100) == ()
    assert segments([(START, 5)], START, END, 0) == ()
    assert segments([(START, None)], START, END, 100) == ()


def test_it_builds_a_gpu_chart():
    samples = [Sample(START + timedelta(minutes=10 * i), 1024 * i, i % 100) for i in range(144)]
    chart = gpu_chart(samples, vram_total_mib=143771, end=END)
    assert chart.samples == 144 and not chart.empty
    assert chart.vram_peak_mib == 1024 * 143 and chart.util_peak == 99
    assert chart.start == START
    empty = gpu_chart([], vram_total_mib=None, end=END)
    assert empty.empty and empty.vram_peak_mib is None
