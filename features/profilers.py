"""Profilers of built kernels (`collect.profiler`), chosen with `create(kind, settings)`.

A profiler names the tables it fills (`tables()`, the per-record one first) and turns
jobs (record_id, task_id, artifact, args) into rows with `profile(jobs, errors, root=,
write=, progress=)`, handing each batch of rows to `write(table, rows[, schema])` as it
comes; `errors` are rows of records that cannot be profiled (not built, failed to run).
A profiler that a device bundle part runs on the host (`on_device_host`) also gives the
command the part runs (`host_command(section_folder)`) and reads back what it wrote there
(`import_host(folder, wanted, write)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from features.cpu_counters import CpuCounters
from features.ncu.profile import NcuProfiler, Options
from pipeline.core.components import create_kind


@dataclass
class ProfilerSettings:
    """What the profilers read, made once by the stage from `collect.*` (pipeline/options.py):
    the target's kind (what `auto` picks by), CpuCounters' keyword arguments (`collect.perf`),
    and Nsight Compute's options, section set, report folder, the shard's tag on its report
    files and the target's name (`collect.ncu`)."""

    target_kind: str = "llvm"
    perf: dict | None = field(default_factory=dict)
    ncu: Options | None = field(default_factory=Options)
    ncu_set: str | None = None
    report_dir: Path = Path("ncu_profiles")
    tag: str = "shard0"
    target: str = ""


class NoProfiler:
    """collect.profiler=none: static features only."""

    name = "none"
    on_device_host = False

    def tables(self) -> tuple:
        return ()

    def profile(self, jobs, errors, *, root, write, progress=None) -> dict:
        return {}


def for_target(s: ProfilerSettings):
    """collect.profiler=auto: Nsight Compute on a CUDA target, perf counters otherwise."""
    return create(AUTO.get(s.target_kind, "perf"), s)


# target kind -> the profiler `auto` picks (perf for any other kind).
AUTO = {"cuda": "ncu"}
def _settings_of(s: ProfilerSettings, kind: str, group: str):
    """The settings `kind` reads; a `collect` option without them is named with the one that has them."""
    value = getattr(s, kind)
    if value is None:
        raise ValueError(f"collect.profiler={kind} needs collect.{kind}, which this collect option lacks; "
                         f"choose collect={group} (or collect=auto)")
    return value


def perf(s: ProfilerSettings) -> CpuCounters:
    """collect.profiler=perf: hardware counters of the kernel's runs on this CPU."""
    return CpuCounters(**_settings_of(s, "perf", "cpu"))


def ncu(s: ProfilerSettings) -> NcuProfiler:
    """collect.profiler=ncu: Nsight Compute's metrics of each kernel launch."""
    return NcuProfiler(_settings_of(s, "ncu", "ncu"), s.report_dir, s.ncu_set, s.tag, s.target)


def none(s: ProfilerSettings) -> NoProfiler:
    return NoProfiler()


#: kind -> `_target_` (pipeline/core/components.py)
PROFILERS = {"perf": "features.profilers.perf", "ncu": "features.profilers.ncu",
             "none": "features.profilers.none", "auto": "features.profilers.for_target"}


def create(kind: str, settings: ProfilerSettings):
    """The profiler `kind` with `settings`."""
    return create_kind("collect.profiler", PROFILERS, kind, settings)
