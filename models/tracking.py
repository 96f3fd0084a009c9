"""MLflow: one run per (model, features, split), a registered model with aliases, tune runs.

Tracking store: `mlflow.tracking_uri`, by default `sqlite:///<project root>/mlflow.db`
(`mlflow ui --backend-store-uri sqlite:///mlflow.db` from the project root shows it); the
artifacts of an experiment go to `mlruns/` next to the database file. Experiment = the
workspace name. Runs find their workspace by identity, not by folder: tag `workspace_id`
(a hash of the dataset name, the target name and the content hash of the task table,
pipeline/core/identity.py), so a copied or moved workspace keeps its runs and two
workspaces of one name with other tasks stay apart; `workspace_path` records where the
workspace was when the run was made.

Each training run (tag stage=train) logs: the flattened Hydra config as params (with the
effective model and feature-set configs under `model.*` and `features.*`, the split's seed and
held-out units), its input datasets (`mlflow.log_input`: the train, validation and test
parts of the training table, with their digests and the workspace as source), every metric
of models.metrics for the validation and test parts (`val_*`, `test_*`), training time and
prediction rate, the learning curves as step metrics (`curve/<name>`, one step per boosting
round or epoch), the per-task and per-group metric tables, the model (models/pyfunc.py: its
native flavor and a portable pyfunc in one MLflow model), features.json, and plots.

Runs carry tags model, features, split, heldout (the held-out networks of a by_network split)
and split_seed: runs with the same (split, heldout, split_seed) share their train, validation
and test parts, and only their metrics compare like with like.

Registered model `mlflow.registered_model` (default `<workspace>-cost-model`): after each
training, among this workspace's newest runs of the split just trained (same split,
heldout, split_seed), the run with the highest `mlflow.best_metric` among those that can serve
tuning (trained on static features: MetaSchedule's unmeasured candidates have no profiler
counters) gets alias `best`, and the best run of each feature set gets `best-<features>`
(`best-profiler` is reported beside `best`, never chosen as it). The metric must be
a validation metric (`val_*`, default val_top1_score; ties broken by val_peak5 then
val_pair_acc, then the run that holds the alias): the test part is read for the report only,
never to choose (`SelectionError`). Trainings that run at once (a sweep) choose one after the
other, under the registered model's lock in the store (`mlruns/.locks/`).

A tune run (tag stage=tune) holds the tuning report; one nested run per (task, cost model)
carries them as tags and the metrics under plain names (`best_latency_us`, a step metric
over trials whose last value is the summary's, `gflops`, ...), with the same params as
training runs.

`log_evaluation` logs stage=compare's aggregated tables (leave-one-network-out, every split
over its seeds, the ablation) of the runs one comparison selected, as a run tagged
stage=compare.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric
from omegaconf import DictConfig, OmegaConf

from models import plots, pyfunc
from models.metrics import GROUP_METRICS, RANDOM_METRICS
from pipeline.core.errors import PipelineError
from pipeline.core.locks import exclusive
from pipeline.core.home import home
from pipeline.core.workspace import Workspace

log = logging.getLogger(__name__)

SELECTION_PART = "val_"  # the only part whose metrics may choose a model
DEFAULT_BEST_METRIC = "val_top1_score"
TIEBREAK = ("val_peak5", "val_pair_acc")
SPLIT_KEYS = ("tags.split", "tags.heldout", "tags.split_seed")
# Feature sets that exist for a candidate that has not run (features/candidates.py, feature_plan):
# only a model trained on one of them can rank MetaSchedule's candidates, so only those hold `best`.
TUNING_FEATURES = ("static",)
TRAIN, TUNE, COMPARE = "train", "tune", "compare"  # tag `stage` of the runs


class SelectionError(PipelineError):
    """A model would be chosen with the test part."""


@dataclass
class Store:
    """Where a workspace's runs are tracked and under which names: the tracking URI, the
    experiment, the registered model, the metric that chooses `best`, and the workspace the runs
    belong to (its tags are read from its task table when a run is first logged or searched).
    A stage makes one from its config (pipeline/options.py); `config` is that config,
    resolved, which every run logs as its params."""

    uri: str
    experiment: str
    registered_model: str
    best_metric: str
    workspace: str
    root: Path
    dataset: str
    target: str
    device: str = "cpu"
    config: dict = field(default_factory=dict)

    def __post_init__(self):
        check_best_metric(self.best_metric)

    @functools.cached_property
    def tags(self) -> dict[str, str]:
        """Tags that tie a run to its workspace: the identity (Workspace.identity) and, for the
        record, the folder it was in."""
        ws = Workspace(self.root)
        return {"workspace": self.workspace, **ws.identity(self.dataset, self.target), "workspace_path": str(ws.root)}


def check_best_metric(metric: str) -> str:
    """`mlflow.best_metric`, refused unless it is a validation metric (`val_*`)."""
    if not metric.startswith(SELECTION_PART):
        raise SelectionError(
            f"mlflow.best_metric={metric!r} is not a validation metric: the test part is read once, for the "
            f"report, and choosing the `best` model with it makes every test figure of that model optimistic. "
            f"Use a val_* metric, e.g. mlflow.best_metric={DEFAULT_BEST_METRIC} (or val_pair_acc, val_peak5).")
    return metric


def tracking_uri(uri: str | None = None) -> str:
    """`uri` (`mlflow.tracking_uri`), else `sqlite:///<home>/mlflow.db` (home: $PIPELINE_HOME or the
    working folder, pipeline/core/home.py), so an installed package never writes into its install folder."""
    return str(uri) if uri else f"sqlite:///{home() / 'mlflow.db'}"


def artifact_root(uri: str) -> Path:
    """`mlruns/` next to a sqlite database; `<home>/mlruns` otherwise."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///"):]).resolve().parent / "mlruns"
    return home() / "mlruns"


