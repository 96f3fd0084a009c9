"""stage=tune: the trained cost model inside MetaSchedule, against MetaSchedule's own models.

Every cost model of `tune.cost_models` tunes the same tasks with the same trial budget,
seeds, search strategy, builder and runner, on the workspace's target:
  ours    the pipeline's model through models.adapter.PipelineCostModel (`tune.model_uri`,
          default the workspace's registered model at alias `best`, or `best-static` when
          `best` was trained on features MetaSchedule cannot give)
  xgb     MetaSchedule's XGBModel as tune_tir creates it (its defaults: 100 random warm-up
          predictions before the booster is used, `tune.xgb_warmup`)
  mlp     MetaSchedule's MLPModel (dropped with the reason logged when it fails on this TVM)
  random  MetaSchedule's RandomModel
What is tuned (`tune.tasks`): `workspace` (the workspace's first `tune.max_tasks` tasks),
`ops` (the operator suite of conf/dataset/ops.yaml), or a network of the zoo (resnet18,
resnet50, mobilenet_v2, bert_encoder), tuned end to end with tune_relax and then compiled
and timed as a whole.

Outputs: <workspace>/tune/<stamp>/ (MetaSchedule work dirs and databases),
<workspace>/tune_trials/part-*.parquet (every trial), <workspace>/reports/tune*.{md,csv,png},
and one MLflow run (tag stage=tune) in the workspace's experiment with the same files.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from tqdm import tqdm

from pipeline.core import schema as S
from pipeline.core.errors import PipelineError
from pipeline.core.workspace import Workspace, WorkspaceError, read_table, write_part

log = logging.getLogger(__name__)

COST_MODELS = ("ours", "xgb", "mlp", "random")
BASELINE = "xgb"


class TuneError(PipelineError):
    pass


# ----------------------------------------------------------------------------- what to tune


def _target(cfg, ws: Workspace, tasks: pd.DataFrame | None):
    from pipeline.core.targets import make_target, target_dict

    if tasks is not None and len(tasks) and tasks["target"].notna().any():
        return make_target(json.loads(tasks["target"].dropna().iloc[0]))
    return make_target(target_dict(cfg))


def workspace_tasks(cfg, ws: Workspace, limit: int | None) -> tuple[list[dict], object]:
    """[{name, mod, flops, weight}] of the workspace's first `limit` tasks, and their target."""
    from pipeline.core import database as D

    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    if limit is not None:
        tasks = tasks.head(int(limit))
    workloads = D.read_workload_lines(ws)
    out = [{"name": str(r.name), "mod": D.load_workload_mod(workloads[int(r.workload_index)]),
            "flops": float(r.flops) if pd.notna(r.flops) else float("nan"), "weight": int(r.weight or 1)}
           for r in tasks.itertuples()]
    return out, _target(cfg, ws, tasks)


def ops_tasks(cfg, ws: Workspace, limit: int | None) -> tuple[list[dict], object]:
    """The operator suite (conf/dataset/ops.yaml, or tune.ops / tune.configs when given)."""
    from pipeline.config import CONF_DIR
    from pipeline.workloads import flops_of
    from pipeline.workloads import ops

    base = OmegaConf.load(CONF_DIR / "dataset" / "ops.yaml")
    t = cfg.tune
    suite = OmegaConf.create({"dataset": {"ops": list(t.get("ops") or base.ops),
                                          "configs": list(t.get("configs") or base.configs)}})
    target = _target(cfg, ws, None)
    wl = ops.load(suite, target)
    if limit is not None:
        wl = wl[: int(limit)]
    return [{"name": w.name, "mod": w.mod, "flops": flops_of(w.mod), "weight": 1} for w in wl], target


def network_module(cfg, name: str):
    """(Relax module with weights bound, example inputs as numpy) of a zoo network."""
    from pipeline.workloads import networks as nets
    from pipeline.workloads import zoo

    if name not in nets.NETWORKS:
        raise TuneError(f"tune.tasks={name!r}: not `workspace`, `ops` nor a network; networks: "
                        f"{', '.join(nets.NETWORKS)}")
    options = {"layers": int(cfg.tune.get("bert_layers", 1) or 1)} if name == "bert_encoder" else {}
    batch, seed = int(cfg.tune.get("batch", 1) or 1), int(cfg.seed)
    mod = zoo.fuse(zoo.export(name, batch, seed, **options))
    _, example = nets.build(name, batch, seed, **options)
    return mod, [x.numpy() for x in example]


