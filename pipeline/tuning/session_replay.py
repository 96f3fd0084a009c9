"""Kept tuning runs replayed through cost models: how well each ranks what a tuner measured next.

A tuning comparison (stage=tune) takes 10-20 minutes per run and answers for one model and
one setting. A kept run (comparison.keep_database) holds every schedule the tuner measured,
in the order it measured them. Replaying it asks the question a tuner asks of its cost
model, in seconds: given the session's first `cut` measurements of each task (fed through
MetaSchedule's `CostModel.update`, `per_iter` at a time, the tasks in turn, as a joint
tuning session feeds them), which of the schedules the run measured after them does the
model rank first (`CostModel.predict`)? Every kind of `tune.cost_models` answers on the
same records, so the answers pair: the latency of each model's first pick against
XGBModel's, per task, run and cut.

It cannot say what a model would have made the search explore: the candidates are the
kept run's, not the model's own. It is for choosing a cost model's settings on a
validation network before a tuning comparison spends its hours, never in place of one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import tvm
from tvm.s_tir import meta_schedule as ms

from features.static import schedule_from_trace
from pipeline.core import database as D
from pipeline.core import identity
from pipeline.tuning.comparison import kept_records
from pipeline.tuning.report import geomean_over_tasks, markdown

log = logging.getLogger(__name__)

FAILED = 1e10  # a failed measurement's cost, as MetaSchedule's cost models read it
PICKS = 8  # best of the model's first PICKS: a tuner measures a batch, not one schedule


@dataclass
class SessionTask:
    """One tuned task of a kept run: its candidates and their costs in the order measured."""

    name: str
    context: object  # ms.TuneContext
    candidates: list  # ms.MeasureCandidate
    costs: np.ndarray  # mean run seconds; FAILED where the runner gave none


def load_session(run: Path, names: dict[str, str]) -> list[SessionTask]:
    """The tasks of the kept run in folder `run` whose task id is in `names` (task id -> name,
    the tuned tasks), each with its measured candidates in trial order."""
    lines, records = kept_records(run)
    by_workload: dict[int, list] = {}
    for r in records:
        by_workload.setdefault(r.workload_index, []).append(r)
    out = []
    for index, recs in sorted(by_workload.items()):
        mod = D.load_workload_mod(lines[index])
        tid = identity.task_id(mod)
        if tid not in names:
            continue
        target = tvm.target.Target(recs[0].target)
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        cands, costs = [], []
        for r in recs:
            cands.append(ms.MeasureCandidate(schedule_from_trace(mod, r.trace_text), args))
            costs.append(float(np.mean([float(x) for x in r.run_secs])) if r.run_secs else FAILED)
        out.append(SessionTask(names[tid], ms.TuneContext(mod=mod, target=target, num_threads=1), cands,
                               np.asarray(costs)))
    missing = sorted(set(names.values()) - {t.name for t in out})
    if missing:
        raise ValueError(f"{run}: the kept run holds no record of tuned task(s) {', '.join(missing)}: it was "
                         f"tuned on other tasks; replay the runs of the same tune.tasks")
    return out


def _results(costs: np.ndarray) -> list:
    return [ms.runner.RunnerResult(run_secs=[float(c)], error_msg=None)
            if c < FAILED else ms.runner.RunnerResult(run_secs=None, error_msg="failed in the kept run")
            for c in costs]


def scores(costs: np.ndarray, predicted: np.ndarray) -> dict:
    """How `predicted` (higher = faster) ranks schedules of measured `costs`: the latency of
    its first pick and of the best of its first PICKS, each as best / that (1 = the best), and
    the share of pairs of distinct latency it orders right. Failed schedules count as slowest."""
    best = costs.min()
    order = np.argsort(-predicted, kind="stable")
    i, j = np.triu_indices(len(costs), 1)
    differ = costs[i] != costs[j]
    right = (predicted[i] > predicted[j]) == (costs[i] < costs[j])
    return {"first_pick_s": float(costs[order[0]]), "top1": float(best / costs[order[0]]),
            f"best_of_{PICKS}": float(best / costs[order[:PICKS]].min()),
            "pairwise": float(right[differ].mean()) if differ.any() else np.nan}


def replay(session: list[SessionTask], make_model: Callable[[], object], *, cut: int, per_iter: int) -> list[dict]:
    """A fresh model fed each task's first `cut` measurements (`per_iter` per task at a time,
    the tasks in turn), then asked to rank each task's later ones; a row per task."""
    model = make_model()
    for start in range(0, cut, per_iter):
        for t in session:
            stop = min(start + per_iter, cut, len(t.costs))
            if stop > start:
                model.update(t.context, t.candidates[start:stop], _results(t.costs[start:stop]))
    rows = []
    for t in session:
        later = t.costs[cut:]
        if (later < FAILED).sum() < 2:
            continue
        predicted = np.asarray(model.predict(t.context, t.candidates[cut:]), np.float64)
        rows.append({"task": t.name, "cut": cut, "later": len(later), **scores(later, predicted)})
    return rows


