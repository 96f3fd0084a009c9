"""features.task_context: an operator's kind and size read from its TIR, known answers."""

from __future__ import annotations

import math

import pytest

from features.task_context import COLUMNS, of_mod


def _op(name: str, config: int = 0):
    import tvm
    from tvm.s_tir.meta_schedule.testing.te_workload import create_te_workload

    func = create_te_workload(name, config)
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def test_batch_matmul_sizes_and_kind():
    """GMM 1x128x128x128 float32: 2*128^3 FLOPs, two 64 KiB inputs, one 64 KiB output, one
    sum over 128 values, no window (each input index is a loop variable of its own)."""
    ctx = of_mod(_op("GMM"))
    assert set(ctx) == set(COLUMNS)
    assert ctx["task.log_flops"] == pytest.approx(math.log2(1 + 2 * 128**3))
    assert ctx["task.log_in_bytes"] == pytest.approx(math.log2(1 + 2 * 128 * 128 * 4))
    assert ctx["task.log_out_bytes"] == pytest.approx(math.log2(1 + 128 * 128 * 4))
    assert ctx["task.log_reduce_extent"] == pytest.approx(math.log2(129))
    assert (ctx["task.n_reduce_blocks"], ctx["task.max_reduce_iters"], ctx["task.reduce_sum"]) == (1, 1, 1)
    assert (ctx["task.window"], ctx["task.reduce_max"], ctx["task.gather"]) == (0, 0, 0)
    assert (ctx["task.out_rank"], ctx["task.n_inputs"]) == (3, 2)


def test_convolution_reads_a_window_and_softmax_has_a_max_and_a_sum():
    conv = of_mod(_op("C2D"))  # 1x224x224x3 -> 64 channels, 7x7 kernel: sum over 3*7*7
    assert conv["task.window"] == 1 and conv["task.max_reduce_iters"] == 3
    assert conv["task.log_reduce_extent"] == pytest.approx(math.log2(1 + 3 * 7 * 7))
    softmax = of_mod(_op("SFM"))  # a max and a sum per row
    assert (softmax["task.reduce_max"], softmax["task.reduce_sum"], softmax["task.n_reduce_blocks"]) == (1, 1, 2)
    assert softmax["task.window"] == 0
