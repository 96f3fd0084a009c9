"""Tables and curves of a tuning comparison (stage=tune): pure functions of the trial table.

Trial table: one row per measured trial, columns task, cost_model, seed, trial (1-based
within the task's run), batch, latency_s (null when the build or run failed), elapsed_s.
Run table: one row per (task, cost_model, seed) tuning run with wall_s and error.

Summary, in the style of published tuning benchmarks: best latency, GFLOPS, trials,
tuning minutes, speedup over the baseline (MetaSchedule's XGBModel: baseline latency /
latency), and the number of trials each cost model needs to reach the best latency the
baseline reached with its full budget in the run of the same seed (null = not reached);
over seeds: the mean, min and max, and how many seeds reached it.

For a network (its tasks tuned jointly), one more row per run: the network, whose latency
is the weighted sum of its tuned tasks' best latencies (weights = calls), counted in
trials of all tasks in measurement order; and the end-to-end latency of the whole network
compiled with each run's database (`end_to_end`, plus the untuned network for reference).

`write` turns a comparison's tables into the report files: <prefix>.csv (summary),
<prefix>_runs.csv, <prefix>_trials.csv, <prefix>_reach.csv, <prefix>_curves.png (mean
line and min/max band over seeds), <prefix>_curves_time.png (against wall-clock seconds),
<prefix>_paired.csv (each cost model against the baseline, paired by task and seed, with a
bootstrap interval over tasks), <prefix>.md and, for a network, <prefix>_budget.csv (its
weighted latency at five points of the budget), <prefix>_network.csv (end to end, per
seed), <prefix>_e2e.csv (over seeds), <prefix>_e2e.png (bars with [min, max] over seeds)
and <prefix>_network.png.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from models import plots

KEYS = ["task", "cost_model", "seed"]
# One color per cost model in every figure (ours first).
COLORS = {"ours": "tab:blue", "ours_update": "tab:cyan", "ours_adapt": "tab:red", "xgb": "tab:green",
          "random": "tab:orange"}
ORDER = list(COLORS)


def _ordered(names) -> list:
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def network_label(network: str) -> str:
    """The task column's value of a network's rows (weighted sum of its tuned tasks)."""
    return f"{network} (network)"


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


def _final(curve: pd.DataFrame) -> float:
    return float(curve["best_s"].min()) if len(curve) and curve["best_s"].notna().any() else float("nan")


def _row(task, cost_model, seed, mine: pd.DataFrame, base: pd.DataFrame, *, n_ok: int, flops: float, wall_s: float,
         refits, error, baseline: str, tolerance: float, host=None) -> dict:
    """One per-run row from the run's and the baseline's best-so-far curves (columns trial, best_s);
    `host`: the machine that tuned it."""
    best, base_best = _final(mine), _final(base)
    return {
        "task": task, "cost_model": cost_model, "seed": seed, "trials": int(len(mine)), "valid_trials": n_ok,
        "best_latency_us": best * 1e6,
        "gflops": flops / best / 1e9 if best > 0 and np.isfinite(flops) else float("nan"),
        "tuning_min": wall_s / 60.0,
        f"speedup_vs_{baseline}": base_best / best if best > 0 else float("nan"),
        f"trials_to_{baseline}_best": trials_to_reach(mine, base_best, tolerance),
        "refits": float(refits) if refits is not None and pd.notna(refits) else float("nan"),
        "error": error,
        "host": host if isinstance(host, str) else None,
    }


def per_run(trials: pd.DataFrame, runs: pd.DataFrame, flops: dict, baseline: str = "xgb",
            tolerance: float = 0.0) -> pd.DataFrame:
    """One row per (task, cost_model, seed): best latency, GFLOPS, trials, minutes, speedup, reach."""
    c = curves(trials)
    rows = []
    for _, r in runs.iterrows():
        task, cm, seed = r["task"], r["cost_model"], r["seed"]
        mine = c[(c["task"] == task) & (c["cost_model"] == cm) & (c["seed"] == seed)]
        base = c[(c["task"] == task) & (c["cost_model"] == baseline) & (c["seed"] == seed)]
        n_ok = int(trials[(trials["task"] == task) & (trials["cost_model"] == cm) & (trials["seed"] == seed)]
                   ["latency_s"].notna().sum()) if len(trials) else 0
        rows.append(_row(task, cm, seed, mine, base, n_ok=n_ok, flops=float(flops.get(task, float("nan"))),
                         wall_s=float(r.get("wall_s", float("nan"))), refits=r.get("refits"), error=r.get("error"),
                         baseline=baseline, tolerance=tolerance, host=r.get("host")))
    return pd.DataFrame(rows)


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
    return pd.DataFrame(out, columns=["cost_model", "seed", "trial", "weighted_s"])


def network_runs(trials: pd.DataFrame, runs: pd.DataFrame, network: str, weights: dict, flops: dict,
                 baseline: str = "xgb", tolerance: float = 0.0) -> pd.DataFrame:
    """One row per (cost_model, seed) for the network as a whole: its weighted latency
    (network_curve) in place of a task's, trials counted over all its tuned tasks."""
    curve = network_curve(trials, weights).rename(columns={"weighted_s": "best_s"})
    total_flops = float(sum(weights.get(t, 1) * f for t, f in flops.items() if t in weights))
    rows = []
    for _, r in runs.iterrows():
        cm, seed = r["cost_model"], r["seed"]
        mine = curve[(curve["cost_model"] == cm) & (curve["seed"] == seed)]
        base = curve[(curve["cost_model"] == baseline) & (curve["seed"] == seed)]
        n_ok = int(trials[(trials["cost_model"] == cm) & (trials["seed"] == seed)]["latency_s"].notna().sum()) \
            if len(trials) else 0
        rows.append(_row(network_label(network), cm, seed, mine, base, n_ok=n_ok, flops=total_flops,
                         wall_s=float(r.get("wall_s", float("nan"))), refits=r.get("refits"), error=r.get("error"),
                         baseline=baseline, tolerance=tolerance, host=r.get("host")))
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, baseline: str = "xgb") -> pd.DataFrame:
    """Over seeds, per (task, cost_model): means, the spread (min, max) of the best latency and
    of the trials to reach the baseline's best (over the seeds that reached it), and how many
    seeds reached it."""
    if table.empty:
        return table
    reach = f"trials_to_{baseline}_best"
    g = table.groupby(["task", "cost_model"], sort=False)
    out = g.agg(seeds=("seed", "nunique"), trials=("trials", "max"), valid_trials=("valid_trials", "mean"),
                best_latency_us=("best_latency_us", "mean"), best_latency_us_min=("best_latency_us", "min"),
                best_latency_us_max=("best_latency_us", "max"), gflops=("gflops", "mean"),
                tuning_min=("tuning_min", "mean"),
                **{f"speedup_vs_{baseline}": (f"speedup_vs_{baseline}", "mean"),
                   reach: (reach, "mean"), f"{reach}_min": (reach, "min"), f"{reach}_max": (reach, "max")},
                reached=(reach, lambda s: int(s.notna().sum())), refits=("refits", "mean")).reset_index()
    return out


