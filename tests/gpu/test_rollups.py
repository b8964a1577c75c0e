"""gpufleet.gpu.rollups: one node's GPUs over one bucket packed into one bytes value,
and rollups combined into longer ones."""

from __future__ import annotations

import math
import struct

import pytest

from gpufleet.gpu import rollups

NAN = float("nan")


def _same(a, b) -> bool:
    return all((x != x and y != y) or x == pytest.approx(y) for x, y in zip(a, b, strict=True))


def test_it_packs_sixty_bytes_a_gpu_little_endian_and_unpacks_them():
    figures = [1000, 2000.5, 3000, 10, 30.25, 60, None, None, None, 100.0, 150.0, 200.0]
    data = rollups.pack([(7, 3, figures), (5, 1, [1.0] * 12)])
    assert len(data) == 2 * rollups.GPU_BYTES == 120
    # Ascending device ids, then their sample counts, then each GPU's twelve figures.
    assert struct.unpack_from("<2q2I", data) == (5, 7, 1, 3)
    (five, seven) = rollups.unpack(data)
    assert (five.device_id, five.samples, five.figures) == (5, 1, (1.0,) * 12)
    assert (seven.device_id, seven.samples) == (7, 3)
    assert _same(seven.figures, [1000, 2000.5, 3000, 10, 30.25, 60, NAN, NAN, NAN, 100.0, 150.0, 200.0])
    assert rollups.unpack(rollups.pack([])) == []
    assert repr(rollups.unpack(memoryview(data))) == repr(rollups.unpack(data))


def test_a_figure_beyond_float32_is_kept_as_infinite_not_refused():
    (gpu,) = rollups.unpack(rollups.pack([(1, 1, [1e300, 1, -1e300] + [0] * 9)]))
    assert gpu.figures[:3] == (math.inf, 1.0, -math.inf)


def test_it_combines_minima_means_weighted_by_samples_and_maxima_leaving_out_missing_figures():
    parts = [
        (2, [10, 15, 20, 1, 2, 3, NAN, NAN, NAN, 5, 5, 5]),
        (1, [4, 30, 40, NAN, NAN, NAN, 50, 50, 50, 1, 1, 9]),
        (1, [NAN, NAN, NAN, 2, 2, 2, NAN, NAN, NAN, 3, 3, 3]),
    ]
    samples, figures = rollups.combine(parts)
    assert samples == 4
    assert _same(figures, [4, 20.0, 40, 1, 2.0, 3, 50, 50.0, 50, 1, 3.5, 9])
    # A missing figure first in line is left out too (min() alone would keep it).
    samples, figures = rollups.combine([(1, [NAN] * 12), (3, [1.0] * 12)])
    assert samples == 4 and figures == [1.0] * 12
    samples, figures = rollups.combine([(1, [NAN] * 12)])
    assert samples == 1 and all(math.isnan(f) for f in figures)


def test_a_node_s_rollups_merge_as_each_gpu_s_combine_whether_its_gpus_stayed_or_changed():
    a = [(1, 2, [1.0, 2.0, 3.0] * 4), (2, 1, [NAN] * 3 + [5.0, 6.0, 7.0] * 3)]
    b = [(1, 1, [0.0, 5.0, 9.0] * 4), (2, 3, [4.0, 4.0, 4.0] * 4)]
    merged = rollups.unpack(rollups.merge([rollups.pack(a), rollups.pack(b)]))
    expected = [(1, *rollups.combine([(2, a[0][2]), (1, b[0][2])])), (2, *rollups.combine([(1, a[1][2]), (3, b[1][2])]))]
    assert [(g.device_id, g.samples) for g in merged] == [(1, 3), (2, 4)]
    assert all(_same(g.figures, e[2]) for g, e in zip(merged, expected, strict=True))
    # GPU 2 gone in the second bucket, GPU 3 new there.
    changed = rollups.unpack(rollups.merge([rollups.pack(a), rollups.pack([b[0], (3, 5, [8.0] * 12)])]))
    assert [(g.device_id, g.samples) for g in changed] == [(1, 3), (2, 1), (3, 5)]
    assert _same(changed[1].figures, a[1][2]) and changed[2].figures == (8.0,) * 12


def test_a_gpu_s_figures_read_as_a_sample_s_means_and_maxima_with_none_for_missing():
    gpu = rollups.Gpu(3, 10, (1.0, 2.5, 4.0, 5.0, 6.0, 7.0, NAN, NAN, NAN, 8.0, 9.0, 10.0))
    assert gpu.means() == (2.5, 6.0, None, 9.0)
    assert gpu.maxima() == (4, 7, None, 10.0)
    assert [type(m) for m in gpu.maxima()] == [int, int, type(None), float]  # as the whole-number readings were