def setup(store: Store) -> str:
    """Point MLflow at the store; create the experiment if needed; returns its id. Under the
    store's lock: two trainings that start at once on a new store would both create its tables
    and the experiment, and one would fail."""
    mlflow.set_tracking_uri(store.uri)
    name = store.experiment
    with store_lock(store, "experiments"):
        exp = mlflow.get_experiment_by_name(name)
        if exp is None:
            root = artifact_root(store.uri) / name
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


def run_params(config: dict, model_cfg: dict | None = None, features_cfg: dict | None = None) -> dict[str, str]:
    """The flattened Hydra config of a run, with the model and feature-set configs it used in
    place of the `model` and `features` groups (model=all / features=each hold every config;
    a run that trains nothing, a tune run, has neither), and without the operator suite that
    stage=tune composes (tune.suite)."""
    conf = copy.deepcopy(config)
    for key, value in (("model", model_cfg), ("features", features_cfg)):
        if value is None:
            conf.pop(key, None)
        else:
            conf[key] = dict(value)
    conf.get("tune", {}).pop("suite", None)
    return flatten(conf)


def metric_key(name: str) -> str:
    """A name as part of an MLflow metric name (its allowed characters)."""
    return re.sub(r"[^0-9A-Za-z_.\-/ ]", "_", str(name))[:200]


def log_steps(run_id: str, series: dict[str, list[float]]) -> None:
    """Step metrics `{key: values}`: value i at step i + 1 (after round / epoch i + 1)."""
    now = int(time.time() * 1000)
    metrics = [Metric(metric_key(k), float(v), now, i + 1) for k, values in series.items()
               for i, v in enumerate(values) if v is not None and np.isfinite(float(v))]
    if metrics:
        MlflowClient().log_batch(run_id, metrics=metrics)


def log_inputs(store: Store, table, split) -> None:
    """The parts of the training table the run saw, as MLflow datasets (name, digest, source).

    Two trainings that log the same dataset at once would both insert it (MLflow looks it up,
    then inserts: the second insert breaks its unique key), so the logging holds the store's
    dataset lock."""
    source = str(store.root)
    with warnings.catch_warnings(), store_lock(store, "datasets"):
        # MLflow registers local paths twice (schemes "" and "file") and warns that it picked
        # one; and a dataset's schema is a description, not an enforced input
        warnings.filterwarnings("ignore", "The specified dataset source can be interpreted", UserWarning)
        warnings.filterwarnings("ignore", "Hint: Inferred schema contains integer", UserWarning)
        for context, rows in (("train", split.train), ("validation", split.val), ("test", split.test)):
            if len(rows):
                frame = table.frame.iloc[rows].reset_index(drop=True)
                ds = mlflow.data.from_pandas(frame, source=source, targets="label",
                                             name=f"{store.workspace}/{table.spec.feature_set}/{split.kind}/{context}")
                mlflow.log_input(ds, context=context)


