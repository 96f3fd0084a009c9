"""stage=tune: the trained cost model inside MetaSchedule, against MetaSchedule's own models.

Every cost model of `tune.cost_models` (models/tuning_models.py: ours, xgb, mlp, random)
tunes the same tasks with the same trial budget, seeds, search strategy, builder and
runner, on the workspace's target. What is tuned (`tune.tasks`, pipeline/tuning_tasks.py):
the workspace's first tasks, the operator suite, or a zoo network end to end. The loop is
pipeline/tuning.py's `compare`, the report models/tuning_report.py's `write`.

Outputs: <workspace>/tune/<stamp>/ (MetaSchedule work dirs and databases),
<workspace>/tune_trials/part-*.parquet (every trial), <workspace>/reports/tune*.{md,csv,png},
and one MLflow run (tag stage=tune) in the workspace's experiment with the same files.
"""

from __future__ import annotations

import logging
import os
import time

import pandas as pd
from omegaconf import OmegaConf
from tvm.s_tir import meta_schedule as ms

from models import tracking, tuning_models, tuning_report
from models.tuning_models import TuneError  # noqa: F401 - the stage's error, importable from here
from pipeline import tuning_tasks
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, write_part
from pipeline.tuning import PersistentBuilder, Setup, StrategyConfig, compare, warm_up

log = logging.getLogger(__name__)

TRIAL_COLUMNS = ["task", "index", "batch", "latency_s", "error", "elapsed_s", "cost_model", "seed"]


def run(cfg) -> dict:
    t = cfg.tune
    kinds = tuning_models.check_kinds([str(n) for n in t.cost_models])
    if int(t.trials) < 1 or int(t.per_iter) < 1:
        raise TuneError(f"tune.trials={t.trials} and tune.per_iter={t.per_iter} must be >= 1")
    ws = Workspace.from_cfg(cfg)
    items, target = tuning_tasks.choose(cfg, ws)
    ours, ours_uri = tuning_models.load_ours(cfg) if "ours" in kinds else (None, None)
    threads = int(cfg.jobs) or os.cpu_count() or 1
    stamp = time.strftime("%Y%m%d-%H%M%S")
    builder = PersistentBuilder(max_workers=threads, timeout_sec=float(t.builder_timeout_s))
    runner = ms.runner.LocalRunner(timeout_sec=float(t.runner.timeout_s), evaluator_config=ms.runner.EvaluatorConfig(
        number=int(t.runner.number), repeat=int(t.runner.repeat), min_repeat_ms=int(t.runner.min_repeat_ms),
        enable_cpu_cache_flush=bool(t.runner.cpu_cache_flush)))
    setup = Setup(target, int(t.trials), int(t.per_iter), StrategyConfig(**OmegaConf.to_container(t.strategy, resolve=True)),
                  builder, runner, threads, ws.root / "tune" / stamp)

    def make_cost_model(kind: str, seed: int):
        return tuning_models.create(kind, seed=seed, threads=threads, ours=ours, xgb_warmup=int(t.xgb_warmup))

    try:
        log.info("warm-up (imports, build and run workers): %.1f s",
                 warm_up(builder, runner, items[0].tasks[0].mod, target))
        result = compare(items, kinds, [int(s) for s in t.seeds], make_cost_model, setup,
                         drop_on_failure=tuning_models.DROP_ON_FAILURE)
    finally:
        builder.close()

    trials = result.trials if len(result.trials) else pd.DataFrame(columns=TRIAL_COLUMNS)
    trials = trials.rename(columns={"index": "trial"}).assign(tune_run=stamp)
    write_part(trials, S.TUNE_TRIALS, ws.root / "tune_trials")
    network = items[0].name if str(t.tasks) not in ("workspace", "ops") else None
    tasks = [task for item in items for task in item.tasks]
    kind = str(t.tasks)
    report = tuning_report.write(
        trials, result.runs, result.end_to_end, result.dropped, folder=ws.root / "reports",
        prefix="tune" if kind == "workspace" else f"tune-{kind}",
        heading=f"{ws.name}, {network or kind}, {t.trials} trials per task, seeds {list(t.seeds)}",
        curves_title=f"{ws.name}: best latency vs trials ({t.trials} per task)",
        flops={x.name: x.flops for x in tasks}, weights={x.name: x.weight for x in tasks}, network=network,
        ours_uri=ours_uri, baseline=tuning_models.BASELINE, tolerance=float(t.reach_tolerance))
    print("\n" + report.text)
    info = ours.info if ours is not None else {}
    run_id = tracking.log_tune_run(
        cfg, files=report.files, summary=report.summary, curves=tuning_report.batch_curves(trials),
        end_to_end=result.end_to_end, run_name=f"tune-{network or kind}", baseline=tuning_models.BASELINE,
        tags={"workspace": cfg.workspace, "workspace_path": str(ws.root), "tune.tasks": str(network or kind),
              "ours_uri": str(ours_uri or ""), "ours_run_id": str(info.get("run_id") or ""),
              "ours_model": str(info.get("model") or ""), "ours_version": str(info.get("version") or "")})
    runs = result.runs
    out = {"tasks": len(tasks), "runs": len(runs), "failed_runs": int(runs["error"].notna().sum()) if len(runs) else 0,
           "trials": int(len(trials)), "report": str(report.files["report_md"]), "mlflow_run": run_id}
    summary = report.summary
    if len(summary) and "ours" in set(summary["cost_model"]):
        o = summary[summary["cost_model"] == "ours"]
        out["ours_speedup_vs_xgb_mean"] = round(float(o[f"speedup_vs_{tuning_models.BASELINE}"].mean()), 3)
    return out
