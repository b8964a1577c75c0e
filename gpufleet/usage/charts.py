"""The Usage page's bar chart: GPU-hours reserved beside GPU-hours used, one pair of
horizontal bars per group, as SVG geometry the template draws (no JavaScript, no
style attribute: sizes are attributes, colours are classes in app.css).

Pure Python (no Django): the view passes each group's label and figures in."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

WIDTH = 760
LABEL_WIDTH = 210  # the group names, left of the bars
VALUE_WIDTH = 70  # the figures, right of the longest bar
PITCH = 26  # one group's height: two bars and the gap below them
BAR = 9
AXIS = 22  # below the bars: the scale's figures
TOP_GROUPS = 12
LABEL_CHARS = 30


@dataclass(frozen=True)
class Bar:
    """One group's two bars, placed."""

    label: str  # cut to fit
    title: str  # the whole name and figures, for hover and screen readers
    text_y: str
    reserved_y: str
    reserved_width: str
    reserved: str
    used_y: str
    used_width: str
    used: str
    reserved_text_x: str
    used_text_x: str
    reserved_text_y: str
    used_text_y: str


@dataclass(frozen=True)
class Tick:
    x: str
    text: str


@dataclass(frozen=True)
class BarChart:
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    height: int
    axis_y: int
    width: int = WIDTH
    label_width: int = LABEL_WIDTH
    bar_height: int = BAR
    shown: int = 0  # groups drawn
    total: int = 0  # groups there were

    @property
    def plot_width(self) -> int:
        return self.width - self.label_width - VALUE_WIDTH


def bar_chart(groups: Iterable[tuple[str, float, float]], total: int | None = None,
              top_groups: int = TOP_GROUPS) -> BarChart | None:
    """The chart of the first `top_groups` of `groups` ((label, reserved, used), in
    GPU-hours), on one scale from 0 to a round figure at or above the largest; None
    when there is nothing to draw."""
    shown = list(groups)[:top_groups]
    largest = max((max(reserved, used) for _, reserved, used in shown), default=0.0)
    if largest <= 0:
        return None
    top = _round_up(largest)
    plot = WIDTH - LABEL_WIDTH - VALUE_WIDTH
    bars = []
    for i, (label, reserved, used) in enumerate(shown):
        y = 4 + i * PITCH
        widths = [plot * max(value, 0.0) / top for value in (reserved, used)]
        bars.append(Bar(
            label=label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…",
            title=f"{label}: {_hours(reserved)} GPU-h reserved, {_hours(used)} GPU-h used",
            text_y=f"{y + BAR + 3:.0f}",
            reserved_y=f"{y:.0f}",
            reserved_width=f"{widths[0]:.1f}",
            reserved=_hours(reserved),
            used_y=f"{y + BAR + 1:.0f}",
            used_width=f"{widths[1]:.1f}",
            used=_hours(used),
            reserved_text_x=f"{LABEL_WIDTH + widths[0] + 4:.1f}",
            used_text_x=f"{LABEL_WIDTH + widths[1] + 4:.1f}",
            reserved_text_y=f"{y + BAR - 1:.0f}",
            used_text_y=f"{y + 2 * BAR:.0f}",
        ))
    axis_y = 4 + len(shown) * PITCH
    ticks = tuple(Tick(f"{LABEL_WIDTH + plot * share:.1f}", _hours(top * share)) for share in (0, 0.5, 1))
    return BarChart(tuple(bars), ticks, axis_y + AXIS, axis_y, shown=len(shown),
                    total=len(shown) if total is None else total)


def _round_up(value: float) -> float:
    """The first of 1, 2, 5 times a power of ten at or above `value`: a scale whose
    halves are round figures."""
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power  # pragma: no cover - the loop ends at 10 times the power


def _hours(value: float) -> str:
    """GPU-hours as the chart prints them: whole hours from 100 up, else one decimal."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}".rstrip("0").rstrip(".") or "0"