def _spread(mean: float, lo: float, hi: float, digits: str = ".3g") -> str:
    if not np.isfinite(mean):
        return ""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo == hi:
        return f"{mean:{digits}}"
    return f"{mean:{digits}} [{lo:{digits}}, {hi:{digits}}]"


def reach_table(table: pd.DataFrame, baseline: str = "xgb") -> pd.DataFrame:
    """Trials to the baseline's final best as a task x cost model grid of
    `mean [min, max] (reached/seeds)` (tasks in run order, the network last)."""
    if table.empty:
        return pd.DataFrame()
    reach = f"trials_to_{baseline}_best"
    cells = table.assign(cell=[
        f"{_spread(m, lo, hi, '.4g')} ({k}/{n})".strip() if k else f"not reached (0/{n})"
        for m, lo, hi, k, n in zip(table[reach], table[f"{reach}_min"], table[f"{reach}_max"], table["reached"],
                                   table["seeds"])])
    grid = cells.pivot(index="task", columns="cost_model", values="cell")
    tasks = list(dict.fromkeys(table["task"]))
    grid = grid.reindex(index=tasks, columns=_ordered(table["cost_model"]))
    return grid.rename_axis(columns=None).reset_index()


def paired_speedup(detail: pd.DataFrame, baseline: str = "xgb", level: float = 0.9, resamples: int = 4000,
                   seed: int = 0) -> pd.DataFrame:
    """Per cost model, paired with the baseline's run of the same task and seed: the geometric
    mean over the (task, seed) pairs of baseline best / its best, a bootstrap interval (`level`)
    that resamples the tasks with their seeds, and how many pairs it won (speedup above 1).
    A network's row is a sum of its tasks' and is left out; so are pairs missing either run."""
    speed = f"speedup_vs_{baseline}"
    if detail.empty:
        return pd.DataFrame()
    tasks = detail[~detail["task"].astype(str).str.endswith(network_label(""))]
    tasks = tasks[(tasks["cost_model"] != baseline) & np.isfinite(tasks[speed]) & (tasks[speed] > 0)]
    rng = np.random.default_rng(seed)
    rows = []
    for cm in _ordered(tasks["cost_model"]):
        mine = tasks[tasks["cost_model"] == cm]
        mean, lo, hi, n_tasks = geomean_over_tasks(mine["task"].to_numpy(), np.log(mine[speed].to_numpy()), rng,
                                                   level=level, resamples=resamples)
        rows.append({"cost_model": cm, "tasks": n_tasks, "pairs": len(mine), f"geomean_{speed}": mean,
                     "interval_lo": lo, "interval_hi": hi, "pairs_won": int((mine[speed] > 1).sum())})
    return pd.DataFrame(rows)


