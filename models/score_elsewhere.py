"""The models of training runs scored on the records of another workspace.

A pretrained model is used on networks, and machines, its labels never saw: a release timed
on another CPU, a user's own workspace. This loads the model each training run of an MLflow
experiment logged (the project's saved model behind `tags.pyfunc_model_uri`), scores every
timed record of the other workspace with it, evaluates the scores as stage=train evaluates a
test part (models/metrics.py: the other workspace's own labels, its networks as groups, top-k
figures over tasks with at least `topk_min_records` records) and compares the models as
stage=compare does (models/evaluation.py): each model minus a reference paired over the
workspace's tasks and over the runs.

    python -m models.score_elsewhere --experiment <training experiment> --release <dataset release>
        [--workspace <folder>] [--pairs a:b,c:d] [--members] [--out <folder>]

Writes per_run.csv (one row per run and network), intervals.csv (over tasks), margins.csv
(over runs), per_task.csv and a markdown summary to `--out` (default: the other workspace's
reports/scored_elsewhere-<experiment>/), and prints the summary.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from models import evaluation as E
from models import tracking
from models.ensemble import EnsembleModel
from models.metrics import evaluate
from models.pyfunc import load_cost_model
from models.tables import build_table, memberships
from pipeline.core.workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)

RUN_COLUMNS = ["model", "features", "trained_heldout", "seed", "heldout", "run_id", "test_top1_score",
               "test_top5_score", "test_pair_acc", "random_top1_score", "n_tasks", "n_tasks_topk"]


def _table_for(table, model):
    """`table` with every column the model reads (a column with no value in the other
    workspace is dropped by build_table; the model sees it as missing, NaN)."""
    missing = [c for c in model.spec.columns if c not in table.frame.columns]
    if not missing:
        return table
    return replace(table, frame=table.frame.assign(**dict.fromkeys(missing, np.nan)))


def select_runs(runs: pd.DataFrame, *, models=(), heldout: str | None = None) -> pd.DataFrame:
    """The newest run of each model and seed, of `models` (all when empty) and of the one
    held-out part of the training split (`heldout`, else the only one the runs have): a
    model's runs are paired by seed, and two held-out parts would share seeds."""
    runs = tracking.latest_per_config(runs)  # with the split tags
    if models:
        runs = runs[runs["tags.model"].isin(list(models))]
    if heldout is not None:
        runs = runs[runs["tags.heldout"] == heldout]
    parts = sorted(set(runs["tags.heldout"]))
    if len(parts) > 1:
        raise ValueError(f"the runs held out {len(parts)} parts ({', '.join(repr(x) for x in parts)}): choose one "
                         f"with --heldout")
    return runs


def score_runs(runs: pd.DataFrame, ws: Workspace, *, topk_min_records: int = 32,
               members: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per run and network of `ws`, the per-task rows the top-k figures count) for
    training runs (`tracking.experiment_runs` rows) scored on every timed record of `ws`.
    With `members`, each member of an ensemble is also scored alone, as model
    `<model>.<member>`: which of them carries the ensemble's figures there."""
    runs = tracking.with_split_tags(runs)
    tables, groups = {}, memberships(ws)
    per_run, per_task = [], []
    for _, run in runs.sort_values(["tags.model", "tags.split_seed"]).iterrows():
        uri, features = run.get("tags.pyfunc_model_uri"), str(run.get("tags.features") or "static")
        if not isinstance(uri, str) or not uri:
            log.warning("run %s (%s) logged no model: left out", run["run_id"], run.get("tags.model"))
            continue
        if features not in tables:
            tables[features] = build_table(ws, features)
        model = load_cost_model(uri)
        if hasattr(model, "bind"):
            model.bind(ws)
        seed, name, table = int(run["tags.split_seed"] or 0), run["tags.model"], _table_for(tables[features], model)
        if members and isinstance(model, EnsembleModel):  # each member predicts once, the ensemble combines them
            parts = model.member_scores(table)
            scored = [(name, model.combine(parts, model.convolutions(table.frame)), model.calibrated),
                      *((f"{name}.{k}", s, model.members[k].calibrated) for k, s in parts.items())]
        else:
            scored = [(name, model.predict(table), model.calibrated)]
        for label, scores, calibrated in scored:
            ev = evaluate(table.frame, scores, calibrated=calibrated, seed=seed,
                          members=groups, topk_min_records=topk_min_records)
            keys = {"model": label, "features": features, "trained_heldout": run["tags.heldout"],
                    "seed": seed, "run_id": run["run_id"]}
            tasks = ev.per_task.merge(groups[["task_id", "group"]], on="task_id").rename(columns={"group": "heldout"})
            for _, g in ev.per_group.iterrows():
                mine = tasks[tasks["heldout"] == g["group"]]
                per_run.append({**keys, "heldout": g["group"], "test_top1_score": g["top1_score"],
                                "test_top5_score": g["top5_score"], "test_pair_acc": float(mine["pair_acc"].mean()),
                                "random_top1_score": g["random_top1_score"], "n_tasks": int(g["n_tasks"]),
                                "n_tasks_topk": int(g["n_tasks_topk"])})
            per_task.append(tasks[tasks["topk"].astype(bool)].assign(**keys))
    if not per_run:
        raise WorkspaceError(f"none of the {len(runs)} runs logged a model to score {ws.root} with")
    return pd.DataFrame(per_run, columns=RUN_COLUMNS), pd.concat(per_task, ignore_index=True)


