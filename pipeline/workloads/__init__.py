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
