"""Figures of a training run and of the comparison.

Each function returns a matplotlib Figure made without pyplot (no display, no global
figure registry to clean up): `mlflow.log_figure` logs it, `save` writes it to a file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from models.metrics import peak_curve

DPI = 110


def save(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def predicted_vs_measured(frame: pd.DataFrame, scores: np.ndarray, title: str) -> Figure:
    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    codes = pd.factorize(frame["task_id"])[0]
    ax.scatter(frame["label"], scores, c=codes, cmap="tab20", s=10, alpha=0.7)
    ax.set_xlabel("measured normalized throughput (best of task = 1)")
    ax.set_ylabel("predicted score")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def topk_curve(frame: pd.DataFrame, scores: np.ndarray, title: str, kmax: int = 32) -> Figure:
    """Mean over tasks of peak score@k (best true throughput among the top-k predicted)."""
    curves = [peak_curve(g["label"].to_numpy(), scores[g.index.to_numpy()], kmax)
              for _, g in frame.reset_index(drop=True).groupby("task_id")]
    fig = Figure(figsize=(5.5, 4))
    ax = fig.subplots()
    ks = np.arange(1, kmax + 1)
    if curves:
        ax.plot(ks, np.mean(curves, axis=0), marker=".")
    ax.set_xlabel("k (records measured, in predicted order)")
    ax.set_ylabel("peak score@k (mean over tasks)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def importance(imp: pd.Series, title: str, top: int = 30) -> Figure:
    s = imp.head(top)[::-1]
    height = 0.25 * len(s) + 1.2
    fig = Figure(figsize=(7, height))
    ax = fig.subplots()
    ax.barh(s.index, s.values)
    ax.set_xlabel("total gain")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    fig.subplots_adjust(left=0.45, right=0.97, top=1 - 0.35 / height, bottom=0.5 / height)
    return fig


def learning_curves(info: dict) -> dict[str, list[float]]:
    """A model's curves from its training info, one value per epoch or boosting round: the
    MLP's train_loss and val_loss, a booster's validation metrics as val_<metric>, an
    ensemble's members' curves as <member>/<curve>."""
    series = {k: list(v) for k, v in info.items() if k in ("train_loss", "val_loss") and v}
    series.update({k if k.startswith("val_") else f"val_{k}": list(v) for k, v in info.get("val_curve", {}).items()
                   if v})
    for member, sub in (info.get("members") or {}).items():
        series.update({f"{member}/{k}": v for k, v in learning_curves(sub).items()})
    return series


def training_curve(info: dict, title: str) -> Figure | None:
    series = learning_curves(info)
    if not series:
        return None
    fig = Figure(figsize=(5.5, 4))
    ax = fig.subplots()
    for k, v in series.items():
        ax.plot(np.arange(1, len(v) + 1), v, label=k)
    ax.set_xlabel("epoch / boosting round")
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _interval(table: pd.DataFrame, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lower, upper) of `metric`: [min, max] columns where the table has them, else the mean."""
    v = table[metric].astype(float).to_numpy()
    lo = table[f"{metric}_min"].astype(float).to_numpy() if f"{metric}_min" in table else v
    hi = table[f"{metric}_max"].astype(float).to_numpy() if f"{metric}_max" in table else v
    return v, np.fmin(lo, v), np.fmax(hi, v)