def log_run(store: Store, *, model, table, split, evals: dict, timing: dict, predictions: dict, model_cfg: dict,
            features_cfg: dict | None = None) -> str:
    """Log one trained model and its evaluation as an MLflow run; returns the run id."""
    exp_id = setup(store)
    fs = model.spec.feature_set  # what it reads (static for ms_xgb and a counter model); trained_on: its table's
    run_name = f"{model.name}-{fs}-{split.kind}"
    tags = {"stage": TRAIN, "model": model.name, "features": fs, "split": split.kind, "heldout": split.heldout,
            "split_seed": str(split.seed), **store.tags, "input": model.spec.input,
            "calibrated": str(model.calibrated), "flavor": model.flavor, "target_kind": table.spec.target_kind,
            "trained_on": table.spec.feature_set}
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        params = run_params(store.config, model_cfg, features_cfg or {})
        params.update({"model.library": model.library, "split.seed_used": str(split.seed),
                       "split.sizes": json.dumps(split.sizes()), "split.info": json.dumps(split.info),
                       "features.set": fs, "features.n_columns": str(len(model.spec.columns)),
                       "features.n_store_columns": str(len(model.spec.store_columns))})
        mlflow.log_params(dict(sorted(params.items())))
        log_inputs(store, table, split)
        metrics = {}
        for part, ev in evals.items():
            metrics.update(ev.prefixed(part))
        metrics.update(timing)
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None and np.isfinite(v)})
        log_steps(run.info.run_id, {f"curve/{k}": v for k, v in plots.learning_curves(model.info).items()})
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
        info = pyfunc.log_model(model, table, device=store.device)
        mlflow.set_tag("pyfunc_model_uri", info.model_uri)
        return run.info.run_id


