"""The stages, in data-flow order: name -> (run function, one-line description).

Each is a module `pipeline.stages.<name>` with `run(cfg) -> counts`; stages meet only in
the workspace's tables (pipeline/core/catalog.py) and never import each other. The run
functions are named by dotted path and resolved as Hydra resolves a `_target_`: only the
stage that runs is imported (tune and compare alone import TVM, torch, MLflow and
matplotlib for seconds).
"""

from __future__ import annotations

import functools

from hydra.utils import get_method

# (shown by `python -m pipeline --help` too, from conf/config.yaml's help template)
STAGES = {
    "download": ("pipeline.stages.download.run", "fetch the TenSet archives (dataset=tenset only)"),
    "tasks": ("pipeline.stages.tasks.run", "build the task table and MetaSchedule workload database"),
    "sample": ("pipeline.stages.sample.run", "draw distinct schedule candidates per task (MetaSchedule tuning records)"),
    "replay": ("pipeline.stages.replay.run", "apply each record's trace, build and export the kernel"),
    "measure": ("pipeline.stages.measure.run", "run each kernel on the device: latency and a correctness check"),
    "collect": ("pipeline.stages.collect.run", "static features and profiler counters (ncu on GPU, perf on CPU)"),
    "train": ("pipeline.stages.train.run", "train cost models (LightGBM, XGBoost, MLP) and log them to MLflow"),
    "compare": ("pipeline.stages.compare.run", "side-by-side table of the workspace's MLflow runs"),
    "tune": ("pipeline.stages.tune.run", "tune with the trained model inside MetaSchedule vs its own models"),
}


def stages_for_all(cfg) -> list[str]:
    """Stages that `stage=all` runs for this dataset: download only fetches (or, with
    dataset.path, unpacks) TenSet and imports its records."""
    return [n for n in STAGES if n != "download" or str(cfg.dataset.source) == "tenset"]


# Stages that write the workspace's tables: one run at a time per workspace and shard
# (pipeline/core/locks.py). Training, comparing and tuning only read them, and a sweep may
# run those in parallel.
LOCKED = ("tasks", "sample", "replay", "measure", "collect")


def run_of(name: str):
    """The run function of stage `name` (holding the workspace's lock for that stage)."""
    if name not in STAGES:
        raise ValueError(f"stage={name!r} is not a stage; valid: all, {', '.join(STAGES)}")
    run = get_method(STAGES[name][0])
    if name not in LOCKED:
        return run

    @functools.wraps(run)
    def locked(cfg):
        # pandas and pyarrow come with the workspace: imported when a stage runs, not for --help
        from pipeline.core.sharding import Shard
        from pipeline.core.workspace import Workspace

        # The lock is the folder's whatever selection it holds: the stage itself checks the selection.
        with Workspace.from_cfg(cfg, check=False).stage_lock(name, Shard.from_cfg(cfg), wait_s=float(cfg.lock.wait_s)):
            return run(cfg)

    return locked