def compare_scores(per_run: pd.DataFrame, per_task: pd.DataFrame, ws: Workspace,
                   pairs: list[tuple[str, str]]) -> dict[str, pd.DataFrame]:
    """The means per model and network with a random pick's row, each pair's difference
    paired over the network's tasks (weighted top-1, as stage=compare) and over the runs."""
    weights = memberships(ws).rename(columns={"group": "heldout"})
    metrics = ["test_top1_score", "test_top5_score", "test_pair_acc"]
    means = per_run.groupby(["heldout", "model"], as_index=False).agg(
        runs=("seed", "size"), **{m: (m, "mean") for m in metrics},
        **{f"{m}_min": (m, "min") for m in metrics[:1]}, **{f"{m}_max": (m, "max") for m in metrics[:1]})
    random = per_run.groupby("heldout", as_index=False).agg(test_top1_score=("random_top1_score", "mean"))
    means = pd.concat([random.assign(model=E.RANDOM, test_pair_acc=0.5), means], ignore_index=True)
    intervals = []
    for model, reference in pairs:
        sub = per_task[per_task["model"].isin([model, reference])]
        got = E.paired_intervals(sub, weights, reference=reference)
        intervals.append(got[got["model"] == model].assign(reference=reference))
    # per network (its runs: one per seed), then over every network's runs together
    frame, wanted = per_run.assign(split="by_network"), set(pairs)
    parts = list(frame.groupby("heldout", sort=True))
    if len(parts) > 1:
        parts.append((E.MEAN, frame))
    margins = pd.concat([E.paired_over_runs(g, "test_top1_score", pairs, metrics=tuple(metrics)).assign(heldout=h)
                         for h, g in parts], ignore_index=True)
    margins = margins[[(m, r) in wanted for m, r in zip(margins["model"], margins["reference"])]]
    return {"means": means, "intervals": pd.concat(intervals, ignore_index=True) if intervals else pd.DataFrame(),
            "margins": margins.reset_index(drop=True)}