def geomean_over_tasks(tasks: np.ndarray, logs: np.ndarray, rng, *, level: float = 0.9,
                       resamples: int = 4000) -> tuple[float, float, float, int]:
    """The geometric mean of paired ratios (`logs`, one per pair, `tasks` naming each pair's
    task) and its bootstrap interval (`level`) that resamples the tasks with all their pairs;
    returns (mean, lo, hi, tasks)."""
    per_task = pd.DataFrame({"task": tasks, "log": logs}).groupby("task")["log"].agg(["sum", "count"])
    total, count = per_task["sum"].to_numpy(), per_task["count"].to_numpy()
    pick = rng.integers(0, len(total), size=(resamples, len(total)))
    boot = np.exp(total[pick].sum(axis=1) / count[pick].sum(axis=1))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(np.exp(total.sum() / count.sum())), float(lo), float(hi), len(total)


def budget_table(curve: pd.DataFrame, baseline: str = "xgb", points: int = 5) -> pd.DataFrame:
    """The network's weighted latency (ms) part way through the budget: at `points` evenly
    spaced trial counts up to the longest run, per cost model `mean [min, max]` over seeds,
    and beside it the baseline's / its latency paired by seed (geometric mean over seeds)."""
    if curve.empty:
        return pd.DataFrame()
    total = int(curve["trial"].max())
    marks = sorted({max(1, round(total * k / points)) for k in range(1, points + 1)})
    at = curve[curve["trial"].isin(marks)].set_index(["cost_model", "seed", "trial"])["weighted_s"].unstack("trial")
    rows = []
    for cm in _ordered(at.index.get_level_values("cost_model")):
        mine = at.loc[cm]
        row = {"cost_model": cm, "seeds": len(mine)}
        for t in marks:
            ms = mine[t] * 1e3 if t in mine else pd.Series(dtype=float)
            row[f"ms at {t}"] = _spread(ms.mean(), ms.min(), ms.max())
            if baseline in at.index.get_level_values("cost_model") and t in mine:
                ratio = (at.loc[baseline][t] / mine[t]).dropna()
                row[f"{baseline}/this at {t}"] = float(np.exp(np.log(ratio).mean())) if len(ratio) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


