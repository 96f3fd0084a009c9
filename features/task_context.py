"""Task context: what kind of operator a workload is and how big, read from its TIR alone.

A cost model that ranks the schedules of one task sees only per-store features; which
transformations pay off depends on the operator (a convolution rewards tiling the reduction,
an element-wise op only parallelism and vectors). The strongest published models give every
row the task it belongs to; these values do that, from the workload's PrimFunc, so they are
the same for a task in a dataset, in a network of the user's, and inside a tuning run
(`TuneContext.mod`). No names are read: a network's fusion naming never decides a value.

Values (all floats, `task.` prefix):
  log_flops, log_in_bytes, log_out_bytes, log_intensity   size: log2(1 + x); intensity = flops / bytes
  n_blocks, n_reduce_blocks, max_reduce_iters, log_reduce_extent   the reduction's shape
  reduce_sum, reduce_max                                   the combiner of a reduction
  window, gather                                           an input read at spatial + reduce
                                                            index (convolution, pooling) / at an
                                                            index loaded from a buffer (take)
  out_rank, n_inputs
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

COLUMNS = ("task.log_flops", "task.log_in_bytes", "task.log_out_bytes", "task.log_intensity", "task.n_blocks",
           "task.n_reduce_blocks", "task.max_reduce_iters", "task.log_reduce_extent", "task.reduce_sum",
           "task.reduce_max", "task.window", "task.gather", "task.out_rank", "task.n_inputs")


def _lg(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


def _bytes(arg) -> float:
    """Bytes of one argument (MetaSchedule's TensorInfo: dtype and shape)."""
    n = 1.0
    for d in arg.shape:
        n *= float(d)
    dtype = str(arg.dtype)
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 32) if dtype != "bool" else 8
    return n * max(bits // 8, 1)


def _blocks(sch) -> list:
    """Every block of the function but the root, nested ones included."""
    out, todo = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while todo:
        b = todo.pop(0)
        out.append(sch.get(b))
        todo.extend(sch.get_child_blocks(b))
    return out


def _int(expr) -> float:
    return float(expr.value) if hasattr(expr, "value") else 1.0


def of_mod(mod) -> dict[str, float]:
    """The task context of one workload (an IRModule whose `main` is a PrimFunc)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm.tirx as tir
    from tvm.s_tir import Schedule
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.tirx.analysis import undefined_vars

    args = ArgInfo.from_prim_func(mod["main"])
    sch = Schedule(mod)
    blocks = _blocks(sch)
    local = {b.name for b in sch.get(sch.get_sblock("root")).alloc_buffers}
    n_out = len({w.source.name for b in blocks for w in b.writes} - local) or 1
    inputs, outputs = args[:-n_out], args[-n_out:]
    reduce_blocks, reduce_iters, reduce_extent = 0, 0, 0.0
    reduce_sum = reduce_max = window = gather = 0.0
    for b in blocks:
        red = [iv for iv in b.iter_vars if iv.iter_type == tir.IterVar.CommReduce]
        if not red:
            # a point-wise block that reads a whole dimension of a buffer: an index loaded from memory
            if any(_int(r.extent) > 1 for rd in b.reads for r in rd.region):
                gather = 1.0
            continue
        reduce_blocks += 1
        reduce_iters = max(reduce_iters, len(red))
        extent = 1.0
        for iv in red:
            extent *= _int(iv.dom.extent)
        reduce_extent = max(reduce_extent, extent)
        value = getattr(b.body, "value", None)
        reduce_sum = max(reduce_sum, float(isinstance(value, tir.Add)))
        reduce_max = max(reduce_max, float(isinstance(value, tir.Max)))
        red_names = {iv.var.name for iv in red}
        spatial_names = {iv.var.name for iv in b.iter_vars} - red_names
        for rd in b.reads:
            for r in rd.region:
                used = {v.name for v in undefined_vars(r.min, [])}
                if used & red_names and used & spatial_names:
                    window = 1.0
    try:
        flops = float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - a function the estimator cannot read has no FLOP count
        flops = 0.0
    in_bytes = sum(_bytes(p) for p in inputs)
    out_bytes = sum(_bytes(p) for p in outputs)
    return {"task.log_flops": _lg(flops), "task.log_in_bytes": _lg(in_bytes), "task.log_out_bytes": _lg(out_bytes),
            "task.log_intensity": _lg(flops / max(in_bytes + out_bytes, 1.0)), "task.n_blocks": float(len(blocks)),
            "task.n_reduce_blocks": float(reduce_blocks), "task.max_reduce_iters": float(reduce_iters),
            "task.log_reduce_extent": _lg(reduce_extent), "task.reduce_sum": reduce_sum, "task.reduce_max": reduce_max,
            "task.window": window, "task.gather": gather,
            "task.out_rank": float(max((len(p.shape) for p in outputs), default=0)), "task.n_inputs": float(len(inputs))}


def of_workspace(ws) -> pd.DataFrame:
    """task_id and the COLUMNS of every task of a workspace whose workload line reads."""
    from pipeline.core import database as D
    from pipeline.core.workspace import read_table
    from pipeline.core import schema as S

    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    workloads = D.read_workload_lines(ws)
    rows = []
    for r in tasks.itertuples(index=False):
        try:
            rows.append({"task_id": r.task_id, **of_mod(D.load_workload_mod(workloads[int(r.workload_index)]))})
        except Exception:  # noqa: BLE001 - a task whose workload does not load has no context (NaN)
            rows.append({"task_id": r.task_id})
    return pd.DataFrame(rows, columns=["task_id", *COLUMNS]).astype({c: np.float32 for c in COLUMNS})