# ----------------------------------------------------------------------------- cost models


def resolve_model_uri(cfg) -> tuple[str, bool]:
    """(model URI, whether it is the default) for `ours`."""
    from models import tracking

    uri = cfg.tune.get("model_uri")
    if uri:
        return str(uri), False
    return f"models:/{tracking.registered_name(cfg)}@best", True


def load_ours(cfg):
    """The adapter for `ours` (refusals and missing models are errors that name the fix)."""
    from models import tracking
    from models.adapter import FeatureMismatchError, PipelineCostModel

    tracking.setup(cfg)
    uri, default = resolve_model_uri(cfg)
    cm = cfg.tune.costmodel
    # cm["update"]: `cm.update` is the mapping's own method
    kwargs = dict(update=bool(cm["update"]), update_every=int(cm["update_every"]), update_mode=str(cm["update_mode"]),
                  update_rounds=int(cm["update_rounds"]), update_epochs=int(cm["update_epochs"]),
                  threads=int(cfg.jobs) or os.cpu_count() or 1)
    if cm.get("path"):
        return PipelineCostModel.from_path(str(cm.path), **kwargs), str(cm.path)
    try:
        return PipelineCostModel.from_uri(uri, **kwargs), uri
    except FeatureMismatchError as e:
        if not default:
            raise TuneError(str(e)) from e
        static_uri = uri.replace("@best", "@best-static")
        log.warning("%s is not usable for tuning (%s); using %s", uri, str(e).split(". ")[0], static_uri)
        try:
            return PipelineCostModel.from_uri(static_uri, **kwargs), static_uri
        except Exception as e2:  # noqa: BLE001
            raise TuneError(f"no static model for `ours`: {static_uri}: {e2}. Train one with "
                            f"`python -m pipeline stage=train features=static`.") from e2
    except Exception as e:  # noqa: BLE001 - a missing registry entry or run
        if isinstance(e, TuneError):
            raise
        raise TuneError(f"tune.model_uri={uri}: {type(e).__name__}: {e}. Run `python -m pipeline stage=train` for "
                        f"workspace '{cfg.workspace}' (same mlflow.tracking_uri), or set tune.model_uri / "
                        f"tune.costmodel.path.") from e


def _fresh_copy(model):
    """An independent copy of a trained CostModel (save + load: deepcopy breaks TVM objects)."""
    import tempfile

    from models import registry

    with tempfile.TemporaryDirectory() as tmp:
        model.save(Path(tmp) / "m")
        out = registry.load(Path(tmp) / "m")
    out.threads = model.threads
    return out


def make_cost_model(name: str, cfg, seed: int, ours, threads: int):
    """A fresh cost model for one tuning run (ours: a copy, so online updates do not leak)."""
    from tvm.s_tir import meta_schedule as ms

    if name == "ours":
        inner = ours._inst if hasattr(ours, "_inst") else ours
        model = _fresh_copy(inner.model) if inner.update_enabled else inner.model
        return type(ours)(model, update=inner.update_enabled, update_every=inner.update_every,
                          update_mode=inner.update_mode, update_rounds=inner.update_rounds,
                          update_epochs=inner.update_epochs, train_data=inner.train_data, threads=threads,
                          source=inner.source, info=inner.info)
    if name == "xgb":
        return ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=int(cfg.tune.xgb_warmup))
    if name == "mlp":
        from tvm.s_tir.meta_schedule.cost_model.mlp_model import MLPModel

        return MLPModel()
    if name == "random":
        return ms.cost_model.RandomModel(seed=seed)
    raise TuneError(f"tune.cost_models: unknown {name!r}; valid: {', '.join(COST_MODELS)}")


# ----------------------------------------------------------------------------- the stage


