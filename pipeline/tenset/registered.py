"""Computes behind Ansor workload keys that name a registered function, not a DAG hash.

TVM's auto-scheduler tutorials registered their workloads by function
(`@auto_scheduler.register_workload`); their logs' keys are `["<function>", args...]`.
Those functions are rebuilt here in TE, with the same stage structure, so that the
tutorials' records replay on today's TVM.
"""

from __future__ import annotations

from pipeline.tenset.graph import DAG, ansor_stage_order


def matmul_add(N, L, M, dtype):
    from tvm import te

    A = te.placeholder((N, L), name="A", dtype=dtype)
    B = te.placeholder((L, M), name="B", dtype=dtype)
    C = te.placeholder((N, M), name="C", dtype=dtype)
    k = te.reduce_axis((0, L), name="k")
    matmul = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="matmul")
    out = te.compute((N, M), lambda i, j: matmul[i, j] + C[i, j], name="out")
    return [A, B, C, out]


def conv2d_layer(N, H, W, CO, CI, KH, KW, stride, padding):
    from tvm import te, topi

    data = te.placeholder((N, CI, H, W), name="data")
    kernel = te.placeholder((CO, CI, KH, KW), name="kernel")
    bias = te.placeholder((1, CO, 1, 1), name="bias")
    conv = topi.nn.conv2d_nchw(data, kernel, stride, padding, dilation=1, out_dtype="float32")
    out = topi.nn.relu(conv + bias)
    return [data, kernel, bias, out]


REGISTERED = {"matmul_add": matmul_add, "conv2d_layer": conv2d_layer}


def dag_for(name: str, args: list) -> DAG | None:
    """The DAG of a registered workload, or None when `name` is not one."""
    fn = REGISTERED.get(name)
    if fn is None:
        return None
    args = [tuple(a) if isinstance(a, list) else a for a in args]
    tensors = fn(*args)
    return DAG(tensors=tensors, ops=ansor_stage_order(tensors))
