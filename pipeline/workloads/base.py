"""What a workload source yields: one task to tune."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Workload:
    """One task: an IRModule whose `main` PrimFunc MetaSchedule can tune."""

    name: str
    mod: object  # tvm.IRModule
    network: str = ""
    weight: int = 1
    source: str = ""
    extra: dict = field(default_factory=dict)
