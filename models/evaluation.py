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

from models.metrics import network_time_shares

KEYS = ("model", "features", "split", "heldout", "seed")
#: metrics shown with their spread (test_ and val_ prefixes)
SPREAD_METRICS = ("top1_score", "top5_score", "pair_acc", "topk_pair_acc", "spearman")
COUNTS = ("n_tasks", "n_tasks_topk")
MEAN = "mean"
REFERENCE = "ms_xgb"  # the model every paired interval is taken against
LEVEL = 0.90


RANDOM = "random"


def with_random_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` (run_frame) with a `random` model row per (features, split, heldout, seed):
    a random pick's exact expected top-k scores on the same test records (the runs' own
    test_random_* metrics), pairwise accuracy 0.5 (on every task and on the top-k tasks) and
    rank correlation 0 by definition."""
    if frame.empty or "test_random_top1_score" not in frame.columns:
        return frame
    keys = ["features", "split", "heldout", "seed"]
    runs = frame.dropna(subset=["test_random_top1_score"]).drop_duplicates(keys)
    if runs.empty:
        return frame
    rows = runs[keys].assign(model=RANDOM, test_top1_score=runs["test_random_top1_score"],
                             test_top5_score=runs.get("test_random_top5_score"), test_pair_acc=0.5,
                             test_topk_pair_acc=0.5, test_spearman=0.0, test_n_tasks=runs.get("test_n_tasks"),
                             test_n_tasks_topk=runs.get("test_n_tasks_topk"))
    return pd.concat([frame, rows], ignore_index=True)


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


RUN_METRICS = ("val_top1_score", "val_pair_acc", "test_top1_score", "test_pair_acc")


def bootstrap_interval(x: np.ndarray, resamples: int, level: float, seed: int) -> tuple[float, float]:
    """The central `level` interval of the mean of `x` over `resamples` bootstrap resamples."""
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    boot = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(1)
    lo, hi = np.quantile(boot, q)
    return float(lo), float(hi)


def _paired(g: pd.DataFrame, column: str, todo: list[tuple[str, str]], metrics, resamples: int, level: float,
            seed: int) -> list[dict]:
    """For each (a, b) of `todo`, values of `column`, and each metric: a minus b over the runs
    both have (same held-out part and seed), its mean, bootstrap interval and runs won; pairs
    with fewer than two runs are left out."""
    rows = []
    for metric in (m for m in metrics if m in g.columns):
        wide = g.pivot_table(index=["heldout", "seed"], columns=column, values=metric)
        for a, b in todo:
            if a not in wide.columns or b not in wide.columns:
                continue
            x = (wide[a] - wide[b]).dropna().to_numpy()
            if len(x) < 2:  # one run has no spread to bootstrap: its difference is in the tables
                continue
            lo, hi = bootstrap_interval(x, resamples, level, seed)
            rows.append({"a": a, "b": b, "metric": metric, "diff": float(x.mean()), "lo": lo, "hi": hi,
                         "won": int((x > 0).sum()), "n_runs": len(x)})
    return rows


def paired_over_runs(frame: pd.DataFrame, select: str, pairs: list[tuple[str, str]] = (),
                     metrics: tuple[str, ...] = RUN_METRICS, *, resamples: int = 5000, level: float = LEVEL,
                     seed: int = 0) -> pd.DataFrame:
    """Margins paired over runs: per split and features, the model of the best mean `select`
    (the choice; `REFERENCE` is what candidates are measured against, never the choice while
    another model has runs) minus every other model, then each (model, reference) of `pairs`;
    for each metric the mean over the runs both have (same held-out part and seed: a network
    left out, or by_task's held-out tasks of that seed) of the difference, a bootstrap interval
    over those runs and the runs won. What the choice's margin on validation is worth, which
    the means cannot say. Rows: split, features, model, reference, metric, diff, lo, hi, won, n_runs."""
    cols = ["split", "features", "model", "reference", "metric", "diff", "lo", "hi", "won", "n_runs"]
    runs = frame[frame["model"] != RANDOM] if len(frame) else frame
    if runs.empty or select not in runs.columns:
        return pd.DataFrame(columns=cols)
    rows = []
    for (split, features), g in runs.groupby(["split", "features"], sort=True):
        means = g.groupby("model")[select].mean().dropna()
        if means.empty:
            continue
        candidates = means.drop(REFERENCE, errors="ignore")
        choice = (candidates if len(candidates) else means).idxmax()
        todo = [(choice, m) for m in means.sort_values(ascending=False).index if m != choice] + list(pairs)
        todo = list(dict.fromkeys(todo))  # a named pair that is the choice's own is margined once
        rows += [{"split": split, "features": features, "model": r.pop("a"), "reference": r.pop("b"), **r}
                 for r in _paired(g, "model", todo, metrics, resamples, level, seed)]
    return pd.DataFrame(rows, columns=cols)


FEATURE_METRICS = ("test_top1_score", "test_pair_acc", "test_spearman")


def feature_margins(frame: pd.DataFrame, metrics: tuple[str, ...] = FEATURE_METRICS, *, base: str = "static",
                    resamples: int = 5000, level: float = LEVEL, seed: int = 0) -> pd.DataFrame:
    """What a feature set buys, per split: each model on every other feature set minus the
    same model on `base`, then each (model, features) minus `REFERENCE` (on its own static
    features); for each metric the mean over the runs both have (same held-out part and
    seed) of the difference, a bootstrap interval over those runs and the runs won.
    Rows: split, model, features, reference, metric, diff, lo, hi, won, n_runs."""
    cols = ["split", "model", "features", "reference", "metric", "diff", "lo", "hi", "won", "n_runs"]
    runs = frame[frame["model"] != RANDOM] if len(frame) else frame
    if runs.empty or runs["features"].nunique() < 2:
        return pd.DataFrame(columns=cols)
    rows = []
    for split, g in runs.groupby("split", sort=True):
        g = g.assign(arm=g["model"] + "/" + g["features"])
        arms = sorted(set(g["arm"]))
        todo = [(a, a.split("/")[0] + "/" + base) for a in arms if not a.endswith("/" + base)]
        todo += [(a, f"{REFERENCE}/{base}") for a in arms if not a.startswith(REFERENCE + "/")]
        for r in _paired(g, "arm", todo, metrics, resamples, level, seed):
            model, features = r.pop("a").split("/")
            rows.append({"split": split, "model": model, "features": features, "reference": r.pop("b"), **r})
    return pd.DataFrame(rows, columns=cols)


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


# ---------------------------------------------------------------------- paired intervals



def _scores(best: np.ndarray, picked: np.ndarray, w: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """TenSet's weighted score of each resample: rows of `idx` are task positions."""
    return (w[idx] * best[..., idx]).sum(-1) / (w[idx] * picked[..., idx]).sum(-1)


def paired_intervals(per_task: pd.DataFrame, weights: pd.DataFrame, *, reference: str = REFERENCE,
                     metric: str = "top1", resamples: int = 2000, level: float = LEVEL,
                     seed: int = 0) -> pd.DataFrame:
    """Each model minus `reference` on the same held-out tasks: the difference of TenSet's
    top-k score (`metric` top1 | top5 | random_top1 ...) with a paired bootstrap interval over
    tasks.

    `per_task`: one row per (features, model, heldout, seed, task_id) with best_s and
    `<metric>_s`, only the tasks that the top-k figures count; `weights`: (heldout, task_id,
    weight), the calls of each task in its held-out network. The tasks of a network are
    resampled with replacement, the same resample for both models and every seed; the
    difference is the mean over seeds of the two scores' difference. The `mean` row of a
    (features, model) averages the networks' differences, each network resampled on its own.
    Rows: features, model, heldout, diff, lo, hi, n_tasks, n_seeds."""
    col = f"{metric}_s"
    if per_task.empty or col not in per_task.columns:
        return pd.DataFrame()
    rng = np.random.default_rng(seed)
    q = [(1 - level) / 2, 1 - (1 - level) / 2]
    rows, draws = [], {}
    for (features, heldout), g in per_task.groupby(["features", "heldout"], sort=True):
        tasks = sorted(set(g["task_id"]))
        w = weights[weights["heldout"] == heldout].set_index("task_id")["weight"].reindex(tasks).fillna(1.0)
        w = w.to_numpy(dtype=np.float64)
        idx = rng.integers(0, len(tasks), size=(resamples, len(tasks)))
        ref = _seed_task_matrix(g, reference, tasks, col)
        if ref is None:
            continue
        for model in sorted(set(g["model"]) - {reference}):
            mine = _seed_task_matrix(g, model, tasks, col)
            if mine is None:
                continue
            seeds = sorted(set(mine[2]) & set(ref[2]))
            if not seeds:
                continue
            a = [mine[2].index(s) for s in seeds]
            r = [ref[2].index(s) for s in seeds]
            full = np.arange(len(tasks))[None, :]
            point = (_scores(mine[0][a], mine[1][a], w, full) - _scores(ref[0][r], ref[1][r], w, full)).mean()
            boot = np.stack([_scores(mine[0][a][i], mine[1][a][i], w, idx) - _scores(ref[0][r][j], ref[1][r][j], w, idx)
                             for i, j in zip(range(len(a)), range(len(r)))]).mean(0)
            draws.setdefault((features, model), []).append((point, boot))
            lo, hi = np.quantile(boot, q)
            rows.append({"features": features, "model": model, "heldout": heldout, "diff": float(point),
                         "lo": float(lo), "hi": float(hi), "n_tasks": len(tasks), "n_seeds": len(seeds)})
    rows += _mean_rows(draws, rows, q)
    return pd.DataFrame(rows, columns=["features", "model", "heldout", "diff", "lo", "hi", "n_tasks", "n_seeds"])


def per_task_scores(per_task: pd.DataFrame, weights: pd.DataFrame, *, reference: str = REFERENCE) -> pd.DataFrame:
    """Where a held-out network's weighted top-1 score is won or lost, task by task: each
    task's top-1 score (best_s / top1_s) per model, mean over seeds; its share of the
    network's best-case time (weight x best_s, the weighting of TenSet's score); its share of
    the time the model's first picks take (weight x top1_s; per seed, then the mean), which
    shows a task whose slow picks dominate a pass although its best case is a sliver; and the
    score minus `reference`'s on the same task (empty where the reference has no run).

    `per_task` and `weights` as for `paired_intervals`. Rows: features, heldout, model,
    task_id, weight, share, picked_share, score, minus_<reference>, n_seeds; the largest share
    first."""
    minus = f"minus_{reference}"
    columns = ["features", "heldout", "model", "task_id", "weight", "share", "picked_share", "score", minus, "n_seeds"]
    if per_task.empty or "top1_s" not in per_task.columns:
        return pd.DataFrame(columns=columns)
    keys = ["features", "heldout", "task_id"]
    df = per_task.merge(weights, on=["heldout", "task_id"], how="left")
    df = df.assign(weight=df["weight"].fillna(1.0), score=df["best_s"] / df["top1_s"])
    df["picked_share"] = network_time_shares(df["weight"], df["top1_s"],
                                             [df["features"], df["heldout"], df["model"], df["seed"]])
    out = df.groupby([*keys, "model"], as_index=False).agg(
        weight=("weight", "first"), best_s=("best_s", "mean"), picked_share=("picked_share", "mean"),
        score=("score", "mean"), n_seeds=("seed", "nunique"))
    out["share"] = network_time_shares(out["weight"], out["best_s"], [out["features"], out["heldout"], out["model"]])
    ref = out[out["model"] == reference].set_index(keys)["score"]
    out[minus] = out["score"].to_numpy() - ref.reindex(pd.MultiIndex.from_frame(out[keys])).to_numpy()
    out = out.sort_values(["features", "heldout", "model", "share"], ascending=[True, True, True, False])
    return out[columns].reset_index(drop=True)


def _seed_task_matrix(g: pd.DataFrame, model: str, tasks: list, col: str):
    """(best_s, `col`) of `model` as seed x task arrays and the seeds, or None when a task lacks a score."""
    m = g[g["model"] == model].pivot_table(index="seed", columns="task_id", values=["best_s", col])
    if m.empty or m["best_s"].reindex(columns=tasks).isna().any().any():
        return None
    return m["best_s"].reindex(columns=tasks).to_numpy(), m[col].reindex(columns=tasks).to_numpy(), list(m.index)


def _mean_rows(draws: dict, rows: list[dict], q: list[float]) -> list[dict]:
    """The `mean` row of each (features, model) held out on two networks or more: the networks'
    differences averaged, each network's bootstrap draws averaged alike."""
    out = []
    for (features, model), parts in sorted(draws.items()):
        if len(parts) < 2:
            continue
        point = float(np.mean([p for p, _ in parts]))
        boot = np.mean([b for _, b in parts], axis=0)
        lo, hi = np.quantile(boot, q)
        mine = [r for r in rows if r["model"] == model and r["features"] == features]
        out.append({"features": features, "model": model, "heldout": MEAN, "diff": point, "lo": float(lo),
                    "hi": float(hi), "n_tasks": int(sum(r["n_tasks"] for r in mine)),
                    "n_seeds": min(r["n_seeds"] for r in mine)})
    return out
