"""Workload sources: each turns a `dataset` config into tensor programs to tune.

A source module exposes `load(cfg, target) -> list[Workload]`; `source` in the dataset
config names the module (ops, zoo, tenset).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

SOURCES = ("ops", "zoo", "tenset")


@dataclass
class Workload:
    """One task: an IRModule whose `main` PrimFunc MetaSchedule can tune."""

    name: str
    mod: object  # tvm.IRModule
    network: str = ""
    weight: int = 1
    source: str = ""
    extra: dict = field(default_factory=dict)


def load_workloads(cfg, target) -> list[Workload]:
    source = str(cfg.dataset.source)
    if source not in SOURCES:
        raise ValueError(f"dataset.source={source!r} is not a workload source; valid: {', '.join(SOURCES)}")
    module = importlib.import_module(f"pipeline.workloads.{source}")
    return module.load(cfg, target)


def args_of(mod) -> list:
    """[[dtype, shape], ...] of the main PrimFunc's buffer parameters."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [[str(a.dtype), [int(x) for x in a.shape]] for a in ArgInfo.from_prim_func(mod["main"])]


def flops_of(mod) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001 - some ops (e.g. pure data movement) have no estimate
        return float("nan")