def experiment_runs(uri: str, experiment: str, stage: str = TRAIN, workspace: str | None = None) -> pd.DataFrame:
    """Every finished run of one stage (train or tune) in an experiment, of the workspace
    named `workspace` only when given; the runs of stage=compare are never training runs."""
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        return pd.DataFrame()
    runs = mlflow.search_runs(experiment_ids=[exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                              output_format="pandas", max_results=50000)
    if runs.empty:
        return pd.DataFrame()
    # runs made before the stage tag: training runs are the ones that name a model
    stage_of = _tag(runs, "stage").fillna(_tag(runs, "model").notna().map({True: TRAIN, False: ""}))
    keep = stage_of == stage
    if workspace is not None:
        keep &= _tag(runs, "workspace") == workspace
    return runs[keep].reset_index(drop=True)


def workspace_runs(store: Store, stage: str = TRAIN) -> pd.DataFrame:
    """Every finished run of one stage of this workspace: its experiment's runs of its
    identity (and runs made before identities were recorded, by their folder)."""
    runs = experiment_runs(store.uri, store.experiment, stage)
    if runs.empty:
        return runs
    tags = store.tags
    mine = _tag(runs, "workspace_id") == tags["workspace_id"]
    mine |= _tag(runs, "workspace_id").isna() & (_tag(runs, "workspace_path") == tags["workspace_path"])
    return runs[mine].reset_index(drop=True)


def _tag(runs: pd.DataFrame, name: str) -> pd.Series:
    col = f"tags.{name}"
    return runs[col] if col in runs.columns else pd.Series(None, index=runs.index, dtype=object)


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


def store_lock(store: Store, what: str):
    """Wait for, then hold, the right to change `what` in the tracking store: a lock file in its
    artifact folder (`mlruns/.locks/`), so that every process on that store, of any workspace,
    takes the same one."""
    root = artifact_root(store.uri) / ".locks"
    return exclusive(root / f"{re.sub(r'[^0-9A-Za-z_.-]', '_', what)}.lock", what=f"a writer of {what}", wait_s=None)


def _rank_key(row: pd.Series, metric: str) -> tuple:
    """The values a run is ranked by (rank_runs), NaN as None so that equal keys compare equal."""
    values = (row.get(f"metrics.{m}", np.nan) for m in dict.fromkeys((metric, *TIEBREAK)))
    return tuple(None if v is None or pd.isna(v) else float(v) for v in values)


def _holder(client: MlflowClient, name: str, alias: str):
    """The model version that holds `alias` now (None when none does)."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return None  # no registered model, or no version with the alias yet


def update_aliases(store: Store, split_identity: tuple[str, str, int]) -> dict[str, str]:
    """Register the best runs among the newest runs of the split `split_identity`
    (Split.identity: kind, heldout, seed) and point the aliases at them: `best` among the runs
    that can serve tuning (TUNING_FEATURES), `best-<features>` per feature set.

    Two trainings at once (a sweep) would each read the runs, then set the aliases: the later
    write could put back a run that the earlier one had beaten, and both could register one run
    twice. So the runs are read, ranked and the aliases moved in one step under the registered
    model's lock in the store, and an alias moves only to a run that ranks above its holder (on a
    tie it stays), or when its holder is no longer among the runs ranked (another split, or an
    older run of a configuration trained again)."""
    with store_lock(store, f"registered model {store.registered_model}"):
        return _update_aliases(store, split_identity)


def _version_of(client: MlflowClient, name: str, row: pd.Series, metric: str, held, versions: dict) -> str:
    """The registered version of run `row` (registered now when it has none), memoised in
    `versions`; the version that holds an alias stays its version, whatever others the run has."""
    rid = row["run_id"]
    if held is not None and held.run_id == rid:
        versions.setdefault(rid, held.version)
    if rid not in versions:
        existing = client.search_model_versions(f"name = '{name}' and run_id = '{rid}'")
        if existing:
            versions[rid] = min(existing, key=lambda v: int(v.version)).version
        else:
            mv = mlflow.register_model(row["tags.pyfunc_model_uri"], name,
                                       tags={"model": row["tags.model"], "features": row["tags.features"],
                                             "split": row["tags.split"], "heldout": row["tags.heldout"],
                                             "split_seed": row["tags.split_seed"],
                                             metric: str(row.get(f"metrics.{metric}", np.nan))})
            versions[rid] = mv.version
    return versions[rid]


def _describe_choice(row: pd.Series, metric: str, version: str, change: str) -> str:
    """One line for the console: which run holds an alias, chosen by which validation metric."""
    where = f" held out {row['tags.heldout']}" if row["tags.heldout"] else ""
    used = next((m for m in (metric, *TIEBREAK) if pd.notna(row.get(f"metrics.{m}", np.nan))), None)
    why = f"{used} {float(row[f'metrics.{used}']):.3f}" if used else "no validation metric"
    return (f"{row['tags.model']}/{row['tags.features']}/{row['tags.split']}{where} seed "
            f"{row['tags.split_seed']} (v{version}, {why}; {change})")


def _update_aliases(store: Store, split_identity: tuple[str, str, int]) -> dict[str, str]:
    metric = store.best_metric
    runs = latest_per_config(workspace_runs(store))
    if runs.empty or "tags.pyfunc_model_uri" not in runs.columns:
        return {}
    # Runs of other splits were validated on other records: compare within one split.
    kind, heldout, seed = split_identity
    runs = runs.dropna(subset=["tags.pyfunc_model_uri"])
    runs = runs[(runs["tags.split"] == kind) & (runs["tags.heldout"] == heldout) & (runs["tags.split_seed"] == str(seed))]
    name = store.registered_model
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
    serving = ranked[ranked["tags.features"].isin(TUNING_FEATURES)]
    if len(serving):
        chosen["best"] = serving
    else:
        _drop_alias(client, name, "best")
        log.warning("no model of this split was trained on features that tuning can compute (%s): alias `best` "
                    "is not set; train one with features=static", ", ".join(TUNING_FEATURES))
    for fs, g in ranked.groupby("tags.features", sort=True):
        chosen[f"best-{fs}"] = g
    versions, out = {}, {}
    for alias, candidates in chosen.items():
        row = candidates.iloc[0]
        held = _holder(client, name, alias)
        if held is not None and held.run_id != row["run_id"]:
            mine = candidates[candidates["run_id"] == held.run_id]
            if len(mine) and _rank_key(mine.iloc[0], metric) == _rank_key(row, metric):
                row = mine.iloc[0]  # a tie: the holder keeps the alias
        version = _version_of(client, name, row, metric, held, versions)
        moved = held is None or str(held.version) != str(version)
        if moved:
            client.set_registered_model_alias(name, alias, version)
        change = "kept" if not moved else (f"was v{held.version}" if held is not None else "new")
        out[alias] = _describe_choice(row, metric, version, change)
    client.update_registered_model(name, description=f"Cost models of workspace {store.workspace}; alias best = highest "
                                                     f"{metric} (ties: {', '.join(TIEBREAK)}, then the holder) among "
                                                     f"the newest runs of the last split trained that can serve tuning "
                                                     f"(features {', '.join(TUNING_FEATURES)}); best-<features> per "
                                                     f"feature set.")
    return out


def _drop_alias(client: MlflowClient, name: str, alias: str) -> None:
    """Remove `alias` of registered model `name` if it is set (one left from an earlier split
    would point at a model this split did not choose)."""
    try:
        client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return
    client.delete_registered_model_alias(name, alias)


def log_tune_run(store: Store, *, files: dict, summary: pd.DataFrame, curves: pd.DataFrame, end_to_end: pd.DataFrame,
                 tags: dict, run_name: str, baseline: str = "xgb") -> str:
    """One MLflow run (tag stage=tune) for a tuning comparison, with the report files under
    `tune/`, and a nested run per (task, cost model) and, for a network, per (network, cost
    model): tags task / network and cost_model, the summary's columns as metrics (means over
    seeds, `_min` / `_max` their spread), and
    `best_latency_us` after every batch (mean over seeds) as a step metric over trials.
    Every run has the params of a training run (run_params). Returns the parent's id."""
    exp = setup(store)
    base = {"stage": TUNE, **store.tags, **tags}
    params = dict(sorted(run_params(store.config).items()))
    reach = f"trials_to_{baseline}_best"
    values = ["best_latency_us", "best_latency_us_min", "best_latency_us_max", "gflops", "tuning_min",
              f"speedup_vs_{baseline}", reach, f"{reach}_min", f"{reach}_max", "trials", "valid_trials", "seeds",
              "reached", "refits"]
    curve = curves.assign(best_us=curves["best_s"].astype(float) * 1e6).groupby(
        ["task", "cost_model", "trial"], as_index=False)["best_us"].mean() if len(curves) else curves
    with mlflow.start_run(experiment_id=exp, run_name=run_name, tags=base) as run:
        mlflow.log_params(params)
        for p in files.values():
            mlflow.log_artifact(str(p), artifact_path="tune")
        for r in summary.to_dict("records"):
            with mlflow.start_run(experiment_id=exp, run_name=f"{r['task']}-{r['cost_model']}", nested=True,
                                  tags={**base, "task": str(r["task"]), "cost_model": str(r["cost_model"])}) as child:
                mlflow.log_params(params)
                mine = curve[(curve["task"] == r["task"]) & (curve["cost_model"] == r["cost_model"])] \
                    if len(curve) else curve
                steps = _at_trials(mine)
                if steps:  # the curve ends at the summary's value
                    steps[-1] = r["best_latency_us"]
                    log_steps(child.info.run_id, {"best_latency_us": steps})
                _log_values({k: r.get(k) for k in values if not (steps and k == "best_latency_us")})
        for (network, cost_model), rows in (end_to_end.groupby(["network", "cost_model"], sort=False)
                                            if len(end_to_end) else []):
            with mlflow.start_run(experiment_id=exp, run_name=f"{network}-{cost_model}", nested=True,
                                  tags={**base, "network": str(network), "cost_model": str(cost_model)}):
                mlflow.log_params(params)
                e2e = rows["e2e_latency_ms"].astype(float)
                _log_values({"e2e_latency_ms": e2e.mean(), "e2e_latency_ms_min": e2e.min(),
                             "e2e_latency_ms_max": e2e.max(), "seeds": len(rows),
                             "speedup_vs_untuned": rows["speedup_vs_untuned"].mean()
                             if "speedup_vs_untuned" in rows else None})
        return run.info.run_id


