"""stage=compare: the workspace's training runs side by side.

Reads the runs with `mlflow.search_runs` (the same store `mlflow ui` shows): the training
runs of this workspace (by identity, models/tracking.py; tune runs have their own report)
that the keys which select runs in stage=train select here too: `split`, `model` (model=all:
the models of `train.models`) and `features` (features=each: the sets of `train.features`).
Keeps the newest run of each (model, features, split) unless `compare.latest_only=false`,
and writes <workspace>/reports/<name>.csv, .md and .png (bars of `compare.chart_metrics`),
<name> saying what was selected (`compare-by_task`, `compare-within_task-lgbm-static`, ...),
so that the jobs of a sweep (`-m stage=compare split=within_task,by_task`) each keep theirs.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from models import plots, registry, tracking
from models.metrics import ALL_METRICS
from pipeline.core.workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)

FIRST = ["model", "features", "split"]
EACH = "each"  # features=each (conf/features/each.yaml): every set of train.features


def selection(cfg) -> dict[str, list[str]]:
    """The runs to compare, by run tag: what stage=train with the same keys trains."""
    models = cfg.train.models if str(cfg.model.name) == registry.ALL else [cfg.model.name]
    features = cfg.train.features if str(cfg.features.name) == EACH else [cfg.features.name]
    return {"split": [str(cfg.split.name)], "model": [str(m) for m in models], "features": [str(f) for f in features]}


def report_name(cfg) -> str:
    """`compare-<split>[-<model>][-<features>][-all_runs]`: what this comparison selected."""
    parts = ["compare", str(cfg.split.name)]
    parts += [str(cfg.model.name)] if str(cfg.model.name) != registry.ALL else []
    parts += [str(cfg.features.name)] if str(cfg.features.name) != EACH else []
    parts += [] if bool(cfg.compare.latest_only) else ["all_runs"]
    return "-".join(parts)


def comparison_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: model, features, split, every test metric, then val/timing columns."""
    out = pd.DataFrame({k: runs[f"tags.{k}"] for k in FIRST})
    metric_cols = [f"test_{m}" for m in ALL_METRICS] + [f"val_{m}" for m in ("top1_score", "peak1", "pair_acc")] + \
                  ["train_seconds", "predict_per_s", "n_train", "n_val", "n_test", "test_n_tasks"]
    for m in metric_cols:
        col = f"metrics.{m}"
        out[m] = runs[col].astype(float) if col in runs.columns else np.nan
    out["run_id"] = runs["run_id"]
    out["start_time"] = runs["start_time"]
    order = {"ms_xgb": 1}  # the reference row last within each feature set
    out = out.assign(_o=out["model"].map(order).fillna(0)).sort_values(["split", "features", "_o", "model"])
    return out.drop(columns="_o").reset_index(drop=True)


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub table: integers and values of 1000 or more without decimals, others with 3."""
    def fmt(v):
        if isinstance(v, float):
            if np.isnan(v):
                return ""
            return f"{v:.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:.3f}"
        return v

    return df.map(fmt).to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def run(cfg) -> dict:
    ws = Workspace.from_cfg(cfg)
    every = tracking.workspace_runs(cfg)
    if every.empty:
        raise WorkspaceError(
            f"no MLflow training run for workspace {ws.root} in {tracking.tracking_uri(cfg)} (experiment "
            f"{tracking.experiment_name(cfg)}): run `python -m pipeline stage=train` first (same mlflow.tracking_uri).")
    sel = selection(cfg)
    chosen = np.logical_and.reduce([every[f"tags.{k}"].isin(v) for k, v in sel.items()])
    runs = every[chosen]
    what = ", ".join(f"{k}={'/'.join(v)}" for k, v in sel.items())
    if runs.empty:
        raise WorkspaceError(
            f"none of the {len(every)} training runs of workspace {ws.name} is one of {what}: train them with "
            f"`python -m pipeline stage=train split={cfg.split.name}`, or select others with split=, model=, features=")
    if bool(cfg.compare.latest_only):
        runs = tracking.latest_per_config(runs)
    table = comparison_table(runs)
    reports = ws.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    name = report_name(cfg)
    paths = {ext: reports / f"{name}.{ext}" for ext in ("csv", "md", "png")}
    shown = table.drop(columns=["run_id", "start_time"])
    table.to_csv(paths["csv"], index=False)
    paths["md"].write_text(
        f"# Cost models of workspace {ws.name}: {what}\n\nTest part of each run's split; metrics defined in "
        f"models/metrics.py. MLflow: {tracking.tracking_uri(cfg)}, experiment {tracking.experiment_name(cfg)}.\n\n"
        + to_markdown(shown))
    chart = table.assign(run=table["model"] + "/" + table["features"] + "/" + table["split"])
    plots.save(plots.compare_chart(chart, [str(m) for m in cfg.compare.chart_metrics]), paths["png"])
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        cols = FIRST + [c for c in shown.columns if c.startswith("test_") and c != "test_n_tasks"] + ["train_seconds"]
        print(f"\nstage=compare, workspace {ws.name}, {what}: {len(table)} runs (test part)")
        print(shown[cols].rename(columns=lambda c: c.replace("test_", "")).to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
        left = int((~chosen).sum())
        if left:
            print(f"{left} other training runs of this workspace (select them with split=, model=, features=)")
        print(f"written: {paths['csv']}, {paths['md'].name}, {paths['png'].name}")
    return {"runs": len(table), "report": str(paths["md"])}