def summary_text(experiment: str, ws: Workspace, tables: dict[str, pd.DataFrame]) -> str:
    """The markdown summary: means, then the pairs over tasks and over runs (90%)."""
    def f(v):
        return f"{v:+.3f}" if isinstance(v, float) else str(v)

    lines = [f"# The runs of experiment {experiment} scored on workspace {ws.name}", "",
             "Every timed record of the workspace scored by each run's logged model, against the workspace's own "
             "labels; top-1 and top-5 over the tasks the top-k figures count, TenSet's weighting by calls.", "",
             "| network | model | runs | top-1 mean [min, max] | top-5 | pairwise acc. |", "|---|---|---|---|---|---|"]
    for _, r in tables["means"].iterrows():
        spread = (f" [{r['test_top1_score_min']:.3f}, {r['test_top1_score_max']:.3f}]"
                  if pd.notna(r.get("test_top1_score_min")) else "")
        runs = "" if pd.isna(r.get("runs")) else int(r["runs"])
        top5 = "" if pd.isna(r.get("test_top5_score")) else f"{r['test_top5_score']:.3f}"
        lines.append(f"| {r['heldout']} | {r['model']} | {runs} | {r['test_top1_score']:.3f}{spread} | {top5} | "
                     f"{r['test_pair_acc']:.3f} |")
    if len(tables["intervals"]):
        lines += ["", f"Top-1 of a model minus its reference paired over the network's tasks ({E.LEVEL:.0%}):", "",
                  "| network | model | reference | diff [interval] | tasks | seeds |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['heldout']} | {r['model']} | {r['reference']} | {f(r['diff'])} [{f(r['lo'])}, {f(r['hi'])}] | "
                  f"{r['n_tasks']} | {r['n_seeds']} |" for _, r in tables["intervals"].iterrows()]
    if len(tables["margins"]):
        lines += ["", f"Paired over the runs ({E.LEVEL:.0%}; runs won of runs; `{E.MEAN}`: every network's runs):", "",
                  "| network | model | reference | metric | diff [interval] | won |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['heldout']} | {r['model']} | {r['reference']} | {r['metric']} | {f(r['diff'])} "
                  f"[{f(r['lo'])}, {f(r['hi'])}] | {r['won']} of {r['n_runs']} |" for _, r in tables["margins"].iterrows()]
    return "\n".join(lines) + "\n"


def _workspace(args) -> Workspace:
    """The workspace to score: `--workspace`, else the one `dataset=release` made from `--release`."""
    # dataset=release's plain workspace name (the config's naming sits floors above this library)
    root = Path(args.workspace) if args.workspace else Path(args.data) / args.release
    if not (root / "tasks.parquet").exists():
        how = (f"python -m pipeline stage=tasks dataset=release dataset.release={args.release}" if args.release
               else "python -m pipeline stage=tasks ...")
        raise WorkspaceError(f"{root} holds no workspace: make it with `{how}`, or name one with --workspace")
    return Workspace(root)


def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        a, sep, b = item.partition(":")
        if not sep or not a or not b:
            raise SystemExit(f"--pairs {text!r}: write each pair as model:reference, separated by commas")
        out.append((a, b))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m models.score_elsewhere", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", required=True, help="MLflow experiment of the training runs")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--release", help="dataset release whose workspace (dataset=release) is scored")
    p.add_argument("--workspace", help="a workspace folder to score instead")
    p.add_argument("--data", default="data", help="where dataset=release workspaces are (paths.data)")
    p.add_argument("--pairs", default="", help="model:reference,... (e.g. ens_ps_rank4_fixed:ms_xgb)")
    p.add_argument("--models", default="", help="only these models (comma-separated)")
    p.add_argument("--heldout", help="only the runs that held out this part (their tag `heldout`)")
    p.add_argument("--members", action="store_true",
                   help="also score each member of an ensemble alone, as model <model>.<member>")
    p.add_argument("--topk-min-records", type=int, default=32)
    p.add_argument("--out", help="report folder (default: <workspace>/reports/scored_elsewhere-<experiment>)")
    args = p.parse_args(argv)
    if not (args.release or args.workspace):
        p.error("name the records to score: --release or --workspace")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    pairs = _pairs(args.pairs)
    ws = _workspace(args)
    runs = tracking.experiment_runs(args.tracking_uri, args.experiment)
    if runs.empty:
        raise SystemExit(f"no finished training run in experiment {args.experiment!r} of {args.tracking_uri}")
    try:
        runs = select_runs(runs, models=[m for m in args.models.split(",") if m], heldout=args.heldout)
    except ValueError as e:
        raise SystemExit(f"experiment {args.experiment!r}: {e}") from None
    per_run, per_task = score_runs(runs, ws, topk_min_records=args.topk_min_records, members=args.members)
    tables = compare_scores(per_run, per_task, ws, pairs)
    out = Path(args.out) if args.out else ws.root / "reports" / f"scored_elsewhere-{args.experiment}"
    out.mkdir(parents=True, exist_ok=True)
    per_run.to_csv(out / "per_run.csv", index=False)
    per_task.to_csv(out / "per_task.csv", index=False)
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    text = summary_text(args.experiment, ws, tables)
    (out / "summary.md").write_text(text)
    print(text)
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
