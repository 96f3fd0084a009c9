"""stage=tune: the trained cost model inside MetaSchedule, against MetaSchedule's own models.

Every cost model of `tune.cost_models` (pipeline/tuning/kinds.py: ours, ours_update,
ours_adapt, xgb, random) tunes the same tasks with the same trial budget, seeds, search
strategy, builder and runner, on the workspace's target. What is tuned (`tune.tasks`,
pipeline/tuning/tasks.py): the workspace's first tasks, the operator suite, or the heaviest
tasks of a zoo network, tuned jointly and then timed end to end. The loop is
pipeline/tuning/comparison.py's `compare`, the report pipeline/tuning/report.py's `write`. The report
says whether `ours` was trained on a tuned task (`tune.require_held_out=true` refuses such a
model) and, when the budget is below XGBModel's warm-up, that it is not a comparison.

Outputs: <workspace>/tune/<settings>/ (MetaSchedule work dirs and databases, and each
finished run's result.json: the same command after an interruption tunes only what is
missing; force=true tunes everything again; <settings> is a digest of the tune options
but seeds, cost models, the results folder, the replay, the re-timing and those of the pipeline's model,
the target and the tasks; the
runs of `ours` kinds are in folders named with a digest of the loaded model and its options,
so MetaSchedule's own runs are reused whatever model `ours` is). With `tune.results`, each
finished run's result.json is also kept under <results>/<workspace>/<settings>/, a folder a
repository can commit: a run found there is not tuned again,
<workspace>/tune_trials/part-*.parquet (every trial), <workspace>/reports/tune*.{md,csv,png},
and one MLflow run (tag stage=tune) in the workspace's experiment with the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from models import tracking
from pipeline.core import identity
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, write_part
from pipeline.options import executor_of, ours_options, task_choice, tracking_store, workspace_of
from pipeline.tuning import TuneError
from pipeline.tuning import comparison
from pipeline.tuning import kinds as tuning_kinds
from pipeline.tuning import report as tuning_report
from pipeline.tuning import retime as kept_retime
from pipeline.tuning import session_replay
from pipeline.tuning import tasks as tuning_tasks
from pipeline.tuning.comparison import Network
from pipeline.tuning.remote import Remote
from pipeline.tuning.runs import SCHEDULERS

log = logging.getLogger(__name__)

#: tune options that concern only the pipeline's model (`ours` kinds), not MetaSchedule's own runs
OURS_OPTIONS = ("model_uri", "require_held_out", "costmodel")
TRIAL_COLUMNS = ["task", "index", "batch", "latency_s", "error", "elapsed_s", "cost_model", "seed"]


def _digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _check(t) -> None:
    if int(t.trials) < 1 or int(t.per_iter) < 1:
        raise TuneError(f"tune.trials={t.trials} and tune.per_iter={t.per_iter} must be >= 1")
    if not list(t.seeds):
        raise TuneError("tune.seeds is empty: name at least one seed, e.g. tune.seeds=[0,1,2]")
    if str(t.task_scheduler) not in SCHEDULERS:
        raise TuneError(f"tune.task_scheduler={t.task_scheduler!r}; valid: {', '.join(SCHEDULERS)}")


@dataclass
class Plan:
    """What a tune run compares: the items and their tasks, the kinds, `ours` and what the
    report must say about them, and the folders of its runs."""

    items: list
    tasks: list
    target: object
    kinds: list[str]
    ours: object = None
    ours_uri: str | None = None
    notes: list[str] = field(default_factory=list)
    caveat: str | None = None
    work: Path | None = None
    results: Path | None = None
    labels: dict = field(default_factory=dict)


def plan(cfg, ws: Workspace, kinds: list[str]) -> Plan:
    """The items, `ours` (checked against the tuned tasks) and the run folders of `cfg.tune`."""
    t = cfg.tune
    items, target = tuning_tasks.choose(task_choice(cfg), ws)
    p = Plan(items, [task for item in items for task in item.tasks], target, kinds)
    if set(kinds) & set(tuning_kinds.OURS):
        p.ours, p.ours_uri = tuning_kinds.load_ours(ours_options(cfg), tracking_store(cfg))
        held = tuning_kinds.held_out(p.ours.info, {x.name: identity.task_id(x.mod) for x in p.tasks},
                                     require=bool(t.require_held_out))
        log.info("%s", held.text)
        p.notes.append(held.text)
    # one XGBModel serves all of a network's tuned tasks; a task tuned on its own gets its own
    seen_by_xgb = min(int(t.trials) * (len(item.tasks) if isinstance(item, Network) else 1) for item in items)
    p.caveat = tuning_kinds.warmup_note(kinds, seen_by_xgb, int(t.xgb_warmup))
    if p.caveat:
        log.warning("%s", p.caveat)
    options = OmegaConf.to_container(t, resolve=True)
    # what decides MetaSchedule's own runs (not where they are kept, nor a replay of them); the
    # model of `ours` and its settings name its folders
    settings = {k: v for k, v in options.items()
                if k not in ("seeds", "cost_models", "results", "replay", "retime", *OURS_OPTIONS)}
    info = p.ours.info if p.ours is not None else {}
    key = _digest([settings, str(target), [x.name for x in p.tasks]])
    # an `ours` kind's runs are named by the model and the settings that kind reads, so a
    # setting one kind ignores (the correction's size, for the frozen model) does not tune it again
    model = [str(p.ours_uri), str(info.get("run_id")), str(info.get("version"))]
    p.labels = {k: f"{k}-{_digest([*model, tuning_kinds.settings_read(k, options['costmodel'])])[:8]}"
                for k in tuning_kinds.OURS} if p.ours is not None else {}
    p.results = Path(str(t.results)) / ws.name / key if t.get("results") else None
    p.work = ws.root / "tune" / key
    return p


def tune(cfg, p: Plan, on_finished) -> comparison.Comparison:
    """Every run of the plan, here or as jobs of the configured executor's cluster."""
    t = cfg.tune
    ex = executor_of(cfg)
    # on a cluster every node builds with its own cores; here, with cfg.jobs of them (0 = all)
    threads = int(cfg.jobs) or os.cpu_count() or 1
    spec = comparison.setup_spec(t, p.target, threads if ex.runs_here else 0)
    seeds = [int(s) for s in t.seeds]
    run_args = dict(reuse=not bool(cfg.force), on_finished=on_finished)
    try:
        if not ex.runs_here:
            remote = Remote.create(ex, spec, ours=p.ours, kinds=p.kinds, xgb_warmup=int(t.xgb_warmup))
            setup = comparison.Setup(p.target, int(t.trials), int(t.per_iter), None, None, None, 0, p.work,
                                     labels=p.labels, results=p.results)
            return comparison.compare(p.items, p.kinds, seeds, None, setup, remote=remote, **run_args)
        setup = replace(comparison.make_setup(spec, p.work), labels=p.labels, results=p.results)
        try:
            return comparison.compare(
                p.items, p.kinds, seeds,
                comparison.cost_models(ours=p.ours, threads=threads, xgb_warmup=int(t.xgb_warmup)), setup,
                before_first=lambda: comparison.warm_up_for(setup, p.tasks), **run_args)
        finally:
            setup.builder.close()
    finally:
        ex.close()


