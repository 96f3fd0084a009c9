"""Cost-model metrics, per task and aggregated (TenSet's and MetaSchedule's definitions).

Every function takes arrays aligned by row: the task of each record, its label (normalized
throughput = best latency of its task / its latency, so 1.0 is the best record of the task)
and the model's score (higher = predicted faster). Scores of ranking models are not on the
throughput scale: their RMSE and R² are reported as NaN (`calibrated=False`).

Per task (then averaged over tasks with equal weight):
  rmse, r2          on normalized throughput (calibrated models only)
  spearman, kendall rank correlation of score and label (NaN for a task with constant labels)
  pair_acc          fraction of record pairs with different labels that the score orders right
  peak1, peak5      TenSet's peak score@k: best label among the k best-scored records / best label
  recall32of128     the published ncu-feature convention: sample 128 records of a task, the fraction
                    of the true top-32 found in the predicted top-32, averaged over `draws` samples;
                    tasks with fewer than 128 records are skipped (NaN when no task qualifies)
  recall25pct       the same idea for every task with at least 4 records: k = ceil(n/4) of all n
Over groups of tasks (TenSet's weighted score, e.g. per held-out network):
  top1_score, top5_score   sum(w * best latency) / sum(w * latency of the best of the top-k
                    predicted), averaged over the groups; w = task weight (calls per network).
                    A workspace without networks (the operator suite) is one group.
  random_top1_score, random_top5_score   the same score for a pick of k records at random:
                    its expected latency in the denominator, computed exactly (no draw).

Top-k figures (peak1, peak5, top1_score, top5_score) count only tasks with at least
`topk_min_records` evaluated records: the best of 6 records says little about picking the
best of a design space. `n_tasks_topk` says how many tasks counted. `topk_pair_acc` is
pair_acc over those same tasks: pair_acc itself averages every task with a pair, and a
network of many two-record tasks (elementwise ops with one or two schedules) fills it with
tasks the top-k figures leave out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import gammaln

TASK_METRICS = ("rmse", "r2", "spearman", "kendall", "pair_acc", "peak1", "peak5", "recall32of128", "recall25pct")
GROUP_METRICS = ("top1_score", "top5_score")
# A random pick's top-k scores on the same records (exact expectation, not a draw): the row
# every table needs beside the models' to tell a figure from chance.
RANDOM_METRICS = ("random_top1_score", "random_top5_score")
ALL_METRICS = TASK_METRICS + GROUP_METRICS
#: what a model may early-stop on: its own loss, or `ranking_metric` of the validation part
STOP_METRICS = ("loss", "peak1", "peak5", "apeak32", "pair_acc")


def peak_score(labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Best label among the k best-scored records, divided by the best label."""
    labels = np.asarray(labels, dtype=np.float64)
    if len(labels) == 0 or labels.max() <= 0:
        return float("nan")
    top = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]
    return float(labels[top].max() / labels.max())


def peak_curve(labels: np.ndarray, scores: np.ndarray, kmax: int) -> np.ndarray:
    """peak_score for k = 1..kmax (the last value repeats once k exceeds the record count)."""
    labels = np.asarray(labels, dtype=np.float64)
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    best = np.maximum.accumulate(labels[order]) / labels.max()
    out = np.full(kmax, best[-1])
    out[: min(kmax, len(best))] = best[:kmax]
    return out