def _at_trials(curve: pd.DataFrame) -> list:
    """Values by step for log_steps (index = trial - 1; None where no batch ended)."""
    if curve.empty:
        return []
    out = [None] * int(curve["trial"].max())
    for t, v in zip(curve["trial"].astype(int), curve["best_us"]):
        out[t - 1] = v
    return out


def _log_values(values: dict) -> None:
    mlflow.log_metrics({k: float(v) for k, v in values.items() if v is not None and np.isfinite(float(v))})


def uri_run(uri: str) -> tuple[str | None, str | None, str | None]:
    """(run id, registered name, version) of a models:/ or runs:/ URI (None where unknown);
    `models:/m-<id>` is a logged model (a run's tag pyfunc_model_uri), of no registered name."""
    client = MlflowClient()
    if uri.startswith("models:/"):
        ref = uri[len("models:/"):].strip("/")
        if "/" not in ref and "@" not in ref:
            return mlflow.get_logged_model(ref).source_run_id, None, None
        if "@" in ref:
            name, alias = ref.split("@", 1)
            mv = client.get_model_version_by_alias(name, alias)
        else:
            name, _, version = ref.partition("/")
            mv = client.get_model_version(name, version)
        return mv.run_id, name, str(mv.version)
    if uri.startswith("runs:/"):
        return uri[len("runs:/"):].split("/", 1)[0], None, None
    return None, None, None