def _settings(cfg):
    from pipeline.tuning import StrategyConfig

    t = cfg.tune
    names = [str(n) for n in t.cost_models]
    bad = [n for n in names if n not in COST_MODELS]
    if bad:
        raise TuneError(f"tune.cost_models: unknown {bad}; valid: {', '.join(COST_MODELS)}")
    if int(t.trials) < 1 or int(t.per_iter) < 1:
        raise TuneError(f"tune.trials={t.trials} and tune.per_iter={t.per_iter} must be >= 1")
    strategy = StrategyConfig(**OmegaConf.to_container(t.strategy, resolve=True))
    return names, strategy


def run(cfg) -> dict:
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning import PersistentBuilder, network_latency, tune_network, tune_task, warm_up

    ws = Workspace.from_cfg(cfg)
    names, strategy = _settings(cfg)
    t = cfg.tune
    kind = str(t.tasks)
    limit = None if t.get("max_tasks") is None else int(t.max_tasks)
    network = None
    if kind == "workspace":
        tasks, target = workspace_tasks(cfg, ws, limit)
    elif kind == "ops":
        tasks, target = ops_tasks(cfg, ws, limit)
    else:
        network = kind
        target = _target(cfg, ws, None)
        tasks = []
    if kind in ("workspace", "ops") and not tasks:
        raise WorkspaceError(f"tune.tasks={kind}: no task to tune in {ws.root}")
    ours, ours_uri = (load_ours(cfg) if "ours" in names else (None, None))
    threads = int(cfg.jobs) or os.cpu_count() or 1
    trials, per_iter, seeds = int(t.trials), int(t.per_iter), [int(s) for s in t.seeds]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = ws.root / "tune" / stamp
    builder = PersistentBuilder(max_workers=threads, timeout_sec=float(t.builder_timeout_s))
    runner = ms.runner.LocalRunner(timeout_sec=float(t.runner.timeout_s), evaluator_config=ms.runner.EvaluatorConfig(
        number=int(t.runner.number), repeat=int(t.runner.repeat), min_repeat_ms=int(t.runner.min_repeat_ms),
        enable_cpu_cache_flush=bool(t.runner.cpu_cache_flush)))
    all_trials, runs, dropped, e2e = [], [], {}, []
    try:
        if network is None:
            log.info("warm-up (imports, build and run workers): %.1f s", warm_up(builder, runner, tasks[0]["mod"], target))
            jobs = [(task, name, seed) for task in tasks for seed in seeds for name in names]
            for task, name, seed in tqdm(jobs, desc="tune", unit="run"):
                if name in dropped:
                    continue
                log.info("tune %s with %s (seed %d): %d trials", task["name"], name, seed, trials)
                row = {"task": task["name"], "cost_model": name, "seed": seed, "wall_s": float("nan"), "error": None}
                try:
                    cm = make_cost_model(name, cfg, seed, ours, threads)
                    got, wall, _ = tune_task(task["mod"], target, str(work / task["name"] / f"{name}-s{seed}"),
                                             cost_model=cm, trials=trials, per_iter=per_iter, seed=seed,
                                             strategy=strategy, builder=builder, runner=runner, num_threads=threads)
                    row["wall_s"] = wall
                    all_trials += [{**asdict(x), "task": task["name"], "cost_model": name, "seed": seed} for x in got]
                except Exception as e:  # noqa: BLE001 - one failing cost model is a row, not a crash
                    row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:500]
                    log.error("tune %s with %s failed: %s", task["name"], name, row["error"])
                    if name == "mlp":
                        dropped[name] = row["error"]
                        log.warning("cost model mlp dropped for the rest of this run: MetaSchedule's MLPModel "
                                    "fails on this TVM (%s)", row["error"])
                runs.append(row)
        else:
            mod, inputs = network_module(cfg, network)
            ext = ms.relax_integration.extract_tasks(mod, target)
            tasks = [{"name": str(x.task_name), "flops": _flops(x.dispatched[0]), "weight": int(x.weight)} for x in ext]
            from pipeline.workloads.zoo import as_main

            log.info("%s: %d tasks; warm-up: %.1f s", network, len(tasks),
                     warm_up(builder, runner, as_main(ext[0].dispatched[0]), target))
            for seed in seeds:
                for name in tqdm(names, desc=f"tune {network}", unit="model"):
                    row = {"task": network, "cost_model": name, "seed": seed, "wall_s": float("nan"), "error": None}
                    try:
                        cm = make_cost_model(name, cfg, seed, ours, threads)
                        wd = str(work / network / f"{name}-s{seed}")
                        got, wall, db = tune_network(mod, {}, target, wd, cost_model=cm, trials_per_task=trials,
                                                     per_iter=per_iter, seed=seed, strategy=strategy,
                                                     builder=builder, runner=runner)
                        row["wall_s"] = wall
                        all_trials += [{**asdict(x), "cost_model": name, "seed": seed} for x in got]
                        lat = network_latency(db, mod, {}, target, inputs)
                        e2e.append({"network": network, "cost_model": name, "seed": seed, "e2e_latency_ms": lat * 1e3,
                                    "tuning_min": wall / 60.0, "trials": len(got)})
                    except Exception as e:  # noqa: BLE001
                        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:500]
                        log.error("tune %s with %s failed: %s", network, name, row["error"])
                    runs.append(row)
    finally:
        builder.close()
    return _report(cfg, ws, stamp, tasks, network, pd.DataFrame(all_trials), pd.DataFrame(runs), pd.DataFrame(e2e),
                   ours, ours_uri, dropped)