def run(cfg) -> dict:
    t = cfg.tune
    kinds = tuning_kinds.check_kinds([str(n) for n in t.cost_models])
    _check(t)
    ws = workspace_of(cfg)
    p = plan(cfg, ws, kinds)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def stamped(df: pd.DataFrame) -> pd.DataFrame:
        return (df if len(df) else pd.DataFrame(columns=TRIAL_COLUMNS)).rename(columns={"index": "trial"}).assign(
            tune_run=stamp)

    def finished(done: dict) -> None:  # a run's trials go into the table as it is saved, not at the end
        if done["trials"]:
            write_part(stamped(pd.DataFrame(done["trials"])), S.TUNE_TRIALS, ws.root / "tune_trials")

    if bool(t.replay.enabled):
        return replay(cfg, ws, p)
    if bool(t.retime.enabled):
        return retime(cfg, ws, p)
    result = tune(cfg, p, finished)
    for column, what in (("host", "machines"), ("cpu_signature", "CPUs")):
        seen = sorted(result.runs[column].dropna().unique()) if column in result.runs else []
        if len(seen) > 1:
            p.notes.append(f"The runs were tuned and timed on {len(seen)} {what} ({'; '.join(seen)}): their "
                           f"latencies compare only where the {what} are of one kind.")
    trials = stamped(result.trials)
    network = p.items[0].name if isinstance(p.items[0], Network) else None
    kind = str(t.tasks)
    scope = f"{network}'s {len(p.tasks)} heaviest of {p.items[0].n_tasks} tasks" if network else kind
    report = tuning_report.write(
        trials, result.runs, result.end_to_end, folder=ws.root / "reports",
        prefix="tune" if kind == "workspace" else f"tune-{network or kind}",
        heading=f"{ws.name}, {scope}, {t.trials} trials per task, seeds {list(t.seeds)}",
        curves_title=f"{ws.name}: best latency vs trials ({t.trials} per task, seeds {list(t.seeds)})",
        flops={x.name: x.flops for x in p.tasks}, weights={x.name: x.weight for x in p.tasks}, network=network,
        ours_uri=p.ours_uri, baseline=tuning_kinds.BASELINE, tolerance=float(t.reach_tolerance),
        caveat=p.caveat, notes=p.notes)
    print("\n" + report.text)
    for note in (report.machines, report.unapplied):
        if note:
            log.warning("%s", note)
    info = p.ours.info if p.ours is not None else {}
    run_id = tracking.log_tune_run(
        tracking_store(cfg), files=report.files, summary=report.summary, curves=tuning_report.batch_curves(trials),
        end_to_end=tuning_report.with_untuned_speedup(result.end_to_end), run_name=f"tune-{network or kind}", baseline=tuning_kinds.BASELINE,
        tags={"workspace": cfg.workspace, "workspace_path": str(ws.root), "tune.tasks": str(network or kind),
              "ours_uri": str(p.ours_uri or ""), "ours_run_id": str(info.get("run_id") or ""),
              "ours_model": str(info.get("model") or ""), "ours_version": str(info.get("version") or ""),
              "comparison": "no: below xgb's warm-up" if p.caveat else "yes"})
    return _outcome(p, result, report, trials, network, run_id)


