"""Workload sources: each turns a `dataset` config into tensor programs to tune.

A source is a function `load(dataset, target, *, seed, data) -> list[Workload]` of the
`dataset` group's config, the TVM target, the seed of network weights and the data folder
(`paths.data`), registered in `SOURCES` under the name that `dataset.source` gives and
chosen with `create(kind)`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.components import create_kind
from pipeline.workloads.base import Workload

__all__ = ["SOURCES", "Workload", "args_of", "create", "flops_of", "load_workloads"]

#: kind -> `_target_` (pipeline/core/components.py)
SOURCES = {"ops": "pipeline.workloads.ops.load", "zoo": "pipeline.workloads.zoo.load",
           "tenset": "pipeline.workloads.tenset.load", "relax": "pipeline.workloads.relax.load"}


def create(kind: str, dataset, target, *, seed: int = 0, data: Path = Path("data")) -> list[Workload]:
    """The workloads that the source `kind` loads for the `dataset` group's config."""
    return create_kind("dataset.source", SOURCES, kind, dataset, target, seed=seed, data=data)


def load_workloads(dataset, target, *, seed: int = 0, data: Path = Path("data")) -> list[Workload]:
    """The workloads of the `dataset` group's source."""
    return create(str(dataset.source), dataset, target, seed=seed, data=data)


def args_of(mod) -> list:
    """[[dtype, shape], ...] of the main PrimFunc's buffer parameters."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo  # seconds to import; only tasks need it

    return [[str(a.dtype), [int(x) for x in a.shape]] for a in ArgInfo.from_prim_func(mod["main"])]


def flops_of(mod) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops  # seconds to import; only tasks need it

    try:
        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - some ops (e.g. pure data movement) have no estimate
        return float("nan")
