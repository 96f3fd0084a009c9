"""Profilers of built kernels (`collect.profiler`), chosen with `create(kind, cfg)`.

A profiler names the tables it fills (`tables()`, the per-record one first) and turns
jobs (record_id, task_id, artifact, args) into rows with `profile(jobs, errors, root=,
write=, progress=)`, handing each batch of rows to `write(table, rows[, schema])` as it
comes; `errors` are rows of records that cannot be profiled (not built, failed to run).
"""

from __future__ import annotations

from features.cpu_counters import CpuCounters
from features.ncu.profile import NcuProfiler
from pipeline.core.registry import choose


class NoProfiler:
    """collect.profiler=none: static features only."""

    name = "none"

    @classmethod
    def from_cfg(cls, cfg) -> "NoProfiler":
        return cls()

    def tables(self) -> tuple:
        return ()

    def profile(self, jobs, errors, *, root, write, progress=None) -> dict:
        return {}


def for_target(cfg):
    """collect.profiler=auto: Nsight Compute on a CUDA target, perf counters otherwise."""
    return create(AUTO.get(str(cfg.target.kind), "perf"), cfg)


# target kind -> the profiler `auto` picks (perf for any other kind).
AUTO = {"cuda": "ncu"}
PROFILERS = {"perf": CpuCounters.from_cfg, "ncu": NcuProfiler.from_cfg, "none": NoProfiler.from_cfg,
             "auto": for_target}


def create(kind: str, cfg):
    """The profiler `kind`, configured from `collect.*`."""
    return choose("collect.profiler", PROFILERS, kind)(cfg)