def _kept_runs(p: Plan, kinds: list[str], seeds, option: str) -> dict[tuple[str, int], Path]:
    """The folders of the kept runs of `kinds` x `seeds` under `tune.results` (what `tune.<option>`
    reads), refused with every one that is missing."""
    folders = {(kind, int(seed)): p.results / comparison.run_folder(p.items[0].name, p.labels.get(kind, kind),
                                                                      int(seed)) for kind in kinds for seed in seeds}
    absent = [str(f) for f in folders.values() if not (f / comparison.RESULT_FILE).exists()]
    if absent:
        raise TuneError(f"tune.{option}: no kept run at {', '.join(absent)}: tune them first (the same command "
                        f"without tune.{option}.enabled, tune.cost_models=[{','.join(kinds)}]), or name other "
                        f"tune.seeds")
    return folders


def replay(cfg, ws: Workspace, p: Plan) -> dict:
    """`tune.replay.enabled=true`: the kept runs of kind `tune.replay.runs_of` (one per seed) of
    this comparison replayed through every kind of `tune.cost_models` (pipeline/tuning/session_replay.py)."""
    t = cfg.tune
    if p.results is None:
        raise TuneError("tune.replay needs the kept runs of tune.results (budget=transfer sets it): set "
                        "tune.results=<folder> to the folder the runs were kept in")
    names = {identity.task_id(x.mod): x.name for x in p.tasks}
    of = str(t.replay.runs_of)
    folders = {f"{of}-s{seed}": folder for (_, seed), folder in _kept_runs(p, [of], t.seeds, "replay").items()}
    sessions = {name: session_replay.load_session(folder, names) for name, folder in folders.items()}
    threads = int(cfg.jobs) or os.cpu_count() or 1
    make = comparison.cost_models(ours=p.ours, threads=threads, xgb_warmup=int(t.xgb_warmup))
    rows = session_replay.replay_runs(sessions, p.kinds, make, cuts=[int(c) for c in t.replay.cuts],
                                      per_iter=int(t.per_iter))
    text, path = session_replay.write_report(
        rows, ws.root / "reports", prefix=f"tune-{p.items[0].name}_replay", baseline=tuning_kinds.BASELINE,
        heading=f"{ws.name}, {p.items[0].name}, the kept {of} runs of seeds {list(t.seeds)}", notes=p.notes,
        per_iter=int(t.per_iter))
    print("\n" + text)
    return {"runs": len(sessions), "tasks": len(p.tasks), "kinds": len(p.kinds), "rows": len(rows),
            "report": str(path)}


