"""The stages, in data-flow order: name -> (run function, one-line description).

Each is a module `pipeline.stages.<name>` with `run(cfg) -> counts`; stages meet only in
the workspace's tables (pipeline/core/catalog.py) and never import each other. The run
functions are named by dotted path and resolved as Hydra resolves a `_target_`: only the
stage that runs is imported (tune and compare alone import TVM, torch, MLflow and
matplotlib for seconds).
"""

from __future__ import annotations

import functools
import socket
import time

from hydra.utils import get_method

# The one list of stages: `python -m pipeline --help` and docs/configuration-reference.md read it
# (pipeline/docs_config.py).
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
    "release": ("pipeline.stages.release.run", "pack the workspace (or trained models) as a release under data/releases"),
}
# Stages that `stage=all` never runs: publishing is a decision, not a step of the chain.
NOT_IN_ALL = ("release",)
# A workspace made from a release (dataset=release) has its kernels timed already: the
# chain makes it (tasks) and trains on it.
FROM_RELEASE = ("tasks", "train", "compare")
# Seconds a stage waits for another process that is making the same workspace from a release.
MAKE_WAIT_S = 600.0


def stages_for_all(cfg) -> list[str]:
    """Stages that `stage=all` runs for this dataset: download only fetches (or, with
    dataset.path, unpacks) TenSet and imports its records."""
    if str(cfg.dataset.source) == "release":
        return list(FROM_RELEASE)
    return [n for n in STAGES if n not in NOT_IN_ALL and (n != "download" or str(cfg.dataset.source) == "tenset")]


# Stages that write the workspace's tables: one run at a time per workspace and shard
# (pipeline/core/locks.py). Training, comparing and tuning only read them, and a sweep may
# run those in parallel.
LOCKED = ("tasks", "sample", "replay", "measure", "collect")


def overrides() -> list[str] | None:
    """The command line's overrides of the running Hydra app (None outside one: a test)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


def run_of(name: str):
    """The run function of stage `name`: on a workspace made from a release, after making
    it (stage=tasks) if it is not there yet; for the stages that write tables, holding the
    workspace's lock for that stage and adding the run to the workspace's history."""
    if name not in STAGES:
        raise ValueError(f"stage={name!r} is not a stage; valid: all, {', '.join(STAGES)}")
    run = get_method(STAGES[name][0])

    @functools.wraps(run)
    def staged(cfg):
        if name != "tasks" and str(cfg.dataset.source) == "release":
            from pipeline.options import workspace_of

            if not workspace_of(cfg, check=False).tasks.exists():
                from omegaconf import OmegaConf, open_dict

                first = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
                with open_dict(first):
                    first.lock.wait_s = MAKE_WAIT_S  # a parallel job of a sweep may be making it
                run_of("tasks")(first)
        if name not in LOCKED:
            return run(cfg)
        return locked(cfg)

    def locked(cfg):
        # pandas and pyarrow come with the workspace: imported when a stage runs, not for --help
        from pipeline.options import shard_of, workspace_of

        # The lock is the folder's whatever selection it holds: the stage itself checks the selection.
        ws, shard = workspace_of(cfg, check=False), shard_of(cfg)
        with ws.stage_lock(name, shard, wait_s=float(cfg.lock.wait_s)):
            started = time.time()
            counts = run(cfg)
            ws.add_history({"stage": name, "overrides": overrides(), "force": bool(cfg.force),
                            "shard": f"{shard.index}/{shard.count}", "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                            "seconds": round(time.time() - started, 1), "tasks_digest": ws.tasks_digest(),
                            "counts": {k: v for k, v in (counts or {}).items() if isinstance(v, (int, float, str))}})
            return counts

    return staged