def _flops(mod) -> float:
    from pipeline.workloads import flops_of
    from pipeline.workloads.zoo import as_main

    try:
        return flops_of(as_main(mod))
    except Exception:  # noqa: BLE001
        return float("nan")


# ----------------------------------------------------------------------------- report


def _report(cfg, ws: Workspace, stamp: str, tasks: list[dict], network: str | None, trials: pd.DataFrame,
            runs: pd.DataFrame, e2e: pd.DataFrame, ours, ours_uri, dropped: dict) -> dict:
    from models import tuning_report as R

    tol = float(cfg.tune.reach_tolerance)
    if trials.empty:
        trials = pd.DataFrame(columns=["task", "index", "batch", "latency_s", "error", "elapsed_s", "cost_model", "seed"])
    trials = trials.rename(columns={"index": "trial"})
    trials["tune_run"] = stamp
    write_part(trials, S.TUNE_TRIALS, ws.root / "tune_trials")
    flops = {t["name"]: t["flops"] for t in tasks}
    per_task_runs = runs if network is None else _network_task_runs(trials, runs)
    detail = R.per_run(trials, per_task_runs, flops, BASELINE, tol)
    summary = R.summary(detail, BASELINE)
    reports = ws.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    kind = str(cfg.tune.tasks)
    prefix = "tune" if kind == "workspace" else f"tune-{kind}"
    files = {}
    files["summary_csv"] = reports / f"{prefix}.csv"
    summary.to_csv(files["summary_csv"], index=False)
    files["runs_csv"] = reports / f"{prefix}_runs.csv"
    detail.to_csv(files["runs_csv"], index=False)
    files["trials_csv"] = reports / f"{prefix}_trials.csv"
    trials.to_csv(files["trials_csv"], index=False)
    base_best = {k: v for k, v in R.curves(trials[trials["cost_model"] == BASELINE]).groupby("task")["best_s"].min().items()} \
        if len(trials) else {}
    files["curves_png"] = R.plot_curves(trials, reports / f"{prefix}_curves.png",
                                        f"{ws.name}: best latency vs trials ({cfg.tune.trials} per task)", base_best)
    text = [f"# Tuning: {ws.name}, {network or cfg.tune.tasks}, {cfg.tune.trials} trials per task, seeds "
            f"{list(cfg.tune.seeds)}\n", f"ours = {ours_uri}\n" if ours_uri else "",
            "\n## Per task (mean over seeds)\n\n", R.markdown(summary)]
    if network:
        weights = {t["name"]: t["weight"] for t in tasks}
        curve = R.network_curve(trials, weights)
        files["network_png"] = R.plot_network(curve, reports / f"{prefix}_network.png", f"{network}: tuning curve")
        if len(e2e):
            base = e2e[e2e["cost_model"] == BASELINE].set_index("seed")["e2e_latency_ms"]
            e2e["speedup_vs_xgb"] = [base.get(s, np.nan) / v for s, v in zip(e2e["seed"], e2e["e2e_latency_ms"])]
        files["network_csv"] = reports / f"{prefix}_network.csv"
        e2e.to_csv(files["network_csv"], index=False)
        text += ["\n## Network end to end\n\n", R.markdown(e2e)]
    if dropped:
        text += ["\n## Dropped cost models\n\n"] + [f"- {k}: {v}\n" for k, v in dropped.items()]
    errs = runs[runs["error"].notna()] if len(runs) else runs
    if len(errs):
        text += ["\n## Failed runs\n\n", R.markdown(errs)]
    files["report_md"] = reports / f"{prefix}.md"
    files["report_md"].write_text("".join(text))
    print("\n" + "".join(text))
    run_id = _log_mlflow(cfg, ws, files, summary, trials, e2e, ours, ours_uri, network)
    out = {"tasks": len(tasks), "runs": len(runs), "failed_runs": int(runs["error"].notna().sum()) if len(runs) else 0,
           "trials": int(len(trials)), "report": str(files["report_md"]), "mlflow_run": run_id}
    if len(summary) and "ours" in set(summary["cost_model"]):
        o = summary[summary["cost_model"] == "ours"]
        out["ours_speedup_vs_xgb_mean"] = round(float(o[f"speedup_vs_{BASELINE}"].mean()), 3)
    return out


