"""stage=compare: every MLflow run of the workspace side by side.

Reads the runs with `mlflow.search_runs` (the same store `mlflow ui` shows), keeps the
newest run of each (model, features, split) unless `compare.latest_only=false`, and writes
<workspace>/reports/compare.csv, compare.md and compare.png (bars of `compare.chart_metrics`).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from models import plots, tracking
from models.metrics import ALL_METRICS
from pipeline.core.workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)

FIRST = ["model", "features", "split"]


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
    runs = tracking.workspace_runs(cfg)
    if runs.empty:
        raise WorkspaceError(
            f"no MLflow run for workspace {ws.root} in {tracking.tracking_uri(cfg)} (experiment "
            f"{tracking.experiment_name(cfg)}): run `python -m pipeline stage=train` first (same mlflow.tracking_uri).")
    if bool(cfg.compare.latest_only):
        runs = tracking.latest_per_config(runs)
    table = comparison_table(runs)
    reports = ws.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    shown = table.drop(columns=["run_id", "start_time"])
    table.to_csv(reports / "compare.csv", index=False)
    (reports / "compare.md").write_text(
        f"# Cost models of workspace {ws.name}\n\nTest part of each run's split; metrics defined in "
        f"models/metrics.py. MLflow: {tracking.tracking_uri(cfg)}, experiment {tracking.experiment_name(cfg)}.\n\n"
        + to_markdown(shown))
    chart = table.assign(run=table["model"] + "/" + table["features"] + "/" + table["split"])
    plots.save(plots.compare_chart(chart, [str(m) for m in cfg.compare.chart_metrics]), reports / "compare.png")
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        cols = FIRST + [c for c in shown.columns if c.startswith("test_") and c != "test_n_tasks"] + ["train_seconds"]
        print(f"\nstage=compare, workspace {ws.name}: {len(table)} runs (test part)")
        print(shown[cols].rename(columns=lambda c: c.replace("test_", "")).to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"written: {reports / 'compare.csv'}, compare.md, compare.png")
    return {"runs": len(table), "report": str(reports / "compare.md")}
