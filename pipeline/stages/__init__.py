"""The stages, in data-flow order: name -> (run function, one-line description).

Each is a module `pipeline.stages.<name>` with `run(cfg) -> counts`; stages meet only in
the workspace's tables (pipeline/core/catalog.py) and never import each other.
"""

from __future__ import annotations

from pipeline.stages import collect, compare, download, measure, replay, sample, tasks, train, tune

# (shown by `python -m pipeline --help` too, from conf/config.yaml's help template)
STAGES = {
    "download": (download.run, "fetch the TenSet archives (dataset=tenset only)"),
    "tasks": (tasks.run, "build the task table and MetaSchedule workload database"),
    "sample": (sample.run, "draw distinct schedule candidates per task (MetaSchedule tuning records)"),
    "replay": (replay.run, "apply each record's trace, build and export the kernel"),
    "measure": (measure.run, "run each kernel on the device: latency and a correctness check"),
    "collect": (collect.run, "static features and profiler counters (ncu on GPU, perf on CPU)"),
    "train": (train.run, "train cost models (LightGBM, XGBoost, MLP) and log them to MLflow"),
    "compare": (compare.run, "side-by-side table of the workspace's MLflow runs"),
    "tune": (tune.run, "tune with the trained model inside MetaSchedule vs its own models"),
}


def stages_for_all(cfg) -> list[str]:
    """Stages that `stage=all` runs for this dataset: download only fetches (or, with
    dataset.path, unpacks) TenSet and imports its records."""
    return [n for n in STAGES if n != "download" or str(cfg.dataset.source) == "tenset"]


def run_of(name: str):
    """The run function of stage `name`."""
    if name not in STAGES:
        raise ValueError(f"stage={name!r} is not a stage; valid: all, {', '.join(STAGES)}")
    return STAGES[name][0]
