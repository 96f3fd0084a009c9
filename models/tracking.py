"""MLflow: one run per (model, features, split), a registered model with aliases.

Tracking store: `mlflow.tracking_uri`, by default `sqlite:///<project root>/mlflow.db`
(`mlflow ui --backend-store-uri sqlite:///mlflow.db` from the project root shows it); the
artifacts of an experiment go to `mlruns/` next to the database file. Experiment = the
workspace name; runs carry the workspace path as a tag, so two workspaces of the same name
under different `paths.data` stay apart in `stage=compare`.

Each run logs: the flattened Hydra config as params (with the effective model and feature-set
configs under `model.*` and `features.*`, the split's seed and held-out units), every metric of models.metrics for the
validation and test parts (`val_*`, `test_*`), training time and prediction rate, the
per-task and per-group metric tables, the model twice (its library's flavor under `native`,
the pyfunc wrapper under `model`), features.json, and plots.

Runs carry tags model, features, split, heldout (the held-out networks of a by_network split)
and split_seed: runs with the same (split, heldout, split_seed) share their train, validation
and test parts, and only their metrics compare like with like.

Registered model `mlflow.registered_model` (default `<workspace>-cost-model`): after each
training, among this workspace's newest runs of the split just trained (same split,
heldout, split_seed), the run with the highest `mlflow.best_metric` gets alias `best`, and
the best run of each feature set gets `best-<features>` (the tune stage, which can compute
only static features for unmeasured candidates, asks for `best-static`). The metric must be
a validation metric (`val_*`, default val_top1_score; ties broken by val_peak5 then
val_pair_acc): the test part is read for the report only, never to choose (`SelectionError`).

`log_evaluation` logs stage=compare's aggregated tables (leave-one-network-out, by_task over
seeds, the ablation) as a run tagged stage=compare.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from importlib import metadata
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.models import infer_signature
from omegaconf import DictConfig, OmegaConf

from models import plots
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SELECTION_PART = "val_"  # the only part whose metrics may choose a model
DEFAULT_BEST_METRIC = "val_top1_score"
TIEBREAK = ("val_peak5", "val_pair_acc")
SPLIT_KEYS = ("tags.split", "tags.heldout", "tags.split_seed")
PYFUNC_ENTRY = Path(__file__).resolve().with_name("pyfunc_model.py")


class SelectionError(PipelineError):
    """A model would be chosen with the test part."""


def best_metric(cfg) -> str:
    """`mlflow.best_metric`, refused unless it is a validation metric (`val_*`)."""
    metric = str(cfg.mlflow.get("best_metric") or DEFAULT_BEST_METRIC)
    if not metric.startswith(SELECTION_PART):
        raise SelectionError(
            f"mlflow.best_metric={metric!r} is not a validation metric: the test part is read once, for the "
            f"report, and choosing the `best` model with it makes every test figure of that model optimistic. "
            f"Use a val_* metric, e.g. mlflow.best_metric={DEFAULT_BEST_METRIC} (or val_pair_acc, val_peak5).")
    return metric


def tracking_uri(cfg) -> str:
    uri = cfg.get("mlflow", {}).get("tracking_uri") if cfg is not None else None
    return str(uri) if uri else f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def artifact_root(uri: str) -> Path:
    """`mlruns/` next to a sqlite database; the project's `mlruns/` otherwise."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).resolve().parent / "mlruns"
    return PROJECT_ROOT / "mlruns"


def experiment_name(cfg) -> str:
    return str(cfg.mlflow.get("experiment") or cfg.workspace)


def registered_name(cfg) -> str:
    return str(cfg.mlflow.get("registered_model") or f"{cfg.workspace}-cost-model")


def workspace_path(cfg) -> str:
    """The workspace folder as runs record it (tag workspace_path)."""
    return str(Path(cfg.paths.data).expanduser().resolve() / str(cfg.workspace))


def setup(cfg) -> str:
    """Point MLflow at the store; create the experiment if needed; returns its id."""
    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    name = experiment_name(cfg)
    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        root = artifact_root(uri) / name
        root.mkdir(parents=True, exist_ok=True)
        return mlflow.create_experiment(name, artifact_location=root.as_uri())
    return exp.experiment_id