def split_of_run(run_id: str) -> dict:
    """The split a training run logged (split.json: kind, held-out test tasks and networks);
    {} when the run has none."""
    try:
        return dict(mlflow.artifacts.load_dict(f"runs:/{run_id}/split.json"))
    except Exception as e:  # noqa: BLE001 - runs logged without it (older runs): no split known
        log.warning("run %s: no split.json (%s): its held-out tasks are unknown", run_id, type(e).__name__)
        return {}


def logged_table(run_id: str, name: str) -> pd.DataFrame | None:
    """A table a run logged with mlflow.log_table (`name`, e.g. test_per_task.json); None
    where the run has none (logged before such tables were)."""
    try:
        path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=name)
    except mlflow.exceptions.MlflowException:
        return None
    table = json.loads(Path(path).read_text())  # mlflow.log_table's format: columns and data
    return pd.DataFrame(table["data"], columns=table["columns"])


def per_task_tables(runs: pd.DataFrame, part: str = "test") -> pd.DataFrame:
    """The per-task tables (`<part>_per_task.json`) of training runs, one frame with each
    run's id; empty when no run logged one."""
    frames = [t.assign(run_id=run_id) for run_id in runs.get("run_id", pd.Series(dtype=str))
              if (t := logged_table(run_id, f"{part}_per_task.json")) is not None]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def validation_networks_of(split_info) -> list[str]:
    """The whole networks a run validated on, from its `split.info` param (JSON); [] where it
    validated on tasks or records, or logged no such param."""
    try:
        return list(json.loads(split_info).get("val_networks") or [])
    except (TypeError, ValueError, AttributeError):
        return []


def validation_on_own_networks(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with their validation metrics that are means over networks (top-k scores, a
    random pick's) taken from each run's `val_per_group.json` over its validation networks
    alone, where it validated on whole networks. Runs logged before a validation network was
    scored alone averaged it with the training networks that call a few of its tasks; read
    this way, they compare with the runs logged since, which it leaves as they are."""
    if runs.empty or "params.split.info" not in runs.columns:
        return runs
    runs = runs.copy()
    cols = {m: f"metrics.val_{m}" for m in (*GROUP_METRICS, *RANDOM_METRICS)}
    for i, (run_id, info) in enumerate(zip(runs["run_id"], runs["params.split.info"])):
        nets = validation_networks_of(info)
        groups = logged_table(run_id, "val_per_group.json") if nets else None
        own = groups[groups["group"].isin(nets)] if groups is not None else None
        if own is None or own.empty:
            continue
        for m, col in cols.items():
            if col in runs.columns and m in own.columns:
                runs.iloc[i, runs.columns.get_loc(col)] = float(np.nanmean(own[m].astype(float)))
    return runs


def log_evaluation(store: Store, *, tables: dict[str, pd.DataFrame], files: list[Path], params: dict,
                   tags: dict | None = None) -> str:
    """One MLflow run (tag stage=compare) with stage=compare's aggregated tables (MLflow
    tables, `MlflowClient().load_table`), its report files, the parameters that made them and
    `tags` (what the comparison selected)."""
    exp = setup(store)
    with mlflow.start_run(experiment_id=exp, run_name=str((tags or {}).get("report", COMPARE)),
                          tags={"stage": COMPARE, **store.tags, **(tags or {})}) as run:
        mlflow.log_params({k: str(v) for k, v in sorted(params.items())})
        for name, table in tables.items():
            if len(table):
                mlflow.log_table(table, f"{name}.json")
        for p in files:
            mlflow.log_artifact(str(p), artifact_path="reports")
        return run.info.run_id


def model_source(uri: str) -> dict:
    """What the store knows of the run behind a model URI (`models:/<name>@<alias>`,
    `models:/<name>/<version>`, `runs:/<id>/model`): uri, run_id, registered_model, version,
    and, when a run is found, its tags model, features, split, workspace, workspace_path and
    its split's held-out test tasks and networks (split_known: whether split.json was logged)."""
    run_id, name, version = uri_run(uri)
    info = {"uri": uri, "run_id": run_id, "registered_model": name, "version": version}
    if run_id:
        tags = mlflow.get_run(run_id).data.tags
        info.update({k: tags.get(k) for k in ("model", "features", "split", "workspace", "workspace_path")})
        split = split_of_run(run_id)
        info["split_known"] = bool(split)
        info["test_tasks"] = list(split.get("test_tasks") or [])
        info["test_networks"] = list(split.get("test_networks") or [])
    return info
