"""GPU history rollups, packed one row per node and bucket: the format, and how rollups
combine into longer ones. Pure: gpufleet/fleet/history.py stores and reads them.

A GPU's rollup over a bucket of time is how many samples it had there and twelve
figures: the minimum, mean and maximum of each of MEASURES, in that order (VRAM used
min, mean, max, then utilization's, temperature's, power's). All of one node's GPUs
in one bucket are packed into one bytes value, little-endian, in three runs:

    n device ids      int64    8 n bytes   ascending
    n sample counts   uint32   4 n bytes   in the same order
    n x 12 figures    float32  48 n bytes  GPU after GPU, each GPU's twelve in order

so GPU_BYTES (60) per GPU and n = len(data) // GPU_BYTES. A figure none of the samples
had is NaN; one beyond float32's range is stored as infinite. One row per node instead
of one per GPU shares the row's and the index entries' overhead among the node's GPUs,
and float32 keeps a figure in 4 bytes (its 24 bits of precision are more than a chart
or a mean of readings needs). The same bytes on PostgreSQL and SQLite."""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

MEASURES = ("vram_used_mib", "utilization_percent", "temperature_c", "power_draw_w")
# VRAM, utilization and temperature are read in whole numbers: their minima and maxima are whole too.
# Per measure: its minimum, mean and maximum.
FIGURES = 3 * len(MEASURES)
GPU_BYTES = 8 + 4 + 4 * FIGURES

_NAN = float("nan")


class Gpu(NamedTuple):
    """One GPU's rollup over one bucket, as unpacked."""

    device_id: int
    samples: int
    figures: tuple[float, ...]  # FIGURES of them, NaN where missing

    # Written out, not looped: a node page's chart reads a thousand of these.
    def means(self) -> tuple[float | None, ...]:
        """The mean of each of MEASURES (None where missing)."""
        f = self.figures
        return _known(f[1]), _known(f[4]), _known(f[7]), _known(f[10])

    def maxima(self) -> tuple[float | int | None, ...]:
        """The maximum of each of MEASURES (None where missing; whole for the whole-number readings)."""
        f = self.figures
        return _whole(f[2]), _whole(f[5]), _whole(f[8]), _known(f[11])


def pack(gpus: Iterable[tuple[int, int, Sequence[float | None]]]) -> bytes:
    """(device id, samples, FIGURES figures with None for missing) per GPU -> bytes."""
    gpus = sorted(gpus, key=lambda gpu: gpu[0])
    figures = [_NAN if f is None else f for _, _, row in gpus for f in row]
    return _pack_runs([g[0] for g in gpus], [g[1] for g in gpus], figures)


def unpack(data: bytes | memoryview) -> list[Gpu]:
    ids, samples, figures = _runs(data)
    return [Gpu(ids[i], samples[i], figures[i * FIGURES:(i + 1) * FIGURES]) for i in range(len(ids))]


def combine(parts: Sequence[tuple[int, Sequence[float]]]) -> tuple[int, list[float]]:
    """One GPU's rollups over consecutive buckets, (samples, figures) each, as one over
    them all: the samples summed, the minima's minimum, the means weighted by their
    sample counts, the maxima's maximum, each leaving out the parts that miss it (exact
    unless a measure was missing from only some samples of a part)."""
    counts = [samples for samples, _ in parts]
    columns = zip(*(figures for _, figures in parts), strict=True)
    return sum(counts), [_combined(i % 3, counts, column) for i, column in enumerate(columns)]


def merge(packed: Sequence[bytes | memoryview]) -> bytes:
    """One node's rollups over consecutive buckets, packed each, as one packed rollup
    over them all (`combine` for each GPU). Where the node had the same GPUs throughout,
    as it mostly has, all its figures are combined column by column in one pass."""
    runs = [_runs(data) for data in packed]
    ids = runs[0][0]
    if len(runs) == 1:
        return bytes(packed[0])
    if any(other != ids for other, _, _ in runs):  # GPUs came or went: GPU by GPU
        by_gpu: dict[int, list[tuple[int, tuple[float, ...]]]] = {}
        for data in packed:
            for gpu in unpack(data):
                by_gpu.setdefault(gpu.device_id, []).append((gpu.samples, gpu.figures))
        return pack((device_id, *combine(parts)) for device_id, parts in by_gpu.items())
    counts = list(zip(*(samples for _, samples, _ in runs), strict=True))  # per GPU, per bucket
    totals = [sum(c) for c in counts]
    columns = list(zip(*(figures for _, _, figures in runs), strict=True))  # per figure, per bucket
    # Each kind of figure over all GPUs at once, most of it in C (minima, maxima, sums).
    figures = [0.0] * len(columns)
    figures[0::3] = map(min, columns[0::3])
    figures[2::3] = map(max, columns[2::3])
    per_gpu = len(MEASURES)
    figures[1::3] = [sum(map(operator.mul, counts[i // per_gpu], column)) / totals[i // per_gpu]
                     for i, column in enumerate(columns[1::3])]
    total = sum(figures)
    if total != total:  # a part misses a figure (or min()/max() met a NaN first): as `combine` has it
        figures = [f if f == f else _combined(i % 3, counts[i // FIGURES], columns[i]) for i, f in enumerate(figures)]
    return _pack_runs(ids, totals, figures)


def _combined(kind: int, counts: Sequence[int], column: Sequence[float]) -> float:
    """The minimum (kind 0), the mean weighted by `counts` (1) or the maximum (2) of
    one figure's `column` of parts, leaving out the parts that miss it."""
    if kind == 1:
        total = sum(map(operator.mul, counts, column))
        if total == total:
            return total / sum(counts)
        pairs = [(n, f) for n, f in zip(counts, column, strict=True) if f == f]
        weight = sum(n for n, _ in pairs)
        return sum(n * f for n, f in pairs) / weight if weight else _NAN
    # min() and max() skip a NaN unless it comes first: then take the known ones.
    found = (min if kind == 0 else max)(column)
    if found != found:
        found = (min if kind == 0 else max)((f for f in column if f == f), default=_NAN)
    return found


def _runs(data: bytes | memoryview) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """The three runs of packed `data`: device ids, sample counts, figures."""
    n = len(data) // GPU_BYTES
    return (struct.unpack_from(f"<{n}q", data, 0), struct.unpack_from(f"<{n}I", data, 8 * n),
            struct.unpack_from(f"<{n * FIGURES}f", data, 12 * n))


def _pack_runs(ids: Sequence[int], samples: Sequence[int], figures: Sequence[float]) -> bytes:
    n = len(ids)
    layout = f"<{n}q{n}I{n * FIGURES}f"
    try:
        return struct.pack(layout, *ids, *samples, *figures)
    except OverflowError:  # a reading too big for float32: infinite, rather than no rollup at all
        figures = [f if f != f or abs(f) <= 3.4e38 else math.copysign(math.inf, f) for f in figures]
        return struct.pack(layout, *ids, *samples, *figures)


def _known(figure: float) -> float | None:
    return None if figure != figure else figure


def _whole(figure: float) -> float | int | None:
    if figure != figure:
        return None
    return int(figure) if math.isfinite(figure) else figure