def flatten(obj, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b.c": "value"}, lists as JSON (MLflow params are flat strings;
    `mlflow.log_params` batches them and truncates over-long values itself)."""
    if isinstance(obj, DictConfig):
        obj = OmegaConf.to_container(obj, resolve=True)
    if not obj:
        return {}
    flat = pd.json_normalize(obj, sep=".").iloc[0].to_dict()
    return {f"{prefix}{k}": json.dumps(v) if isinstance(v, (list, tuple)) else str(v) for k, v in flat.items()}


def _pins(*packages: str) -> list[str]:
    pins = []
    for p in packages:
        try:
            pins.append(f"{p}=={metadata.version(p)}")
        except metadata.PackageNotFoundError:
            pass
    return pins


REQUIREMENTS = {
    "lightgbm": ("lightgbm",),
    "xgboost": ("xgboost",),
    "pytorch": ("torch",),
}


def run_params(cfg, model_cfg: dict, features_cfg: dict) -> dict[str, str]:
    """The flattened Hydra config of one training run, with the model and feature-set configs
    it used in place of the `model` and `features` groups (model=all / features=each hold every
    config), and without the operator suite that stage=tune composes (tune.suite)."""
    conf = OmegaConf.to_container(cfg, resolve=True)
    conf["model"], conf["features"] = dict(model_cfg), dict(features_cfg)
    conf.get("tune", {}).pop("suite", None)
    return flatten(conf)


def log_run(cfg, *, model, table, split, evals: dict, timing: dict, predictions: dict, model_cfg: dict,
            features_cfg: dict | None = None) -> str:
    """Log one trained model and its evaluation as an MLflow run; returns the run id."""
    exp_id = setup(cfg)
    fs = table.spec.feature_set if model.name != "ms_xgb" else "static"
    run_name = f"{model.name}-{fs}-{split.kind}"
    tags = {"model": model.name, "features": fs, "split": split.kind, "heldout": split.heldout,
            "split_seed": str(split.seed), "workspace": cfg.workspace,
            "workspace_path": workspace_path(cfg), "input": model.spec.input, "calibrated": str(model.calibrated),
            "flavor": model.flavor, "target_kind": table.spec.target_kind}
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        params = run_params(cfg, model_cfg, features_cfg or {})
        params.update({"model.library": model.library, "split.seed_used": str(split.seed),
                       "split.sizes": json.dumps(split.sizes()), "split.info": json.dumps(split.info),
                       "features.set": fs, "features.n_columns": str(len(model.spec.columns)),
                       "features.n_store_columns": str(len(model.spec.store_columns))})
        mlflow.log_params(dict(sorted(params.items())))
        metrics = {}
        for part, ev in evals.items():
            metrics.update(ev.prefixed(part))
        metrics.update(timing)
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(v)})
        for part, ev in evals.items():
            mlflow.log_table(ev.per_task, f"{part}_per_task.json")
            mlflow.log_table(ev.per_group, f"{part}_per_group.json")
        mlflow.log_dict({"kind": split.kind, "seed": split.seed, **split.sizes(), **split.info}, "split.json")
        mlflow.log_text(model.spec.to_json(), "features.json")
        mlflow.log_text(json.dumps(table.notes, indent=2, default=str), "table_notes.json")
        mlflow.log_text(json.dumps(model.info, indent=2, default=str), "training_info.json")
        figures = {}
        test_frame, test_scores = predictions["test"]
        if len(test_frame):
            figures["predicted_vs_measured"] = plots.predicted_vs_measured(test_frame, test_scores, f"{run_name}: test")
            figures["topk_curve"] = plots.topk_curve(test_frame, test_scores, f"{run_name}: test")
        imp = model.importance()
        if imp is not None and len(imp):
            figures["feature_importance"] = plots.importance(imp, f"{run_name}: feature importance")
            mlflow.log_table(imp.rename("gain").rename_axis("feature").reset_index(), "feature_importance.json")
        figures["training_curve"] = plots.training_curve(model.info, f"{run_name}: training")
        for name, fig in figures.items():
            if fig is not None:
                mlflow.log_figure(fig, f"plots/{name}.png", save_kwargs={"dpi": plots.DPI})
        # the pyfunc's artifact is a local folder: MLflow copies it into the logged model
        with tempfile.TemporaryDirectory() as tmp:
            saved = Path(tmp) / "saved_model"
            model.save(saved)
            _log_models(model, saved, table)
        return run.info.run_id


def _log_models(model, saved: Path, table) -> None:
    base = _pins("mlflow", "numpy", "pandas")
    flavor_pins = list(_pins(*REQUIREMENTS.get(model.flavor, ())))
    if model.flavor == "lightgbm":
        mlflow.lightgbm.log_model(model.native(), name="native", pip_requirements=base + flavor_pins)
    elif model.flavor == "xgboost":
        mlflow.xgboost.log_model(model.native(), name="native", model_format="json", pip_requirements=base + flavor_pins)
    elif model.flavor == "pytorch":
        # pickle: the default pt2 export traces one fixed input shape; stores per record vary
        mlflow.pytorch.log_model(model.native(), name="native", serialization_format="pickle",
                                 pip_requirements=base + flavor_pins)
    example = table.take(np.arange(min(len(table), 4))).store_frame()
    feats = [*model.spec.columns, *model.spec.store_columns]
    example = example[["record_id", *feats]].astype({c: "float64" for c in feats})  # counters may be null
    extra = _pins("apache-tvm", "apache-tvm-ffi") if model.name == "ms_xgb" else []
    info = mlflow.pyfunc.log_model(
        name="model", python_model=str(PYFUNC_ENTRY), artifacts={"model": str(saved)},
        pip_requirements=base + flavor_pins + extra + _pins("tensor-cost-pipeline"),
        signature=infer_signature(example, model.predict_frame(example)), input_example=example,
        metadata={"feature_set": model.spec.feature_set, "input": model.spec.input, "columns": model.spec.columns,
                  "store_columns": model.spec.store_columns, "target_kind": model.spec.target_kind,
                  "calibrated": model.calibrated},
    )
    mlflow.set_tag("pyfunc_model_uri", info.model_uri)


def workspace_runs(cfg) -> pd.DataFrame:
    """Every finished training run of this workspace (its experiment, filtered by workspace
    path; runs of stage=compare and stage=tune carry no model tag and are left out)."""
    mlflow.set_tracking_uri(tracking_uri(cfg))
    path = workspace_path(cfg)
    exp = mlflow.get_experiment_by_name(experiment_name(cfg))
    if exp is None:
        return pd.DataFrame()
    runs = mlflow.search_runs(experiment_ids=[exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                              output_format="pandas", max_results=50000)
    if runs.empty or "tags.workspace_path" not in runs.columns or "tags.model" not in runs.columns:
        return pd.DataFrame()
    return runs[(runs["tags.workspace_path"] == path) & runs["tags.model"].notna()].reset_index(drop=True)


def with_split_tags(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with the split identity columns (empty strings where a run lacks the tag)."""
    runs = runs.copy()
    for k in SPLIT_KEYS:
        runs[k] = runs[k].fillna("").astype(str) if k in runs.columns else ""
    return runs