def _network_task_runs(trials: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per-task rows for a network run (wall time is the whole network's, shared)."""
    if trials.empty:
        return pd.DataFrame(columns=["task", "cost_model", "seed", "wall_s", "error"])
    keys = trials[["task", "cost_model", "seed"]].drop_duplicates()
    return keys.merge(runs.drop(columns=["task"]), on=["cost_model", "seed"], how="left")


def _log_mlflow(cfg, ws, files, summary, trials, e2e, ours, ours_uri, network) -> str | None:
    import mlflow

    from models import tracking
    from models import tuning_report as R

    exp = tracking.setup(cfg)
    info = (ours._inst if hasattr(ours, "_inst") else ours).info if ours is not None else {}
    tags = {"stage": "tune", "workspace": cfg.workspace,
            "workspace_path": str(ws.root), "tune.tasks": str(network or cfg.tune.tasks),
            "ours_uri": str(ours_uri or ""), "ours_run_id": str(info.get("run_id") or ""),
            "ours_model": str(info.get("model") or ""), "ours_version": str(info.get("version") or "")}
    with mlflow.start_run(experiment_id=exp, run_name=f"tune-{network or cfg.tune.tasks}", tags=tags) as run:
        params = tracking.flatten(cfg.tune, "tune.")
        params.update({"target": json.dumps(OmegaConf.to_container(cfg.target.tvm, resolve=True)),
                       "budget": str(cfg.budget.name), "seed": str(cfg.seed)})
        items = sorted(params.items())
        for i in range(0, len(items), 100):
            mlflow.log_params(dict(items[i : i + 100]))
        metrics = {}
        for r in summary.itertuples(index=False):
            k = f"{_key(r.task)}.{r.cost_model}"
            metrics[f"best_latency_us.{k}"] = r.best_latency_us
            metrics[f"gflops.{k}"] = r.gflops
            metrics[f"tuning_min.{k}"] = r.tuning_min
            metrics[f"speedup_vs_{BASELINE}.{k}"] = getattr(r, f"speedup_vs_{BASELINE}")
            metrics[f"trials_to_{BASELINE}_best.{k}"] = getattr(r, f"trials_to_{BASELINE}_best")
        for r in e2e.itertuples(index=False):
            metrics[f"e2e_latency_ms.{r.cost_model}.s{r.seed}"] = r.e2e_latency_ms
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(float(v))})
        # tuning curves as step metrics: best latency (us) after each batch, first seed
        c = R.batch_curves(trials)
        if len(c):
            first = c[c["seed"] == c["seed"].min()]
            for (task, cm), g in first.groupby(["task", "cost_model"]):
                for b in g.itertuples(index=False):
                    if np.isfinite(b.best_s):
                        mlflow.log_metric(f"curve_us.{_key(task)}.{cm}", b.best_s * 1e6, step=int(b.trial))
        for p in files.values():
            mlflow.log_artifact(str(p), artifact_path="tune")
        return run.info.run_id


def _key(name: str) -> str:
    import re

    return re.sub(r"[^0-9A-Za-z_.\-/ ]", "_", str(name))[:200]