# Runs whose untuned network took more than this much longer than another's were timed on
# machines (or days of a shared one) that differ: their latencies do not compare.
MACHINE_TOLERANCE = 0.10


def with_untuned_speedup(end_to_end: pd.DataFrame) -> pd.DataFrame:
    """`speedup_vs_untuned` per run: the untuned network timed beside the run (`untuned_ms`) /
    the run's end-to-end latency; a speedup compares across machines where latencies do not.
    Runs kept before the untuned network was timed beside each run have none."""
    if end_to_end.empty:
        return end_to_end
    untuned = end_to_end["untuned_ms"] if "untuned_ms" in end_to_end else pd.Series(np.nan, index=end_to_end.index)
    untuned = untuned.where(end_to_end["cost_model"] != "untuned", end_to_end["e2e_latency_ms"])
    return end_to_end.assign(untuned_ms=untuned, speedup_vs_untuned=untuned / end_to_end["e2e_latency_ms"])


def machine_note(end_to_end: pd.DataFrame, tolerance: float = MACHINE_TOLERANCE) -> str | None:
    """What the untuned network's timings say of where a network's runs were timed: None when
    every run timed it beside itself and all of them (and this invocation's untuned row) agree
    within `tolerance`; else the spread, and how many runs did not time it."""
    if end_to_end.empty:
        return None
    runs = end_to_end[end_to_end["cost_model"] != "untuned"]
    beside = runs["untuned_ms"] if "untuned_ms" in runs else pd.Series(np.nan, index=runs.index)
    known = pd.concat([beside.dropna(), end_to_end.loc[end_to_end["cost_model"] == "untuned", "e2e_latency_ms"]])
    parts = []
    if len(known) and known.max() > known.min() * (1 + tolerance):
        parts.append(f"the untuned network took {known.min():.4g} to {known.max():.4g} ms (x{known.max() / known.min():.2f}) "
                     f"beside these runs: they were timed on machines that differ by more than {tolerance:.0%}, so "
                     f"their latencies (trials to reach, paired, end to end) do not compare; their end-to-end "
                     f"speedups over the untuned network (`speedup_vs_untuned`) do")
    if beside.isna().any():
        parts.append(f"{int(beside.isna().sum())} of {len(runs)} runs did not time the untuned network beside them, "
                     f"so whether they were timed on one machine is not known")
    return f"Machines: {'; '.join(parts)}." if parts else None


def unapplied_note(end_to_end: pd.DataFrame) -> str | None:
    """How many runs were kept before the network compiled with their records
    (comparison.read_result): their end-to-end latency is left out."""
    if "e2e_unapplied_ms" not in end_to_end or not end_to_end["e2e_unapplied_ms"].notna().any():
        return None
    n, runs = int(end_to_end["e2e_unapplied_ms"].notna().sum()), int((end_to_end["cost_model"] != "untuned").sum())
    return (f"End to end: {n} of {runs} runs were kept before the network compiled with their records applied; "
            f"the latency they kept is the untuned network's and is left out. `tune.retime.enabled=true` times "
            f"their networks again with their records.")


def end_to_end_summary(end_to_end: pd.DataFrame, baseline: str = "xgb") -> pd.DataFrame:
    """Per cost model over seeds: end-to-end latency mean, min, max, speedup over the
    baseline's mean and mean speedup over the untuned network timed beside each run."""
    if end_to_end.empty:
        return end_to_end
    end_to_end = with_untuned_speedup(end_to_end)
    g = end_to_end.groupby("cost_model", sort=False)
    out = g.agg(seeds=("seed", "nunique"), trials=("trials", "max"), e2e_latency_ms=("e2e_latency_ms", "mean"),
                e2e_latency_ms_min=("e2e_latency_ms", "min"), e2e_latency_ms_max=("e2e_latency_ms", "max"),
                tuning_min=("tuning_min", "mean"), speedup_vs_untuned=("speedup_vs_untuned", "mean")).reset_index()
    base = out.loc[out["cost_model"] == baseline, "e2e_latency_ms"]
    out[f"speedup_vs_{baseline}"] = float(base.iloc[0]) / out["e2e_latency_ms"] if len(base) else np.nan
    order = _ordered(out["cost_model"])
    return out.set_index("cost_model").loc[order].reset_index()


def markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table, numbers with 3 significant digits, missing values empty."""
    if df.empty:
        return "(no rows)\n"
    cells = df.astype(object).where(df.notna(), None)  # NaN too is a missing value
    return cells.to_markdown(index=False, tablefmt="github", floatfmt=".3g", missingval="") + "\n"


def _band(ax, frame: pd.DataFrame, value: str, cost_model: str, scale: float) -> pd.Series:
    """Mean line and min/max band over seeds of `value` by trial; returns the mean."""
    wide = frame.pivot(index="trial", columns="seed", values=value).sort_index().ffill() * scale
    mean, lo, hi = wide.mean(axis=1, skipna=False), wide.min(axis=1, skipna=False), wide.max(axis=1, skipna=False)
    n = wide.shape[1]
    ax.step(mean.index, mean.values, where="post", color=COLORS.get(cost_model), lw=1.4,
            label=f"{cost_model} (mean of {n} seeds)" if n > 1 else cost_model)
    if n > 1:
        ax.fill_between(mean.index, lo.values, hi.values, step="post", color=COLORS.get(cost_model), alpha=0.18, lw=0)
    return mean


def _panel(ax, frame: pd.DataFrame, value: str, scale: float, title: str, ylabel: str, xlabel: str,
           baseline: str | None) -> None:
    for cm in _ordered(frame["cost_model"]):
        _band(ax, frame[frame["cost_model"] == cm], value, cm, scale)
    if baseline is not None:
        final = frame[frame["cost_model"] == baseline].groupby("seed")[value].min() * scale
        if len(final) and np.isfinite(final.mean()):
            ax.axhline(final.mean(), color="grey", ls=":", lw=1, label=f"{baseline}'s final best (mean)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def plot_curves(trials: pd.DataFrame, title: str, baseline: str | None = "xgb",
                network: tuple[str, pd.DataFrame] | None = None) -> Figure:
    """Best latency vs trials, one panel per task (and one for the network, `network` =
    (name, network_curve)), one mean line and min/max band over seeds per cost model."""
    c = curves(trials)
    tasks = list(dict.fromkeys(c["task"]))
    n = max(1, len(tasks) + (network is not None))
    cols = min(3, n)
    rows = int(np.ceil(n / cols))
    fig = Figure(figsize=(4.6 * cols, 3.4 * rows))
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, task in zip(axes, tasks):
        _panel(ax, c[c["task"] == task], "best_s", 1e6, task, "best latency (us)", "trials of this task", baseline)
    if network is not None:
        _panel(axes[len(tasks)], network[1], "weighted_s", 1e3, f"{network[0]}: weighted sum of the tuned tasks",
               "sum of weight x best latency (ms)", "trials (all tuned tasks)", baseline)
    for ax in axes[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_time_curves(trials: pd.DataFrame, title: str) -> Figure:
    """Best latency vs wall-clock seconds of the run, one panel per task, one line per cost
    model and seed (seeds do not share a clock, so they are drawn, not averaged): what a cost
    model's own time (training, prediction) costs next to the trials it saves."""
    c = curves(trials).dropna(subset=["elapsed_s"])
    tasks = list(dict.fromkeys(c["task"]))
    cols = min(3, max(1, len(tasks)))
    rows = int(np.ceil(max(1, len(tasks)) / cols))
    fig = Figure(figsize=(4.6 * cols, 3.4 * rows))
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax, task in zip(axes, tasks):
        mine = c[c["task"] == task]
        for cm in _ordered(mine["cost_model"]):
            for i, (seed, run) in enumerate(mine[mine["cost_model"] == cm].groupby("seed")):
                run = run.sort_values("elapsed_s").dropna(subset=["best_s"])
                ax.step(run["elapsed_s"], run["best_s"] * 1e6, where="post", color=COLORS.get(cm), lw=1.2,
                        alpha=0.85, label=cm if i == 0 else None)
        ax.set_yscale("log")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("wall-clock seconds of the run")
        ax.set_ylabel("best latency (us)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    for ax in axes[len(tasks):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_end_to_end(end_to_end: pd.DataFrame, title: str) -> Figure:
    """End-to-end latency per cost model: a bar at the mean over seeds, the error bar its
    [min, max]; runs without a latency are left out (their count shows in the label)."""
    e = end_to_end.assign(ms=end_to_end["e2e_latency_ms"].astype(float))
    names = _ordered(e["cost_model"])
    g = e.groupby("cost_model")["ms"]
    mean, lo, hi = g.mean().reindex(names), g.min().reindex(names), g.max().reindex(names)
    have = mean.notna().to_numpy()
    fig = Figure(figsize=(max(4.5, 1.1 * len(names) + 1.5), 3.8))
    ax = fig.subplots()
    x = np.arange(len(names))[have]
    ax.bar(x, mean[have], yerr=[(mean - lo)[have], (hi - mean)[have]], capsize=4,
           color=[COLORS.get(n, "tab:gray") for n in np.array(names)[have]])
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels([f"{n}\n({int(g.count().get(n, 0))} runs)" for n in names], fontsize=8)
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_network(curve: pd.DataFrame, title: str, baseline: str | None = "xgb") -> Figure:
    fig = Figure(figsize=(5.5, 3.8))
    _panel(fig.subplots(), curve, "weighted_s", 1e3, title, "sum of weight x best latency (ms)",
           "trials (all tuned tasks)", baseline)
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
    summary: pd.DataFrame  # over seeds per (task, cost_model); a network's rows too
    text: str  # the markdown report
    files: dict[str, Path]  # what was written
    end_to_end: pd.DataFrame = field(default_factory=pd.DataFrame)  # over seeds per cost model (networks)
    machines: str | None = None  # machine_note of a network's runs (None: one machine, or not a network)
    unapplied: str | None = None  # unapplied_note of a network's runs (None: every end-to-end latency stands)


def _paired_section(detail: pd.DataFrame, baseline: str, files: dict, path: Path) -> list[str]:
    """The report's section on each cost model paired with the baseline (and its CSV at `path`)."""
    paired = paired_speedup(detail, baseline)
    if paired.empty:
        return []
    files["paired_csv"] = path
    paired.to_csv(path, index=False)
    return [f"\n## Paired with {baseline} (per task and seed: {baseline}'s best / this best; geometric mean over "
            f"the pairs, 90% bootstrap interval over the tasks)\n\n", markdown(paired)]


def _network_section(network: str, curve: pd.DataFrame, end_to_end: pd.DataFrame, baseline: str, files: dict,
                     folder: Path, prefix: str) -> tuple[list[str], pd.DataFrame]:
    """The report's sections on a network tuned as a whole (part way through the budget, end to
    end) with their files; returns the text and the end-to-end summary over seeds."""
    files["network_png"] = plots.save(plot_network(curve, f"{network}: tuning curve", baseline),
                                      folder / f"{prefix}_network.png")
    e2e = pd.DataFrame()
    if len(end_to_end):
        end_to_end = with_untuned_speedup(end_to_end)
        base = end_to_end[end_to_end["cost_model"] == baseline].set_index("seed")["e2e_latency_ms"]
        end_to_end = end_to_end.assign(**{f"speedup_vs_{baseline}": [
            base.get(s, np.nan) / v for s, v in zip(end_to_end["seed"], end_to_end["e2e_latency_ms"])]})
        e2e = end_to_end_summary(end_to_end, baseline)
        files["e2e_png"] = plots.save(plot_end_to_end(end_to_end, f"{network} end to end: mean over seeds, "
                                                      f"bars = [min, max]"), folder / f"{prefix}_e2e.png")
    budget = budget_table(curve, baseline)
    for name, frame in (("budget", budget), ("network", end_to_end), ("e2e", e2e)):
        files[f"{name}_csv"] = folder / f"{prefix}_{name}.csv"
        frame.to_csv(files[f"{name}_csv"], index=False)
    text = [f"\n## {network} part way through the budget (weighted latency of the tuned tasks in ms, mean "
            f"[min, max] over seeds; {baseline}'s latency / this one, paired by seed)\n\n", markdown(budget),
            f"\n## {network} end to end (the whole network compiled with each run's database; untuned = "
            f"no record)\n\n", markdown(e2e), "\n### Per seed\n\n", markdown(end_to_end)]
    return text, e2e


def write(trials: pd.DataFrame, runs: pd.DataFrame, end_to_end: pd.DataFrame, *, folder: Path,
          prefix: str, heading: str, curves_title: str, flops: dict, weights: dict, network: str | None = None,
          ours_uri: str | None = None, baseline: str = "xgb", tolerance: float = 0.0,
          caveat: str | None = None, notes: list[str] | None = None) -> Report:
    """The report files of a comparison (see the module docstring) in `folder`. It opens with
    `caveat` (in bold: what the figures are not) and `notes` (e.g. whether ours saw the tasks)."""
    per_task_runs = runs if network is None else network_task_runs(trials, runs)
    detail = per_run(trials, per_task_runs, flops, baseline, tolerance)
    curve = None
    if network is not None:
        curve = network_curve(trials, weights)
        detail = pd.concat([detail, network_runs(trials, runs, network, weights, flops, baseline, tolerance)],
                           ignore_index=True)
    table = summary(detail, baseline)
    reach = reach_table(table, baseline)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"summary_csv": folder / f"{prefix}.csv", "runs_csv": folder / f"{prefix}_runs.csv",
             "trials_csv": folder / f"{prefix}_trials.csv", "reach_csv": folder / f"{prefix}_reach.csv"}
    table.to_csv(files["summary_csv"], index=False)
    detail.to_csv(files["runs_csv"], index=False)
    trials.to_csv(files["trials_csv"], index=False)
    reach.to_csv(files["reach_csv"], index=False)
    files["curves_png"] = plots.save(
        plot_curves(trials, curves_title, baseline, (network, curve) if network is not None else None),
        folder / f"{prefix}_curves.png")
    files["curves_time_png"] = plots.save(plot_time_curves(trials, curves_title.replace("vs trials", "vs time")),
                                          folder / f"{prefix}_curves_time.png")
    text = [f"# Tuning: {heading}\n\n"]
    machines = machine_note(end_to_end) if network is not None else None
    unapplied = unapplied_note(end_to_end) if network is not None else None
    text += [f"> **{x}**\n\n" for x in (caveat, machines, unapplied) if x]
    text += [f"{n}\n\n" for n in notes or []]
    text += [f"ours = {ours_uri}\n" if ours_uri else "",
             f"\n## Trials to reach {baseline}'s final best (mean [min, max] over the seeds that reached it; "
             f"reached/seeds)\n\n", markdown(reach)]
    e2e = pd.DataFrame()
    if network is not None:
        section, e2e = _network_section(network, curve, end_to_end, baseline, files, folder, prefix)
        text += section
    text += _paired_section(detail, baseline, files, folder / f"{prefix}_paired.csv")
    text += ["\n## Per task and network (mean over seeds)\n\n", markdown(table)]
    errs = runs[runs["error"].notna()] if len(runs) else runs
    if len(errs):
        text += ["\n## Failed runs\n\n", markdown(errs)]
    files["report_md"] = folder / f"{prefix}.md"
    files["report_md"].write_text("".join(text))
    return Report(table, "".join(text), files, e2e, machines, unapplied)