def latest_per_config(runs: pd.DataFrame) -> pd.DataFrame:
    """The newest run of each (model, features, split, heldout, split_seed)."""
    if runs.empty:
        return runs
    keys = ["tags.model", "tags.features", *SPLIT_KEYS]
    return with_split_tags(runs).sort_values("start_time", ascending=False).drop_duplicates(keys).reset_index(drop=True)


def rank_runs(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Runs best first by `metric`, then the tie-breaks, then the newest; a missing value ranks
    last (a top-k metric is missing where no validation task has enough records, every
    metric where the validation part has one record per task)."""
    cols = [f"metrics.{m}" for m in dict.fromkeys((metric, *TIEBREAK)) if f"metrics.{m}" in runs.columns]
    return runs.sort_values(cols + ["start_time"], ascending=[False] * (len(cols) + 1), na_position="last")


def update_aliases(cfg, split_identity: tuple[str, str, int]) -> dict[str, str]:
    """Register the best run (overall and per feature set) among the newest runs of the split
    `split_identity` (Split.identity: kind, heldout, seed) and point the aliases at it."""
    metric = best_metric(cfg)
    runs = latest_per_config(workspace_runs(cfg))
    if runs.empty or "tags.pyfunc_model_uri" not in runs.columns:
        return {}
    # Runs of other splits were validated on other records: compare within one split.
    kind, heldout, seed = split_identity
    runs = runs.dropna(subset=["tags.pyfunc_model_uri"])
    runs = runs[(runs["tags.split"] == kind) & (runs["tags.heldout"] == heldout) & (runs["tags.split_seed"] == str(seed))]
    name = registered_name(cfg)
    client = MlflowClient()
    chosen = {}
    ranked = rank_runs(runs, metric)
    if ranked.empty:
        return {}
    have = [m for m in (metric, *TIEBREAK) if f"metrics.{m}" in ranked.columns and ranked[f"metrics.{m}"].notna().any()]
    if len(ranked) > 1 and metric not in have:
        log.warning("no run has %s (too few validation records per task, see train.topk_min_records): `best` is %s",
                    metric, f"chosen by {have[0]}" if have else "the newest run: the validation part is too small "
                    "to choose (one record per task); measure more candidates per task")
    chosen["best"] = ranked.iloc[0]
    for fs, g in ranked.groupby("tags.features", sort=True):
        chosen[f"best-{fs}"] = g.iloc[0]
    versions = {}
    out = {}
    for alias, row in chosen.items():
        rid = row["run_id"]
        if rid not in versions:
            existing = client.search_model_versions(f"name = '{name}' and run_id = '{rid}'")
            if existing:
                versions[rid] = existing[0].version
            else:
                mv = mlflow.register_model(row["tags.pyfunc_model_uri"], name,
                                           tags={"model": row["tags.model"], "features": row["tags.features"],
                                                 "split": row["tags.split"], "heldout": row["tags.heldout"],
                                                 "split_seed": row["tags.split_seed"],
                                                 metric: str(row.get(f"metrics.{metric}", np.nan))})
                versions[rid] = mv.version
        client.set_registered_model_alias(name, alias, versions[rid])
        held = f" held out {row['tags.heldout']}" if row["tags.heldout"] else ""
        used = next((m for m in (metric, *TIEBREAK) if pd.notna(row.get(f"metrics.{m}", np.nan))), None)
        why = f"{used} {float(row[f'metrics.{used}']):.3f}" if used else "no validation metric"
        out[alias] = (f"{row['tags.model']}/{row['tags.features']}/{row['tags.split']}{held} seed "
                      f"{row['tags.split_seed']} (v{versions[rid]}, {why})")
    client.update_registered_model(name, description=f"Cost models of workspace {cfg.workspace}; alias best = highest "
                                                     f"{metric} (ties: {', '.join(TIEBREAK)}) among the runs of "
                                                     f"the last split trained; best-<features> per feature set.")
    return out


def metric_key(name: str) -> str:
    """A task or network name as part of an MLflow metric name (its allowed characters)."""
    return re.sub(r"[^0-9A-Za-z_.\-/ ]", "_", str(name))[:200]


def log_tune_run(cfg, *, files: dict, summary: pd.DataFrame, curves: pd.DataFrame, end_to_end: pd.DataFrame,
                 tags: dict, run_name: str, baseline: str = "xgb") -> str:
    """One MLflow run (tag stage=tune) for a tuning comparison: the `tune.*` config, per-task
    metrics `<metric>.<task>.<cost model>`, the first seed's best latency after every batch as
    step metrics `curve_us.<task>.<cost model>`, and the report files under `tune/`."""
    exp = setup(cfg)
    with mlflow.start_run(experiment_id=exp, run_name=run_name, tags={"stage": "tune", **tags}) as run:
        tune = OmegaConf.to_container(cfg.tune, resolve=True)
        tune.pop("suite", None)  # the dataset=ops config composed for tune.tasks=ops
        params = flatten(tune, "tune.")
        params.update({"target": json.dumps(OmegaConf.to_container(cfg.target.tvm, resolve=True)),
                       "budget": str(cfg.budget.name), "seed": str(cfg.seed)})
        mlflow.log_params(dict(sorted(params.items())))
        metrics = {}
        for r in summary.itertuples(index=False):
            k = f"{metric_key(r.task)}.{r.cost_model}"
            metrics[f"best_latency_us.{k}"] = r.best_latency_us
            metrics[f"gflops.{k}"] = r.gflops
            metrics[f"tuning_min.{k}"] = r.tuning_min
            metrics[f"speedup_vs_{baseline}.{k}"] = getattr(r, f"speedup_vs_{baseline}")
            metrics[f"trials_to_{baseline}_best.{k}"] = getattr(r, f"trials_to_{baseline}_best")
        for r in end_to_end.itertuples(index=False):
            metrics[f"e2e_latency_ms.{r.cost_model}.s{r.seed}"] = r.e2e_latency_ms
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(float(v))})
        if len(curves):
            first = curves[(curves["seed"] == curves["seed"].min()) & np.isfinite(curves["best_s"].astype(float))]
            now = int(time.time() * 1000)
            MlflowClient().log_batch(run.info.run_id, metrics=[
                Metric(f"curve_us.{metric_key(c.task)}.{c.cost_model}", float(c.best_s) * 1e6, now, int(c.trial))
                for c in first.itertuples(index=False)])
        for p in files.values():
            mlflow.log_artifact(str(p), artifact_path="tune")
        return run.info.run_id


def log_evaluation(cfg, *, tables: dict[str, pd.DataFrame], files: list[Path], params: dict) -> str:
    """One MLflow run (tag stage=compare) with stage=compare's aggregated tables (MLflow
    tables, `MlflowClient().load_table`), its report files and the parameters that made them."""
    exp = setup(cfg)
    with mlflow.start_run(experiment_id=exp, run_name="compare", tags={"stage": "compare",
                                                                        "workspace": cfg.workspace,
                                                                        "workspace_path": workspace_path(cfg)}) as run:
        mlflow.log_params({k: str(v) for k, v in sorted(params.items())})
        for name, table in tables.items():
            if len(table):
                mlflow.log_table(table, f"{name}.json")
        for p in files:
            mlflow.log_artifact(str(p), artifact_path="reports")
        return run.info.run_id
