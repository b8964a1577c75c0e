"""Small history charts for the node page, as SVG polyline point lists.

Pure Python (no Django): the node page passes one GPU's samples in, the template
draws the returned points inside an <svg>. A sample is one collection or, for the
longer ranges, a rollup of many (gpufleet/fleet/history.py): the line follows its
mean, the peaks and hover figures its maximum. Samples are bucketed to one point
per horizontal pixel step (the bucket's highest, so short spikes stay visible),
and a missing value or a long silence breaks the line instead of drawing a slope
across time the node did not report."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from gpufleet.gpu import rollups

WIDTH, HEIGHT, PAD = 240, 48, 2
BUCKETS = 120
MAX_GAP = timedelta(minutes=15)
# The ranges the node page offers, by their URL value.
RANGES = {"1h": 1, "6h": 6, "24h": 24, "7d": 24 * 7}
DEFAULT_RANGE = "24h"
# Hover columns per chart: each carries the figures of its stretch of time in a <title>.
HOVER_COLUMNS = 24


class Sample(NamedTuple):
    """One point of a GPU's history: one collection (`count` 1, its values are also
    its peaks) or a rollup of `count` collections (the values are their means, the
    `*_max` fields their maxima). A tuple: a page builds thousands."""

    at: datetime
    vram_used_mib: float | None
    utilization_percent: float | None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    count: int = 1
    vram_used_mib_max: int | None = None
    utilization_percent_max: int | None = None
    temperature_c_max: int | None = None
    power_draw_w_max: float | None = None

    def peak(self, measure: str):
        """The highest value of `measure` ("vram_used_mib" ...) this point stands for."""
        highest = getattr(self, _HIGHEST[measure])
        return getattr(self, measure) if highest is None else highest


# What a sample measures (in the rollups' order), and the field of each one's maximum in a rollup.
MEASURES = rollups.MEASURES
_HIGHEST = {measure: f"{measure}_max" for measure in MEASURES}


@dataclass(frozen=True)
class Column:
    """A hover target: a slice of the chart and what the GPU did in it."""

    x: float
    width: float
    title: str

    # The SVG's attributes: formatted here, where the template's floatformat (a Decimal
    # each) was the dearest filter of the node page, 2 per column, 25 columns a GPU.
    @property
    def svg_x(self) -> str:
        return f"{self.x:.1f}"

    @property
    def svg_width(self) -> str:
        return f"{self.width:.1f}"


@dataclass(frozen=True)
class Chart:
    """What the template draws: polyline segments for VRAM (as a share of the GPU's
    total) and utilization, both on a 0..100 % scale, plus the figures for its label."""

    start: datetime
    end: datetime
    vram: tuple[str, ...]
    util: tuple[str, ...]
    samples: int
    vram_peak_mib: int | None
    util_peak: int | None
    width: int = WIDTH
    height: int = HEIGHT
    # Temperature on a 0..100 °C scale, power as a share of the GPU's limit.
    temperature: tuple[str, ...] = ()
    power: tuple[str, ...] = ()
    temperature_peak: int | None = None
    power_peak_w: float | None = None
    columns: tuple[Column, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.vram or self.util or self.temperature or self.power)


def segments(
    points: Iterable[tuple[datetime, float | None]],
    start: datetime,
    end: datetime,
    top: float,
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
    buckets: int = BUCKETS,
    max_gap: timedelta = MAX_GAP,
) -> tuple[str, ...]:
    """SVG `points` strings, one per unbroken run of values between `start` and `end`,
    scaled so 0 is the bottom and `top` the top edge (values above are clipped)."""
    span = (end - start).total_seconds()
    if span <= 0 or top <= 0:
        return ()
    placed = [(_bucket(_offset(at, start, span), buckets), value) for at, value in points]
    return _segments(placed, span, top, width=width, height=height, buckets=buckets, max_gap=max_gap)


def _offset(at: datetime, start: datetime, span: float) -> float | None:
    """Where `at` falls, as a share (0..1) of the chart's time; None outside it."""
    offset = (at - start).total_seconds()
    return offset / span if 0 <= offset <= span else None


def _bucket(share: float | None, buckets: int) -> int | None:
    """Which of `buckets` equal slices of the chart a share (0..1) of its time falls in."""
    return None if share is None else min(buckets - 1, int(share * buckets))