def pairwise_accuracy(labels: np.ndarray, scores: np.ndarray) -> float:
    """Fraction of pairs with different labels whose scores are ordered the same way (ties = 0.5)."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    dy = np.sign(y[:, None] - y[None, :])
    ds = np.sign(s[:, None] - s[None, :])
    mask = np.triu(dy != 0, 1)
    n = mask.sum()
    if n == 0:
        return float("nan")
    agree = (dy == ds)[mask].sum() + 0.5 * (ds == 0)[mask].sum()
    return float(agree / n)


def latency_agreement(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """How two measurements of the same records agree, `second` taken as the truth:
    (pairwise accuracy, top-1 score of the record `first` ranks fastest)."""
    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    return pairwise_accuracy(1.0 / second, 1.0 / first), peak_score(1.0 / second, 1.0 / first, 1)


def topk_recall(labels: np.ndarray, scores: np.ndarray, k: int) -> float:
    """Fraction of the true top-k records that are in the predicted top-k."""
    true_top = set(np.argsort(-np.asarray(labels), kind="stable")[:k])
    pred_top = set(np.argsort(-np.asarray(scores), kind="stable")[:k])
    return len(true_top & pred_top) / k


def sampled_topk_recall(labels, scores, sample: int = 128, k: int = 32, draws: int = 10, seed: int = 0) -> float:
    """topk_recall on `draws` random subsets of `sample` records; NaN when there are fewer records."""
    labels, scores = np.asarray(labels), np.asarray(scores)
    if len(labels) < sample:
        return float("nan")
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(draws):
        idx = rng.choice(len(labels), size=sample, replace=False)
        vals.append(topk_recall(labels[idx], scores[idx], k))
    return float(np.mean(vals))


def ranking_metric(name: str, scores: np.ndarray, labels: np.ndarray, task_codes: np.ndarray) -> float:
    """Mean over tasks of a ranking metric of `scores` (higher is better): peak1, peak5,
    apeak32 (the mean of peak score@1..32) or pair_acc."""
    vals = []
    for t in np.unique(task_codes):
        rows = task_codes == t
        y, s = labels[rows], scores[rows]
        if name == "pair_acc":
            v = pairwise_accuracy(y, s)
        else:
            curve = peak_curve(y, s, {"peak1": 1, "peak5": 5, "apeak32": 32}[name])
            v = curve[-1] if name != "apeak32" else curve.mean()
        if np.isfinite(v):
            vals.append(v)
    return float(np.mean(vals)) if vals else float("nan")


def _corr(fn, y, s) -> float:
    if len(y) < 2 or np.ptp(y) == 0 or np.ptp(s) == 0:
        return float("nan")
    return float(fn(y, s).statistic)


def r2(y: np.ndarray, p: np.ndarray) -> float:
    """Coefficient of determination (NaN with fewer than 2 labels, equal labels, or a NaN
    among them, as RMSE is)."""
    if len(y) < 2:
        return float("nan")
    ss = float(np.sum((y - y.mean()) ** 2))
    return float(1.0 - np.sum((y - p) ** 2) / ss) if ss > 0 else float("nan")


def task_metrics(labels: np.ndarray, scores: np.ndarray, calibrated: bool = True, seed: int = 0) -> dict[str, float]:
    """Every per-task metric for one task's records."""
    y = np.asarray(labels, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    out = {}
    if calibrated:
        out["rmse"] = float(np.sqrt(np.mean((s - y) ** 2)))
        out["r2"] = r2(y, s)
    else:
        out["rmse"] = out["r2"] = float("nan")
    out["spearman"] = _corr(stats.spearmanr, y, s)
    out["kendall"] = _corr(stats.kendalltau, y, s)
    out["pair_acc"] = pairwise_accuracy(y, s)
    out["peak1"] = peak_score(y, s, 1)
    out["peak5"] = peak_score(y, s, 5)
    out["recall32of128"] = sampled_topk_recall(y, s, seed=seed)
    out["recall25pct"] = topk_recall(y, s, math.ceil(len(y) / 4)) if len(y) >= 4 else float("nan")
    return out


def expected_random_best(latencies: np.ndarray, k: int) -> float:
    """E[min latency of k records drawn at random without replacement], exactly: with the
    latencies sorted, the i-th best (1-based) is the best of the draw with probability
    C(n - i, k - 1) / C(n, k)."""
    lat = np.sort(np.asarray(latencies, dtype=np.float64))
    n = len(lat)
    if n == 0:
        return float("nan")
    k = min(int(k), n)
    i = np.arange(1, n + 1)
    # log C(n - i, k - 1) - log C(n, k), zero where n - i < k - 1
    def logc(a, b):
        return gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1)

    ok = (n - i) >= (k - 1)
    p = np.zeros(n)
    p[ok] = np.exp(logc(n - i[ok], k - 1) - logc(n, k))
    return float(np.dot(p, lat))


def network_time_shares(weight: pd.Series, best_s: pd.Series, by) -> pd.Series:
    """Each task's share of its network's best-case time: calls (`weight`) x best latency,
    over the sum of the same within its network (`by`: the grouping keys)."""
    time = weight.astype(np.float64) * best_s.astype(np.float64)
    return time / time.groupby(by).transform("sum")


def weighted_topk_score(frame: pd.DataFrame, k: int) -> float:
    """TenSet's score for one group of tasks: sum(w*best latency) / sum(w*latency at top-k).

    `frame` has columns task_id, mean_s, score, weight; the best latency of a task is the
    best among the evaluated records, the latency at top-k the best among its k best-scored."""
    best = achieved = 0.0
    for _, g in frame.groupby("task_id", sort=False):
        w = float(g["weight"].iloc[0])
        lat = g["mean_s"].to_numpy(dtype=np.float64)
        top = np.argsort(-g["score"].to_numpy(dtype=np.float64), kind="stable")[:k]
        achieved += w * lat[top].min()
        best += w * lat.min()
    return best / achieved if achieved > 0 else float("nan")


