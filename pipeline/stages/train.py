"""stage=train: cost models on the workspace's measurements and features, logged to MLflow.

`model=all` (default) trains every model of `train.models`, `features=each` (default) every
feature set of `train.features`; `model=<name>` / `features=<set>` pick one, so a Hydra
multirun (`-m model=lgbm,xgb features=static,profiler`) gives one run per combination.
The split is drawn once on all successfully measured records, so every model and feature
set is trained and tested on the same records (those that have the features). Every choice
(early stopping, the `best` alias) reads the validation part; the test part is scored for the
report. A leave-one-network-out evaluation is a sweep over `split.test_networks` and `seed`
that stage=compare aggregates.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf

from models import registry, tracking
from models.metrics import evaluate
from models.splits import Split, make_split, training_only
from models.tables import FEATURE_SETS, HARNESS, FeatureSetError, build_table, labelled_records, memberships
from pipeline.core import locks
from pipeline.core.workspace import WorkspaceError
from pipeline.options import tracking_store, workspace_of
from pipeline.summary import OBJECTIVE, with_values

log = logging.getLogger(__name__)

EACH = "each"
STATIC_ONLY = {"ms_xgb"}  # models that read their own static features


def _selected(group: DictConfig, names, list_key: str, option: str, noun: str, error) -> list[DictConfig]:
    """The configs `names` (the list `list_key`) among those of a group option that composes
    every config under its own key (model=all, features=each)."""
    names = [str(n) for n in names]
    if not names:
        raise error(f"{list_key} is empty: name at least one {noun}")
    known = [k for k in group if k != "name"]
    bad = [n for n in names if n not in known]
    if bad:
        raise error(f"{option}={bad[0]!r} is not a {noun}; valid: {', '.join(known)} "
                    f"({list_key} names configs of {option}={group.name})")
    return [group[n] for n in names]


def model_configs(cfg) -> list[dict]:
    """The model configs this run trains (validated before any work starts)."""
    nodes = _selected(cfg.model, cfg.train.models, "train.models", "model", "model", registry.UnknownModelError) \
        if str(cfg.model.name) == registry.ALL else [cfg.model]
    out = [OmegaConf.to_container(n, resolve=True) for n in nodes]
    for m in out:
        registry.check(m)
    return out


def feature_configs(cfg) -> list[dict]:
    """The feature-set configs this run trains on (validated before any work starts)."""
    nodes = _selected(cfg.features, cfg.train.features, "train.features", "features", "feature set", FeatureSetError) \
        if str(cfg.features.name) == EACH else [cfg.features]
    out = [OmegaConf.to_container(n, resolve=True) for n in nodes]
    bad = [f["name"] for f in out if f["name"] not in FEATURE_SETS]
    if bad:
        raise FeatureSetError(f"features={bad[0]!r} is not a feature set; valid: {', '.join(FEATURE_SETS)}, each")
    return out


def predict_rate(model, table, n: int) -> float:
    """Records scored per second for a batch of `n` candidates (test records, repeated to n)."""
    if len(table) == 0:
        return float("nan")
    batch = table.take(np.resize(np.arange(len(table)), n))
    model.predict(table.take(np.arange(min(len(table), 8))))  # warm-up (lazy imports, allocations)
    t0 = time.perf_counter()
    model.predict(batch)
    return n / max(time.perf_counter() - t0, 1e-9)


def train_one(cfg, ws, store: tracking.Store, mcfg: dict, table, split, fcfg: dict | None = None) -> dict:
    """Fit, evaluate and log one model on one feature set; returns its summary row."""
    seed = int(cfg.seed)
    # a model config's own `threads` (the MLP's torch threads) wins over train.threads
    threads = int(mcfg.get("threads") or 0) or int(cfg.train.threads) or int(cfg.jobs) or os.cpu_count() or 1
    model = registry.create(mcfg, table.spec, seed=seed, threads=threads)
    if hasattr(model, "bind"):
        model.bind(ws)
    parts = {k: table.take(getattr(split, k)) for k in ("train", "val", "test")}
    t0 = time.perf_counter()
    model.fit(parts["train"], parts["val"])
    train_s = time.perf_counter() - t0
    evals, preds = {}, {}
    for k in ("val", "test"):
        if len(parts[k]):
            scores = model.predict(parts[k])
            evals[k] = evaluate(parts[k].frame, scores, calibrated=model.calibrated, seed=seed,
                                members=split.scored_members(table.members, k),
                                topk_min_records=int(cfg.train.topk_min_records))
            preds[k] = (parts[k].frame, scores)
    timing = {"train_seconds": train_s, "predict_per_s": predict_rate(model, parts["test"], int(cfg.train.predict_batch)),
              "n_train": len(parts["train"]), "n_val": len(parts["val"]), "n_test": len(parts["test"])}
    run_id = tracking.log_run(store, model=model, table=table, split=split, evals=evals, timing=timing,
                              predictions=preds, model_cfg=mcfg, features_cfg=fcfg or {})
    v, t = evals.get("val", evals["test"]).summary, evals["test"].summary
    return {"model": model.name, "features": table.spec.feature_set if model.name not in STATIC_ONLY else "static",
            "train_s": round(train_s, 2), "val_top1": v["top1_score"], "top1": t["top1_score"], "peak5": t["peak5"],
            "pair_acc": t["pair_acc"], "spearman": t["spearman"], "topk_tasks": int(t["n_tasks_topk"]),
            "run_id": run_id}


def _common_records(part_of: dict, tables: dict) -> dict:
    """`part_of` cut to the records every feature set has (a record without profiler counters,
    say, leaves every set), so that the sets are compared on the same records."""
    common = set.intersection(*(set(t.frame["record_id"]) for t in tables.values()))
    left = len(part_of) - len(common & set(part_of))
    if left:
        log.info("train.same_records: %d measured records lack a feature set of %s and are left out of every set",
                 left, ", ".join(tables))
    return {r: k for r, k in part_of.items() if r in common}


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    store = tracking_store(cfg)  # a test-part metric for `best` is refused before any work
    tracking.setup(store)  # and an unreadable MLflow store before the first model is trained
    models = model_configs(cfg)
    feature_sets = feature_configs(cfg)
    # A compare reads the runs only while no train adds some: it would mix an unfinished training
    # with earlier ones. Trains may overlap (a sweep); each waits for a compare that is reading.
    with locks.runs_lock(ws.root, "train", wait_s=max(float(cfg.lock.wait_s), locks.TRAIN_WAITS_S)):
        return _train(cfg, ws, store, models, feature_sets)


def _train(cfg, ws, store: tracking.Store, models: list[dict], feature_sets: list[dict]) -> dict:
    explicit = str(cfg.features.name) != EACH
    mixed = bool(cfg.train.allow_mixed_hardware)
    records = labelled_records(ws, allow_mixed_hardware=mixed)  # fails early without measurements
    members = memberships(ws)
    s = cfg.split
    split_all = make_split(records, str(s.name), seed=int(s.seed), test_fraction=float(s.test_fraction),
                           val_fraction=float(s.val_fraction),
                           test_networks=list(s.test_networks) if s.get("test_networks") else None,
                           members=members, val_unit=str(s.get("val_unit") or "tasks"))
    per_task = cfg.train.get("imported_per_task")
    split_all = training_only(split_all, (records["timer"] != HARNESS).to_numpy(), records["task_id"].to_numpy(),
                              per_task=None if per_task is None else int(per_task))
    log.info("split=%s seed=%d: %s %s", split_all.kind, split_all.seed, split_all.sizes(), split_all.info)
    part_of = {}
    for k in ("train", "val", "test"):
        part_of.update(dict.fromkeys(records["record_id"].iloc[getattr(split_all, k)], k))
    rows, skipped, tables = [], [], {}
    for fcfg in feature_sets:
        fs = fcfg["name"]
        try:
            tables[fs] = build_table(ws, fs, exclude=fcfg.get("exclude") or [], device=str(cfg.target.device),
                                     allow_mixed_hardware=mixed)
        except FeatureSetError as e:
            if explicit:
                raise
            log.error("features=%s skipped: %s", fs, e)
            skipped.append(f"{fs}: {e}")
    if cfg.train.get("same_records", True) and len(tables) > 1:
        part_of = _common_records(part_of, tables)
    for fcfg in feature_sets:
        fs = fcfg["name"]
        todo = [m for m in models if not (m["name"] in STATIC_ONLY and fs != "static")]
        for m in models:
            if m not in todo:
                log.info("model=%s reads its own static features: not trained for features=%s", m["name"], fs)
        if not todo or fs not in tables:
            continue
        table = tables.pop(fs)  # each set's table is let go once its models are trained
        split = _restrict(split_all, table, part_of)
        if len(split.test) == 0 or len(split.train) == 0:
            raise WorkspaceError(
                f"split={split.kind}: features={fs} leaves {split.sizes()} records in {ws.root}; measure more "
                f"candidates per task (budget=...) or choose another split")
        for mcfg in todo:
            log.info("train model=%s features=%s split=%s (%s)", mcfg["name"], fs, split.kind, split.sizes())
            rows.append(train_one(cfg, ws, store, mcfg, table, split, fcfg))
    if not rows:
        raise WorkspaceError(f"no model was trained for {ws.root}: " + " | ".join(skipped))
    aliases = tracking.update_aliases(store, split_all.identity)
    _print(rows, aliases, cfg, store)
    out = {"runs": len(rows), "skipped_feature_sets": len(skipped)}
    # `best` (the model tuning uses) and, beside it, the best of each feature set tuning cannot use
    for alias, what in aliases.items():
        if alias == "best" or (alias.startswith("best-") and alias[len("best-"):] not in tracking.TUNING_FEATURES):
            out[alias] = what
    out[OBJECTIVE] = objective(store, [r["run_id"] for r in rows])
    return out


def objective(store: tracking.Store, run_ids: list[str]) -> dict:
    """{"name", "value"}: `mlflow.best_metric` of the best of this run's models (higher is
    better; NaN when none has it), the figure the entry point returns to a sweeper."""
    metric = store.best_metric
    client = MlflowClient(store.uri)
    values = [client.get_run(rid).data.metrics.get(metric) for rid in run_ids]
    values = [float(v) for v in values if v is not None and np.isfinite(v)]
    return {"name": metric, "value": max(values) if values else float("nan")}


def _restrict(split, table, part_of: dict):
    """The workspace-wide split, as row positions of `table` (records with these features)."""
    parts = table.frame["record_id"].map(part_of).to_numpy()
    pos = {k: np.flatnonzero(parts == k) for k in ("train", "val", "test")}
    return Split(split.kind, split.seed, pos["train"], pos["val"], pos["test"], split.info)


def _print(rows: list[dict], aliases: dict, cfg, store: tracking.Store) -> None:
    df, empty = with_values(pd.DataFrame(rows).drop(columns=["run_id"]))
    print(f"\nstage=train, workspace {cfg.workspace}, split={cfg.split.name} (val_top1: validation part; other "
          f"figures: test part, top-k over tasks with >= {cfg.train.topk_min_records} test records; MLflow: "
          f"{store.uri}, experiment {store.experiment})")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if empty:
        print(f"  no value in any run: {', '.join(empty)} (a top-k figure counts only tasks with >= "
              f"{cfg.train.topk_min_records} records in the part scored: train.topk_min_records)")
    for alias, what in aliases.items():
        print(f"  models:/{store.registered_model}@{alias} -> {what}")