def _segments(
    placed: Iterable[tuple[int | None, float | None]],
    span: float,
    top: float,
    *,
    width: int = WIDTH,
    height: int = HEIGHT,
    buckets: int = BUCKETS,
    max_gap: timedelta = MAX_GAP,
) -> tuple[str, ...]:
    if top <= 0:
        return ()
    peaks: dict[int, float] = {}
    broken: set[int] = set()  # buckets that hold a missing value
    for bucket, value in placed:
        if bucket is None:
            continue
        if value is None:
            broken.add(bucket)
            continue
        peaks[bucket] = max(value, peaks.get(bucket, value))

    step = width / buckets
    longest = max_gap.total_seconds()
    runs: list[list[tuple[float, float]]] = []
    previous: int | None = None
    for bucket in sorted(peaks):
        gap = previous is not None and (
            (bucket - previous) * span / buckets > longest
            or (broken and any(b in broken for b in range(previous + 1, bucket)))
        )
        if previous is None or gap:
            runs.append([])
        x = (bucket + 0.5) * step
        y = PAD + (height - 2 * PAD) * (1 - min(peaks[bucket], top) / top)
        runs[-1].append((x, y))
        previous = bucket
    return tuple(_points(run, step) for run in runs)


def _points(run: list[tuple[float, float]], step: float) -> str:
    if len(run) == 1:
        # A lone point would not show as a line: give it a short horizontal stroke.
        x, y = run[0]
        run = [(x - step / 2, y), (x + step / 2, y)]
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in run)


def gpu_chart(
    samples: Sequence[Sample],
    vram_total_mib: int | None,
    end: datetime,
    hours: float = 24,
    power_limit_w: float | None = None,
) -> Chart:
    """The chart of one GPU over the `hours` before `end`."""
    start = end - timedelta(hours=hours)
    # A silence longer than a twentieth of the range breaks the line (15 min in 24 h).
    gap = max(MAX_GAP * hours / 24, timedelta(minutes=2))
    # Each sample's peaks and where it falls, worked out once for the four lines, their
    # peaks and the hover columns, which each went through every sample again.
    peaks = {measure: [s.peak(measure) for s in samples] for measure in MEASURES}
    vram, util, temps, watts = (_known(peaks[measure]) for measure in MEASURES)
    vram_top = vram_total_mib or max(vram, default=0)
    power_top = power_limit_w or max(watts, default=0)
    span = (end - start).total_seconds()
    shares = [_offset(s.at, start, span) if span > 0 else None for s in samples]
    buckets = [_bucket(share, BUCKETS) for share in shares]

    def line(values, top: float) -> tuple[str, ...]:
        return _segments(zip(buckets, values, strict=True), span, float(top or 0), max_gap=gap)

    return Chart(
        start=start,
        end=end,
        vram=line((s.vram_used_mib for s in samples), vram_top),
        util=line((s.utilization_percent for s in samples), 100.0),
        samples=sum(s.count for s in samples),
        vram_peak_mib=max(vram, default=None),
        util_peak=max(util, default=None),
        temperature=line((s.temperature_c for s in samples), 100.0),
        power=line((s.power_draw_w for s in samples), power_top),
        temperature_peak=max(temps, default=None),
        power_peak_w=max(watts, default=None),
        columns=_columns(peaks, shares, start, end),
    )


def _known(values: Iterable) -> list:
    return [value for value in values if value is not None]


def _columns(peaks: dict[str, list], shares: list[float | None], start: datetime, end: datetime) -> tuple[Column, ...]:
    """The hover columns, from each sample's peaks (by measure, in sample order)."""
    members: dict[int, list[int]] = {}
    for i, share in enumerate(shares):
        if share is not None:
            members.setdefault(_bucket(share, HOVER_COLUMNS), []).append(i)
    step = WIDTH / HOVER_COLUMNS
    # Beyond a day a time alone is ambiguous: name the day too ("Tue 06:00").
    when = "%a %H:%M" if end - start > timedelta(hours=24) else "%H:%M"
    columns = []
    for index, found in sorted(members.items()):
        begin = start + (end - start) * index / HOVER_COLUMNS
        vram, util, temps, watts = (_known(peaks[measure][i] for i in found) for measure in MEASURES)
        parts = [f"{begin:{when}}–{begin + (end - start) / HOVER_COLUMNS:{when}}"]
        for label, values, unit in (
            ("VRAM peak", [mib / 1024 for mib in vram], " GiB"),
            ("util. peak", util, " %"),
            ("temp. peak", temps, " °C"),
            ("power peak", watts, " W"),
        ):
            if values:
                parts.append(f"{label} {max(values):.0f}{unit}" if unit != " GiB" else f"{label} {max(values):.1f}{unit}")
        columns.append(Column(index * step, step, " · ".join(parts)))
    return tuple(columns)