def compare_chart(table: pd.DataFrame, metrics: list[str]) -> Figure:
    """A dot per run (model/features/split) and metric at the mean, its bar the [min, max] over
    the runs; a missing value is left out (and named in the title), never drawn as 0."""
    labels = table["run"].tolist()
    cols = [m for m in metrics if m in table.columns]
    y = np.arange(len(labels))[::-1]
    h = 0.8 / max(len(cols), 1)
    fig = Figure(figsize=(7, max(3.0, 0.35 * len(labels) * max(len(cols), 1) / 2 + 1.5)))
    ax = fig.subplots()
    missing = []
    for i, m in enumerate(cols):
        v, lo, hi = _interval(table, m)
        have = np.isfinite(v)
        missing += [f"{r}: {m}" for r, ok in zip(labels, have) if not ok]
        ax.errorbar(v[have], (y + 0.4 - h / 2 - i * h)[have], xerr=[(v - lo)[have], (hi - v)[have]],
                    fmt="o", ms=4, capsize=2, label=m.replace("test_", ""))
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=7)
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("test part: mean over runs, bars = [min, max]")
    note = f"; no value (not drawn): {len(missing)}" if missing else ""
    ax.set_title(f"per model/features/split{note}", fontsize=9)
    ax.legend(fontsize=7, ncol=min(len(cols), 4), loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def heldout_chart(table: pd.DataFrame, metric: str) -> Figure:
    """A dot per model and held-out network (and their mean) for `metric`, with the [min, max]
    spread of the table (over seeds; over networks for the mean) as its bar; a missing value
    is left out, never drawn as 0."""
    nets = list(dict.fromkeys(table["heldout"]))
    models = list(dict.fromkeys(table["model"] + "/" + table["features"]))
    label = table["model"] + "/" + table["features"]
    x = np.arange(len(nets))
    w = 0.8 / max(len(models), 1)
    fig = Figure(figsize=(max(6.0, 1.2 * len(nets) * max(len(models), 1) / 3), 4.5))
    ax = fig.subplots()
    for i, m in enumerate(models):
        rows = table[label == m].set_index("heldout").reindex(nets)
        v = rows[metric].astype(float).to_numpy()
        lo = np.clip(v - rows.get(f"{metric}_min", rows[metric]).astype(float).to_numpy(), 0, None)
        hi = np.clip(rows.get(f"{metric}_max", rows[metric]).astype(float).to_numpy() - v, 0, None)
        have = np.isfinite(v)
        ax.errorbar((x + i * w - 0.4 + w / 2)[have], v[have], yerr=[np.nan_to_num(lo[have]), np.nan_to_num(hi[have])],
                    fmt="o", ms=4, capsize=2, label=m)
    ax.set_xticks(x)
    ax.set_xticklabels(nets, fontsize=8)
    ax.set_ylabel(metric.replace("test_", "test ").replace("_", " "))
    ax.set_ylim(0, 1.05)
    ax.set_title("held-out networks: mean over seeds, bars = [min, max]; `mean`: over networks", fontsize=9)
    for edge in x[:-1] + 0.5:
        ax.axvline(edge, color="grey", lw=0.4, alpha=0.5)
    ax.legend(fontsize=7, ncol=min(len(models), 4), loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- a workspace's dataset

def dataset_overview(per_task: pd.DataFrame, latencies: pd.DataFrame, note: str = "") -> Figure:
    """Three panels over tasks: candidates, failures (build, run, wrong output) and the
    spread of the measured latencies (a box per task, log scale): what a model learns from."""
    fig = Figure(figsize=(11, max(3.0, 0.28 * len(per_task) + 1.4)), layout="constrained")
    ax_n, ax_f, ax_l = fig.subplots(1, 3, sharey=True)
    y = np.arange(len(per_task))[::-1]
    ax_n.barh(y, per_task["candidates"], color="tab:blue")
    ax_n.set_yticks(y)
    ax_n.set_yticklabels(per_task["task"], fontsize=7)
    ax_n.set_xlabel("candidates")
    left = np.zeros(len(per_task))
    for kind, color in (("build_failed", "tab:red"), ("run_failed", "tab:orange"), ("incorrect", "tab:purple")):
        ax_f.barh(y, per_task[kind], left=left, color=color, label=kind.replace("_", " "))
        left += per_task[kind].to_numpy()
    ax_f.set_xlabel("failed candidates")
    ax_f.legend(fontsize=7)
    groups = [latencies.loc[latencies["task"] == t, "latency_s"].to_numpy() * 1e6 for t in per_task["task"]]
    have = [i for i, g in enumerate(groups) if len(g)]
    if have:  # no task measured yet (e.g. a collect bundle exported before any timing): no boxes
        ax_l.boxplot([groups[i] for i in have], positions=y[have], orientation="horizontal", widths=0.6,
                     showfliers=True, flierprops={"markersize": 2}, manage_ticks=False)
        ax_l.set_xscale("log")
    ax_l.set_xlabel("latency (us), per candidate")
    for ax in (ax_n, ax_f, ax_l):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"dataset: candidates, failures and latency spread per task{note}", fontsize=10)
    return fig


def label_noise(pairs: pd.DataFrame, what: str) -> Figure:
    """Two timings of the same kernels (`first_s`, `second_s`), one dot per kernel, against the
    diagonal: how far the label of a kernel moves when it is timed again."""
    from models.metrics import latency_agreement

    fig = Figure(figsize=(5.5, 5))
    ax = fig.subplots()
    x, y = pairs["first_s"].to_numpy() * 1e6, pairs["second_s"].to_numpy() * 1e6
    codes = pd.factorize(pairs["task"])[0]
    ax.scatter(x, y, c=codes, cmap="tab20", s=8, alpha=0.7)
    lims = [min(x.min(), y.min()) * 0.9, max(x.max(), y.max()) * 1.1] if len(x) else [1, 10]
    ax.plot(lims, lims, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"first {what} (us)")
    ax.set_ylabel(f"second {what} (us)")
    accs = [latency_agreement(g["first_s"], g["second_s"])[0] for _, g in pairs.groupby("task") if len(g) > 1]
    ax.set_title(f"label noise: {len(pairs)} kernels, {pairs['task'].nunique()} tasks\npairwise accuracy "
                 f"{np.mean(accs) if accs else float('nan'):.3f} (mean over tasks)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
