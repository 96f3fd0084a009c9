"""Tables and curves of a tuning comparison (stage=tune): pure functions of the trial table.

Trial table: one row per measured trial, columns task, cost_model, seed, trial (1-based
within the task's run), batch, latency_s (null when the build or run failed), elapsed_s.
Run table: one row per (task, cost_model, seed) tuning run with wall_s and error.

Summary, in the style of published tuning benchmarks: best latency, GFLOPS, trials,
tuning minutes, speedup over the baseline (MetaSchedule's XGBModel: baseline latency /
latency), and the number of trials each cost model needs to reach the best latency the
baseline reached with its full budget (null = not reached).

`write` turns a comparison's tables into the report files: <prefix>.csv (summary),
<prefix>_runs.csv, <prefix>_trials.csv, <prefix>_curves.png, <prefix>.md and, for a network,
<prefix>_network.csv and <prefix>_network.png.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from models import plots

KEYS = ["task", "cost_model", "seed"]
# One color per cost model in every figure (ours first).
COLORS = {"ours": "tab:blue", "xgb": "tab:green", "mlp": "tab:purple", "random": "tab:orange"}
ORDER = list(COLORS)


def _ordered(names) -> list:
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def curves(trials: pd.DataFrame) -> pd.DataFrame:
    """Best latency so far after every trial, per run (failed trials carry the best on)."""
    if trials.empty:
        return pd.DataFrame(columns=[*KEYS, "trial", "batch", "best_s", "elapsed_s"])
    t = trials.sort_values([*KEYS, "trial"]).copy()
    lat = t["latency_s"].astype(float).where(t["latency_s"].astype(float) > 0)
    t["best_s"] = lat.fillna(np.inf).groupby([t[k] for k in KEYS]).cummin().replace(np.inf, np.nan)
    return t[[*KEYS, "trial", "batch", "best_s", "elapsed_s"]].reset_index(drop=True)


def batch_curves(trials: pd.DataFrame) -> pd.DataFrame:
    """Best latency after every batch of trials (the last trial of each batch)."""
    c = curves(trials)
    return c.groupby([*KEYS, "batch"], as_index=False).last()


def trials_to_reach(curve: pd.DataFrame, target_s: float, tolerance: float = 0.0) -> float:
    """First trial whose best-so-far is within `tolerance` of `target_s` (NaN if never)."""
    if not np.isfinite(target_s):
        return float("nan")
    hit = curve[curve["best_s"] <= target_s * (1.0 + tolerance)]
    return float(hit["trial"].iloc[0]) if len(hit) else float("nan")


def per_run(trials: pd.DataFrame, runs: pd.DataFrame, flops: dict, baseline: str = "xgb",
            tolerance: float = 0.0) -> pd.DataFrame:
    """One row per (task, cost_model, seed): best latency, GFLOPS, trials, minutes, speedup, reach."""
    c = curves(trials)
    rows = []
    for _, r in runs.iterrows():
        key = (r["task"], r["cost_model"], r["seed"])
        mine = c[(c["task"] == key[0]) & (c["cost_model"] == key[1]) & (c["seed"] == key[2])]
        base = c[(c["task"] == key[0]) & (c["cost_model"] == baseline) & (c["seed"] == key[2])]
        best = float(mine["best_s"].min()) if len(mine) and mine["best_s"].notna().any() else float("nan")
        base_best = float(base["best_s"].min()) if len(base) and base["best_s"].notna().any() else float("nan")
        n_ok = int(trials[(trials["task"] == key[0]) & (trials["cost_model"] == key[1]) & (trials["seed"] == key[2])]
                   ["latency_s"].notna().sum())
        f = float(flops.get(key[0], float("nan")))
        rows.append({
            "task": key[0], "cost_model": key[1], "seed": key[2], "trials": int(len(mine)), "valid_trials": n_ok,
            "best_latency_us": best * 1e6, "gflops": f / best / 1e9 if best > 0 and np.isfinite(f) else float("nan"),
            "tuning_min": float(r.get("wall_s", float("nan"))) / 60.0,
            f"speedup_vs_{baseline}": base_best / best if best > 0 else float("nan"),
            f"trials_to_{baseline}_best": trials_to_reach(mine, base_best, tolerance),
            "error": r.get("error"),
        })
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, baseline: str = "xgb") -> pd.DataFrame:
    """Mean over seeds of the per-run table (reach: mean of the seeds that reached it, and how many did)."""
    if table.empty:
        return table
    reach = f"trials_to_{baseline}_best"
    g = table.groupby(["task", "cost_model"], sort=False)
    out = g.agg(seeds=("seed", "nunique"), trials=("trials", "max"), valid_trials=("valid_trials", "mean"),
                best_latency_us=("best_latency_us", "mean"), gflops=("gflops", "mean"),
                tuning_min=("tuning_min", "mean"), **{f"speedup_vs_{baseline}": (f"speedup_vs_{baseline}", "mean"),
                                                       reach: (reach, "mean")},
                reached=(reach, lambda s: int(s.notna().sum()))).reset_index()
    return out


def markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table, numbers with 3 significant digits, missing values empty."""
    if df.empty:
        return "(no rows)\n"
    cells = df.astype(object).where(df.notna(), None)  # NaN too is a missing value
    return cells.to_markdown(index=False, tablefmt="github", floatfmt=".3g", missingval="") + "\n"


