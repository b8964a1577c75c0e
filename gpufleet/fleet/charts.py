"""Small history charts for the node page, as SVG polyline point lists.

Pure Python (no Django): the node page passes one GPU's samples in, the template
draws the returned points inside an <svg>. Samples are bucketed to one point per
horizontal pixel step (the bucket's peak, so short spikes stay visible), and a
missing value or a long silence breaks the line instead of drawing a slope
across time the node did not report."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

WIDTH, HEIGHT, PAD = 240, 48, 2
BUCKETS = 120
MAX_GAP = timedelta(minutes=15)


@dataclass(frozen=True)
class Sample:
    at: datetime
    vram_used_mib: int | None
    utilization_percent: int | None


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

    @property
    def empty(self) -> bool:
        return not (self.vram or self.util)


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
    peaks: dict[int, float] = {}
    seen: dict[int, datetime] = {}
    broken: set[int] = set()  # buckets that hold a missing value
    for at, value in points:
        offset = (at - start).total_seconds()
        if offset < 0 or offset > span:
            continue
        bucket = min(buckets - 1, int(offset / span * buckets))
        if value is None:
            broken.add(bucket)
            continue
        peaks[bucket] = max(value, peaks.get(bucket, value))
        seen[bucket] = max(at, seen.get(bucket, at))

    step = width / buckets
    runs: list[list[tuple[float, float]]] = []
    previous: int | None = None
    for bucket in sorted(peaks):
        gap = previous is not None and (
            any(b in broken for b in range(previous + 1, bucket))
            or (bucket - previous) * span / buckets > max_gap.total_seconds()
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


def gpu_chart(samples: Sequence[Sample], vram_total_mib: int | None, end: datetime, hours: float = 24) -> Chart:
    """The chart of one GPU over the `hours` before `end`."""
    start = end - timedelta(hours=hours)
    vram = [s.vram_used_mib for s in samples if s.vram_used_mib is not None]
    util = [s.utilization_percent for s in samples if s.utilization_percent is not None]
    vram_top = vram_total_mib or max(vram, default=0)
    return Chart(
        start=start,
        end=end,
        vram=segments(((s.at, s.vram_used_mib) for s in samples), start, end, float(vram_top or 0)),
        util=segments(((s.at, s.utilization_percent) for s in samples), start, end, 100.0),
        samples=len(samples),
        vram_peak_mib=max(vram, default=None),
        util_peak=max(util, default=None),
    )