def retime(cfg, ws: Workspace, p: Plan) -> dict:
    """`tune.retime.enabled=true`: the network of every kept run of this comparison (each kind
    of `tune.cost_models`, each seed) timed again end to end, interleaved over
    `tune.retime.rounds` rounds (pipeline/tuning/retime.py)."""
    t, network = cfg.tune, p.items[0]
    if not isinstance(network, Network):
        raise TuneError(f"tune.retime times a network end to end; tune.tasks={t.tasks} is not a network: name one, "
                        f"e.g. tune.tasks=resnet18")
    if p.results is None:
        raise TuneError("tune.retime needs the kept runs of tune.results (budget=transfer sets it): set "
                        "tune.results=<folder> to the folder the runs were kept in")
    if tuning_kinds.BASELINE not in p.kinds:
        raise TuneError(f"tune.retime pairs every run with {tuning_kinds.BASELINE}'s of the same seed: add "
                        f"{tuning_kinds.BASELINE} to tune.cost_models={list(p.kinds)}")
    runs = [kept_retime.KeptRun(kind, seed, folder)
            for (kind, seed), folder in _kept_runs(p, p.kinds, t.seeds, "retime").items()]
    r = t.retime
    evaluator = {"number": int(r.number), "repeat": int(r.repeat), "min_repeat_ms": int(r.min_repeat_ms)}
    with tempfile.TemporaryDirectory() as scratch:
        timings = kept_retime.retime(network, p.target, runs, rounds=int(r.rounds), evaluator=evaluator,
                                     scratch=Path(scratch), seed=int(cfg.seed))
    text, path = kept_retime.write_report(
        timings, {run.name: run.kept_ms() for run in runs}, ws.root / "reports", prefix=f"tune-{network.name}_retimed",
        heading=f"{ws.name}, {network.name}, the kept runs of {', '.join(p.kinds)}, seeds {list(t.seeds)}",
        evaluator=evaluator, baseline=tuning_kinds.BASELINE, notes=p.notes)
    print("\n" + text)
    return {"runs": len(runs), "rounds": int(r.rounds), "timings": len(timings), "report": str(path)}


def _outcome(p: Plan, result, report, trials: pd.DataFrame, network: str | None, run_id: str) -> dict:
    """The stage's result: counts, the report, and the headline figures."""
    runs = result.runs
    out = {"tasks": len(p.tasks), "runs": len(runs),
           "failed_runs": int(runs["error"].notna().sum()) if len(runs) else 0, "trials": int(len(trials)),
           "reused_runs": result.reused, "report": str(report.files["report_md"]), "mlflow_run": run_id}
    summary = report.summary
    speedup = f"speedup_vs_{tuning_kinds.BASELINE}"
    if len(summary) and "ours" in set(summary["cost_model"]):
        o = summary[(summary["cost_model"] == "ours") & (summary["task"] != tuning_report.network_label(network))] \
            if network else summary[summary["cost_model"] == "ours"]
        out["ours_speedup_vs_xgb_mean"] = round(float(o[speedup].mean()), 3)
    if len(report.end_to_end):
        e = report.end_to_end.set_index("cost_model")
        out["e2e_ms"] = ", ".join(f"{cm} {v:.3g}" for cm, v in e["e2e_latency_ms"].items() if pd.notna(v))
    if p.caveat:
        out["note"] = p.caveat
    return out
