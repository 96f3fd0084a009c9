"""Evaluation over many splits: training runs aggregated into tables with spreads.

A leave-one-network-out evaluation is one training run per (model, held-out network, seed)
(a Hydra sweep over `split.test_networks` and `seed`); a by_task evaluation one run per
(model, seed), each seed holding out other tasks. This module turns those runs (MLflow's
`search_runs` frame) into:

  heldout   one row per (features, model, held-out network): each metric's mean over seeds
            with its min and max, then one row per (features, model) with heldout "mean":
            the mean over held-out networks of those means, min and max over the networks
  by_split  one row per (features, model, split) over every run of it: mean over runs
            (seeds, held-out units) with min and max (by_task over seeds, etc.)
  ablation  one row per (features, model): the validation metric chosen for selection, per
            held-out network and on average, beside the test figures, ordered by validation

Test and validation figures sit side by side, but an order or a choice is made on the
validation columns only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ("model", "features", "split", "heldout", "seed")
#: metrics shown with their spread (test_ and val_ prefixes)
SPREAD_METRICS = ("top1_score", "top5_score", "pair_acc", "spearman")
COUNTS = ("n_tasks", "n_tasks_topk")
MEAN = "mean"


def run_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per training run: KEYS, then every val_/test_ metric the runs logged (float)."""
    out = pd.DataFrame({"model": runs["tags.model"], "features": runs["tags.features"], "split": runs["tags.split"],
                        "heldout": runs["tags.heldout"], "seed": runs["tags.split_seed"]})
    for col in runs.columns:
        if col.startswith(("metrics.val_", "metrics.test_")):
            out[col[len("metrics."):]] = runs[col].astype(float)
    for m in (*SPREAD_METRICS, *COUNTS):  # MLflow leaves out metrics that were NaN in every run
        for part in ("test", "val"):
            if f"{part}_{m}" not in out.columns:
                out[f"{part}_{m}"] = np.nan
    return out.reset_index(drop=True)


def _metric_columns(frame: pd.DataFrame, metrics, parts=("test", "val")) -> list[str]:
    cols = [f"{p}_{m}" for p in parts for m in metrics]
    return [c for c in cols if c in frame.columns]


def _spread(frame: pd.DataFrame, keys: list[str], cols: list[str], count: str) -> pd.DataFrame:
    """Per group of `keys`: mean, min and max of each column, and the number of rows (`count`)."""
    g = frame.groupby(keys, sort=True, dropna=False)
    out = g[cols].mean()
    out = out.join(g[cols].min().add_suffix("_min")).join(g[cols].max().add_suffix("_max"))
    out[count] = g.size()
    return out.reset_index()


def heldout_table(frame: pd.DataFrame, metrics=SPREAD_METRICS) -> pd.DataFrame:
    """Leave-one-network-out rows (see the module docstring) from the by_network runs."""
    runs = frame[frame["split"] == "by_network"]
    if runs.empty:
        return pd.DataFrame()
    cols = _metric_columns(runs, metrics)
    counts = _metric_columns(runs, COUNTS, parts=("test",))
    per_net = _spread(runs, ["features", "model", "heldout"], cols + counts, "n_seeds")
    per_net = per_net.drop(columns=[f"{c}{s}" for c in counts for s in ("_min", "_max")])
    means = _spread(per_net, ["features", "model"], cols, "n_heldout")
    for c in counts:
        means[c] = per_net.groupby(["features", "model"], sort=True)[c].sum().to_numpy()
    means["heldout"] = MEAN
    means["n_seeds"] = per_net.groupby(["features", "model"], sort=True)["n_seeds"].min().to_numpy()
    per_net["n_heldout"] = 1
    out = pd.concat([per_net, means], ignore_index=True)
    out["_last"] = out["heldout"] == MEAN
    out = out.sort_values(["features", "_last", "heldout", "model"]).drop(columns="_last")
    return out.reset_index(drop=True)


def split_table(frame: pd.DataFrame, metrics=SPREAD_METRICS) -> pd.DataFrame:
    """Every run of each (features, model, split), over seeds and held-out units."""
    if frame.empty:
        return pd.DataFrame()
    cols = _metric_columns(frame, metrics) + _metric_columns(frame, COUNTS, parts=("test",))
    return _spread(frame, ["split", "features", "model"], cols, "n_runs")


def ablation_table(heldout: pd.DataFrame, select: str, reference: str | None = "ms_xgb",
                   also: tuple[str, ...] = ("val_pair_acc", "test_top1_score", "test_pair_acc")) -> pd.DataFrame:
    """One row per (features, model) of a heldout_table: `select` (a val_ metric) per held-out
    network and on average, the `also` columns on average, and against `reference` the number
    of held-out networks where the model's `select` beats it; ordered by the average `select`."""
    if heldout.empty or select not in heldout.columns:
        return pd.DataFrame()
    nets = heldout[heldout["heldout"] != MEAN]
    wide = nets.set_index(["features", "model", "heldout"])[select].unstack("heldout")
    wide.columns = [f"{select}.{c}" for c in wide.columns]
    means = heldout[heldout["heldout"] == MEAN].set_index(["features", "model"])
    out = wide.join(means[[select, *[c for c in also if c in means.columns], "n_heldout", "n_seeds"]])
    if reference is not None:
        ref = nets[nets["model"] == reference].set_index(["features", "heldout"])[select]
        won = nets.assign(_ref=[ref.get((f, h), np.nan) for f, h in zip(nets["features"], nets["heldout"])])
        won = won.assign(_win=won[select] > won["_ref"]).groupby(["features", "model"])["_win"].sum()
        out[f"beats_{reference}"] = won.reindex(out.index).astype("Int64")
    return out.sort_values(select, ascending=False, na_position="last").reset_index()


def with_spread(table: pd.DataFrame, cols: list[str], digits: int = 3) -> pd.DataFrame:
    """`cols` as text "mean [min, max]" (one value where min = max), for reports."""
    out = table.copy()
    for c in cols:
        if c not in out.columns:
            continue
        lo, hi = out.get(f"{c}_min"), out.get(f"{c}_max")
        text = []
        for i, v in enumerate(out[c]):
            if pd.isna(v):
                text.append("")
            elif lo is None or pd.isna(lo.iloc[i]) or np.isclose(lo.iloc[i], hi.iloc[i]):
                text.append(f"{v:.{digits}f}")
            else:
                text.append(f"{v:.{digits}f} [{lo.iloc[i]:.{digits}f}, {hi.iloc[i]:.{digits}f}]")
        out[c] = text
    return out.drop(columns=[f"{c}{s}" for c in cols for s in ("_min", "_max") if f"{c}{s}" in out.columns])
