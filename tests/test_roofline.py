"""features.roofline: a store's roofline bound from PerStoreFeature counts, known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from features.roofline import COLUMNS, Peaks, record_bound_ns, store_bounds
from pipeline.core import schema as S

NAMES = list(S.PER_STORE_FEATURE_NAMES)
PEAKS = Peaks(gflops=64.0, gbs=16.0, cores=2, lanes=8)  # 4 GFLOP/s per lane and core, 8 GB/s per core


def _store(**counts) -> np.ndarray:
    """One store row with these counts, stored as PerStoreFeature does: log2(1 + x)."""
    row = np.zeros(len(NAMES), np.float32)
    for k, v in counts.items():
        row[NAMES.index(k)] = math.log2(1 + v)
    return row


def _ns(value: float) -> float:
    return 2.0**value - 1.0


def test_compute_bound_store_uses_its_cores_and_lanes():
    # 1e6 multiply-adds on 2 parallel iterations (both cores) of 8-wide vectors: 1e6 / (4 * 2 * 8) ns
    row = _store(float_mad=1e6, parallel_prod=2, vec_prod=8, b0_lines=10)
    out = store_bounds(row[None], PEAKS, NAMES)[0]
    assert len(out) == len(COLUMNS)
    assert _ns(out[0]) == pytest.approx(1e6 / 64, rel=1e-4)
    assert _ns(out[1]) == pytest.approx(10 * 64 / 16, rel=1e-4)  # 10 lines of 64 bytes at 2 x 8 GB/s
    assert out[2] == out[0]


def test_serial_scalar_store_is_slower_and_parallelism_beyond_the_cores_buys_nothing():
    serial = store_bounds(_store(float_mad=1e6, b0_lines=1)[None], PEAKS, NAMES)[0]
    assert _ns(serial[0]) == pytest.approx(1e6 / 4, rel=1e-4)
    wide = store_bounds(_store(float_mad=1e6, parallel_prod=64, vec_prod=64, b0_lines=1)[None], PEAKS, NAMES)[0]
    assert _ns(wide[0]) == pytest.approx(1e6 / 64, rel=1e-4)


def test_memory_bound_store_and_record_sum():
    copy = _store(float_addsub=10, parallel_prod=2, b0_lines=1e5, b1_lines=1e5)  # 2e5 lines, little arithmetic
    out = store_bounds(copy[None], PEAKS, NAMES)[0]
    assert out[2] == out[1] and _ns(out[1]) == pytest.approx(2e5 * 64 / 16, rel=1e-4)
    rows = np.stack([copy, copy, _store(float_mad=1e6, parallel_prod=2, vec_prod=8)])
    total = record_bound_ns(rows, np.array([0, 2, 3]), PEAKS, NAMES)
    assert total == pytest.approx([2 * 2e5 * 64 / 16, 1e6 / 64], rel=1e-4)


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="vec_prod"):
        store_bounds(np.zeros((1, 3), np.float32), PEAKS, ["float_mad", "parallel_prod", "b0_lines"])


def test_a_cache_moves_a_reused_buffers_lines_once():
    """With cache_bytes, a buffer whose reuse distance fits in the cache moves its unique
    lines; one whose reuse spills the cache (or that is not reused) moves every touched line."""
    cached = Peaks(gflops=64.0, gbs=16.0, cores=2, lanes=8, cache_bytes=1024 * 1024)
    fits = _store(parallel_prod=2, b0_lines=1e5, b0_unique_lines=1e3, b0_reuse_dis_bytes=64 * 1024)
    spills = _store(parallel_prod=2, b0_lines=1e5, b0_unique_lines=1e3, b0_reuse_dis_bytes=8 * 1024 * 1024)
    no_reuse = _store(parallel_prod=2, b0_lines=1e5, b0_unique_lines=1e5)
    moved = [_ns(store_bounds(r[None], cached, NAMES)[0][1]) * 16 / 64 for r in (fits, spills, no_reuse)]
    assert moved == pytest.approx([1e3, 1e5, 1e5], rel=1e-4)
    assert _ns(store_bounds(fits[None], PEAKS, NAMES)[0][1]) * 16 / 64 == pytest.approx(1e5, rel=1e-4)  # no cache
    with pytest.raises(ValueError, match="b0_reuse_dis_bytes"):
        store_bounds(np.zeros((1, 4), np.float32), cached, ["float_mad", "parallel_prod", "vec_prod", "b0_lines"])
