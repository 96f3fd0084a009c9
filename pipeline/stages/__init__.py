"""The stages, in data-flow order. Each is a module `pipeline.stages.<name>` with `run(cfg)`."""

from __future__ import annotations

import importlib

# name -> one-line description (shown by `python -m pipeline --help`).
STAGES = {
    "download": "fetch the TenSet archives (dataset=tenset only)",
    "tasks": "build the task table and MetaSchedule workload database",
    "sample": "draw distinct schedule candidates per task (MetaSchedule tuning records)",
    "replay": "apply each record's trace, build and export the kernel",
    "measure": "run each kernel on the device: latency and a correctness check",
    "collect": "static features and profiler counters (ncu on GPU, perf on CPU)",
    "train": "train cost models (LightGBM, XGBoost, MLP) and log them to MLflow",
    "compare": "side-by-side table of the workspace's MLflow runs",
    "tune": "tune with the trained model inside MetaSchedule vs its own models",
}


def implemented() -> list[str]:
    out = []
    for name in STAGES:
        try:
            importlib.import_module(f"pipeline.stages.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"pipeline.stages.{name}":
                continue
            raise
        out.append(name)
    return out


def stages_for_all(cfg) -> list[str]:
    """Stages that `stage=all` runs for this dataset."""
    names = implemented()
    if cfg.dataset.source != "tenset":
        # download fetches (or, with dataset.path, unpacks) TenSet and imports its records.
        names = [n for n in names if n != "download"]
    return names


def get(name: str):
    if name not in STAGES:
        raise ValueError(f"stage={name!r} is not a stage; valid: all, {', '.join(STAGES)}")
    try:
        return importlib.import_module(f"pipeline.stages.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"pipeline.stages.{name}":
            raise ValueError(f"stage={name!r} is not available in this build; available: all, {', '.join(implemented())}") from e
        raise
