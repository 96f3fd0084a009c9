"""models/tables.py: a training table's records and their stores, taken and gathered."""

from __future__ import annotations

import numpy as np

from models.tables import gather_segments

from synthetic import small_table


def test_gather_segments_and_take():
    tab = small_table()
    idx, seg = gather_segments(tab.offsets, np.array([2, 0]))
    n2, n0 = np.diff(tab.offsets)[[2, 0]]
    assert list(seg) == [0] * n2 + [1] * n0
    assert list(idx[:n2]) == list(range(tab.offsets[2], tab.offsets[3]))
    sub = tab.take(np.array([2, 0]))
    assert np.array_equal(sub.stores, tab.stores[idx]) and list(sub.frame["record_id"]) == ["t0r2", "t0r0"]
    long = sub.store_frame()
    assert len(long) == n2 + n0 and list(long["record_id"].unique()) == ["t0r2", "t0r0"]