def replay_runs(runs: dict[str, list[SessionTask]], kinds: list[str], make: Callable[[str, int], object], *,
                cuts: list[int], per_iter: int) -> pd.DataFrame:
    """Every kind on every kept run (name -> its session) at every cut: one row per (kind, run,
    cut, task). A kind's model is made with the seed of the run's position, as a tuning
    comparison seeds its runs."""
    rows = []
    for seed, (run, session) in enumerate(sorted(runs.items())):
        for kind in kinds:
            for cut in cuts:
                np.random.seed(seed)  # XGBModel's warm-up predictions draw from numpy's global generator
                for row in replay(session, lambda: make(kind, seed), cut=int(cut), per_iter=int(per_iter)):
                    rows.append({"cost_model": kind, "run": run, **row})
        log.info("replayed %s: %d kinds x %d cuts", run, len(kinds), len(cuts))
    return pd.DataFrame(rows)


def paired(rows: pd.DataFrame, baseline: str = "xgb", *, level: float = 0.9, resamples: int = 4000,
           seed: int = 0) -> pd.DataFrame:
    """Per kind and cut: the mean of each score, and the latency of the baseline's first pick /
    this kind's first pick on the same (task, run), geometric mean with a bootstrap interval
    (`level`) that resamples the tasks with their runs, and the pairs it picked faster."""
    if rows.empty:
        return pd.DataFrame()
    key = ["task", "run", "cut"]
    base = rows[rows["cost_model"] == baseline].set_index(key)["first_pick_s"]
    rng = np.random.default_rng(seed)
    out = []
    for (kind, cut), mine in rows.groupby(["cost_model", "cut"], sort=False):
        row = {"cost_model": kind, "cut": int(cut), "pairs": len(mine),
               **{m: float(mine[m].mean()) for m in ("top1", f"best_of_{PICKS}", "pairwise")}}
        if kind != baseline and len(base):
            ratio = np.log(base.reindex(pd.MultiIndex.from_frame(mine[key])).to_numpy() / mine["first_pick_s"].to_numpy())
            ok = np.isfinite(ratio)
            if ok.any():
                mean, lo, hi, _ = geomean_over_tasks(mine["task"].to_numpy()[ok], ratio[ok], rng, level=level,
                                                     resamples=resamples)
                row.update({f"{baseline}_pick/this_pick": mean, "interval_lo": lo, "interval_hi": hi,
                            "pairs_faster": int((ratio[ok] > 0).sum()), "pairs_slower": int((ratio[ok] < 0).sum())})
        out.append(row)
    return pd.DataFrame(out).sort_values(["cut", "cost_model"], kind="stable").reset_index(drop=True)


def write_report(rows: pd.DataFrame, folder: Path, *, prefix: str, baseline: str, heading: str, notes: list[str],
                 per_iter: int) -> tuple[str, Path]:
    """<folder>/<prefix>.csv (every row) and <prefix>.md (the paired table, what it means);
    returns the markdown and its path."""
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / f"{prefix}.csv", index=False)
    text = (f"# Replayed tuning runs: {heading}\n\n" + "".join(f"{n}\n\n" for n in notes)
            + f"Each kind is fed each task's first `cut` measurements of a kept run ({per_iter} per task at a "
              f"time, the tasks in turn) and ranks the ones the run measured after them. top1 = best / the "
              f"latency of its first pick; best_of_{PICKS} = best / the best of its first {PICKS}; "
              f"{baseline}_pick/this_pick = the latency of {baseline}'s first pick / this kind's, per (task, run), "
              f"geometric mean, 90% bootstrap interval over the tasks. The candidates are the kept run's, not "
              f"what each model would have made the search explore: a proxy for ruling settings out, not a "
              f"tuning comparison.\n\n"
            + markdown(paired(rows, baseline).round(3)) + "\n")
    path = folder / f"{prefix}.md"
    path.write_text(text)
    return text, path