def plot_curves(trials: pd.DataFrame, title: str, baseline_best: dict | None = None) -> Figure:
    """Best latency vs trials, one panel per task, one line per cost model (mean over seeds)."""
    c = curves(trials)
    tasks = list(dict.fromkeys(c["task"]))
    n = max(1, len(tasks))
    cols = min(3, n)
    rows = int(np.ceil(n / cols))
    fig = Figure(figsize=(4.6 * cols, 3.4 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        sub = c[c["task"] == task]
        for cm in _ordered(sub["cost_model"]):
            m = sub[sub["cost_model"] == cm].groupby("trial")["best_s"].mean() * 1e6
            ax.step(m.index, m.values, where="post", label=cm, color=COLORS.get(cm))
        if baseline_best and task in baseline_best and np.isfinite(baseline_best[task]):
            ax.axhline(baseline_best[task] * 1e6, color="grey", ls=":", lw=1, label="xgb's final best")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("trials")
        ax.set_ylabel("best latency (us)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def network_curve(trials: pd.DataFrame, weights: dict) -> pd.DataFrame:
    """Per (cost_model, seed): weighted sum of the tasks' best latencies after each trial of
    the whole run (in measurement order); NaN until every task has a valid measurement."""
    out = []
    for (cm, seed), g in trials.sort_values("elapsed_s", kind="stable").groupby(["cost_model", "seed"], sort=False):
        best: dict = {}
        for i, r in enumerate(g.itertuples(index=False), 1):
            if r.latency_s is not None and np.isfinite(r.latency_s) and r.latency_s > 0:
                best[r.task] = min(best.get(r.task, np.inf), r.latency_s)
            total = sum(weights.get(t, 1) * best[t] for t in best) if len(best) == len(weights) else np.nan
            out.append({"cost_model": cm, "seed": seed, "trial": i, "weighted_s": total})
    return pd.DataFrame(out)


def plot_network(curve: pd.DataFrame, title: str) -> Figure:
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.subplots()
    for cm in _ordered(curve["cost_model"]):
        m = curve[curve["cost_model"] == cm].groupby("trial")["weighted_s"].mean() * 1e3
        ax.step(m.index, m.values, where="post", label=cm, color=COLORS.get(cm))
    ax.set_xlabel("trials (all tasks)")
    ax.set_ylabel("sum of weighted task latencies (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def network_task_runs(trials: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per-task rows of a network's runs (the wall time is the whole network's, shared)."""
    if trials.empty:
        return pd.DataFrame(columns=["task", "cost_model", "seed", "wall_s", "error"])
    keys = trials[["task", "cost_model", "seed"]].drop_duplicates()
    return keys.merge(runs.drop(columns=["task"]), on=["cost_model", "seed"], how="left")


@dataclass
class Report:
    summary: pd.DataFrame  # mean over seeds per (task, cost_model)
    text: str  # the markdown report
    files: dict[str, Path]  # what was written


def write(trials: pd.DataFrame, runs: pd.DataFrame, end_to_end: pd.DataFrame, dropped: dict, *, folder: Path,
          prefix: str, heading: str, curves_title: str, flops: dict, weights: dict, network: str | None = None, ours_uri: str | None = None,
          baseline: str = "xgb", tolerance: float = 0.0) -> Report:
    """The report files of a comparison (see the module docstring) in `folder`."""
    per_task_runs = runs if network is None else network_task_runs(trials, runs)
    detail = per_run(trials, per_task_runs, flops, baseline, tolerance)
    table = summary(detail, baseline)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"summary_csv": folder / f"{prefix}.csv", "runs_csv": folder / f"{prefix}_runs.csv",
             "trials_csv": folder / f"{prefix}_trials.csv"}
    table.to_csv(files["summary_csv"], index=False)
    detail.to_csv(files["runs_csv"], index=False)
    trials.to_csv(files["trials_csv"], index=False)
    base_best = curves(trials[trials["cost_model"] == baseline]).groupby("task")["best_s"].min().to_dict() \
        if len(trials) else {}
    files["curves_png"] = plots.save(plot_curves(trials, curves_title, base_best), folder / f"{prefix}_curves.png")
    text = [f"# Tuning: {heading}\n", f"ours = {ours_uri}\n" if ours_uri else "",
            "\n## Per task (mean over seeds)\n\n", markdown(table)]
    if network:
        curve = network_curve(trials, weights)
        files["network_png"] = plots.save(plot_network(curve, f"{network}: tuning curve"),
                                          folder / f"{prefix}_network.png")
        if len(end_to_end):
            base = end_to_end[end_to_end["cost_model"] == baseline].set_index("seed")["e2e_latency_ms"]
            end_to_end = end_to_end.assign(**{f"speedup_vs_{baseline}": [
                base.get(s, np.nan) / v for s, v in zip(end_to_end["seed"], end_to_end["e2e_latency_ms"])]})
        files["network_csv"] = folder / f"{prefix}_network.csv"
        end_to_end.to_csv(files["network_csv"], index=False)
        text += ["\n## Network end to end\n\n", markdown(end_to_end)]
    if dropped:
        text += ["\n## Dropped cost models\n\n"] + [f"- {k}: {v}\n" for k, v in dropped.items()]
    errs = runs[runs["error"].notna()] if len(runs) else runs
    if len(errs):
        text += ["\n## Failed runs\n\n", markdown(errs)]
    files["report_md"] = folder / f"{prefix}.md"
    files["report_md"].write_text("".join(text))
    return Report(table, "".join(text), files)