@dataclass
class Evaluation:
    """Metrics of one model on one set of records."""

    per_task: pd.DataFrame  # one row per task: task_id, n, topk (counted), best_s, top1_s, top5_s, every TASK_METRIC
    per_group: pd.DataFrame  # one row per group (network): group, n_tasks, n_tasks_topk, top1_score, top5_score
    summary: dict[str, float]  # mean over tasks / groups, plus counts

    def prefixed(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_{k}": v for k, v in self.summary.items()}


def evaluate(frame: pd.DataFrame, scores: np.ndarray, calibrated: bool = True, seed: int = 0,
             members: pd.DataFrame | None = None, topk_min_records: int = 0) -> Evaluation:
    """Metrics for the records of `frame` (columns task_id, label, mean_s; weight and group
    unless `members` is given).

    `label` is the training label (normalized over all of a task's records in the workspace),
    so RMSE and R² compare like with like; peak scores and weighted top-k scores divide by the
    best record among the evaluated ones, as TenSet's do. A group is the set of tasks a
    weighted top-k score is taken over (a network; one group where there are no networks);
    `members` (task_id, group, weight) lets a task count in several networks, each with its
    own weight, else the frame's group and weight columns say it. Top-k figures count only
    tasks with at least `topk_min_records` records here (see the module docstring); the
    per-task table keeps each task's best latency and the latency of its top-1 and top-5
    picks (best_s, top1_s, top5_s), from which a group's score can be recomputed."""
    if len(frame) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(frame)} records")
    df = frame[["task_id", "label", "mean_s"]].copy()
    df["score"] = np.asarray(scores, dtype=np.float64)
    if members is None:
        members = frame[["task_id", "group", "weight"]].drop_duplicates(["task_id", "group"])
    rows = []
    for tid, g in df.groupby("task_id", sort=True):
        y, s, lat = g["label"].to_numpy(), g["score"].to_numpy(), g["mean_s"].to_numpy(dtype=np.float64)
        m = task_metrics(y, s, calibrated=calibrated, seed=seed)
        order = np.argsort(-s, kind="stable")
        rows.append({"task_id": tid, "n": len(g), "topk": len(g) >= topk_min_records, "best_s": lat.min(),
                     "top1_s": lat[order[:1]].min(), "top5_s": lat[order[:5]].min(),
                     "random_top1_s": float(lat.mean()), "random_top5_s": expected_random_best(lat, 5), **m})
    per_task = pd.DataFrame(rows, columns=["task_id", "n", "topk", "best_s", "top1_s", "top5_s", "random_top1_s",
                                           "random_top5_s", *TASK_METRICS])
    counted = set(per_task.loc[per_task["topk"], "task_id"])
    grouped = df[df["task_id"].isin(counted)].merge(members[["task_id", "group", "weight"]], on="task_id", how="inner")
    all_groups = members.loc[members["task_id"].isin(set(per_task["task_id"])), ["task_id", "group"]]
    grows = []
    for name, g in all_groups.groupby("group", sort=True):
        sub = grouped[grouped["group"] == name]
        picks = per_task[per_task["task_id"].isin(set(sub["task_id"]))].merge(
            members.loc[members["group"] == name, ["task_id", "weight"]], on="task_id")
        grows.append({"group": name, "n_tasks": g["task_id"].nunique(), "n_tasks_topk": sub["task_id"].nunique(),
                      "top1_score": weighted_topk_score(sub, 1), "top5_score": weighted_topk_score(sub, 5),
                      **{f"random_top{k}_score": group_score(picks, f"random_top{k}_s") for k in (1, 5)}})
    per_group = pd.DataFrame(grows, columns=["group", "n_tasks", "n_tasks_topk", *GROUP_METRICS, *RANDOM_METRICS])
    summary = {m: _nanmean(per_task[m]) for m in TASK_METRICS}
    for m in ("peak1", "peak5"):
        summary[m] = _nanmean(per_task.loc[per_task["topk"], m])
    summary["topk_pair_acc"] = _nanmean(per_task.loc[per_task["topk"], "pair_acc"])
    summary.update({m: _nanmean(per_group[m]) for m in (*GROUP_METRICS, *RANDOM_METRICS)})
    summary["n_records"] = float(len(df))
    summary["n_tasks"] = float(len(per_task))
    summary["n_tasks_topk"] = float(len(counted))
    summary["n_tasks_recall32of128"] = float(per_task["recall32of128"].notna().sum())
    return Evaluation(per_task, per_group, summary)


def group_score(per_task: pd.DataFrame, picked: str) -> float:
    """TenSet's weighted score from per-task latencies: sum(w * best_s) / sum(w * `picked`)
    (`picked`: top1_s, top5_s, random_top1_s, ...; columns task_id, weight, best_s)."""
    w = per_task["weight"].to_numpy(dtype=np.float64)
    achieved = float(np.dot(w, per_task[picked].to_numpy(dtype=np.float64)))
    return float(np.dot(w, per_task["best_s"].to_numpy(dtype=np.float64)) / achieved) if achieved > 0 else float("nan")


def _nanmean(col: pd.Series) -> float:
    vals = col.to_numpy(dtype=np.float64)
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if len(vals) else float("nan")
