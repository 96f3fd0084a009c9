"""Trained models as releases: the run's MLflow model folder, a manifest and a model card.

A released model is the portable MLflow model of a training run (its native flavor and
python_function: models/pyfunc.py) with what a user needs to trust it: the release it was
trained on, its split and held-out networks and tasks (never trained on), its evaluation on
them with the spread over the seeds of the same split, MetaSchedule's XGBModel trained on
the same parts beside it, the hardware and the versions. `PipelineCostModel.from_pretrained`
loads one by name (pipeline/tuning/cost_model.py).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from models import tracking
from pipeline.core import release as R
from pipeline.core.workspace import Workspace

log = logging.getLogger(__name__)

# Test metrics of the card, in its column order (TenSet's top-k scores, pairwise accuracy).
CARD_METRICS = {"test_top1_score": "top-1", "test_top5_score": "top-5", "test_pair_acc": "pairwise acc.",
                "val_top1_score": "validation top-1"}
BASELINE = "ms_xgb"


def _fmt(values: list[float]) -> str:
    values = [v for v in values if v is not None and np.isfinite(v)]
    if not values:
        return ""
    mean = float(np.mean(values))
    if len(values) == 1 or np.isclose(min(values), max(values)):
        return f"{mean:.3f}"
    return f"{mean:.3f} [{min(values):.3f}, {max(values):.3f}]"


def evaluation(runs: pd.DataFrame, model: str, features: str, split: str, heldout: str) -> dict:
    """The card's table: this model and MetaSchedule's XGBModel on the same split and held-out
    networks, mean [min, max] over the seeds of each (the newest run per seed)."""
    if runs.empty:
        return {}
    runs = tracking.with_split_tags(runs)
    # validation figures over each run's validation networks alone, as stage=compare reads them
    # (read for the runs of this split and held-out part only: one small table per run)
    runs = tracking.validation_on_own_networks(runs[(runs["tags.split"] == split) & (runs["tags.heldout"] == heldout)])
    rows = []
    for name, feats in ((model, features), (BASELINE, "static")):
        if name == BASELINE and model == BASELINE:
            continue
        mine = runs[(runs.get("tags.model") == name) & (runs.get("tags.features") == feats)]
        mine = mine.sort_values("start_time").drop_duplicates("tags.split_seed", keep="last")
        if mine.empty:
            continue
        row = {"row": f"`{name}` ({len(mine)} seed{'s' if len(mine) > 1 else ''})"}
        for key, label in CARD_METRICS.items():
            col = f"metrics.{key}"
            row[label] = _fmt(mine[col].tolist()) if col in mine else ""
        rows.append(row)
    chance = runs.sort_values("start_time").drop_duplicates("tags.split_seed", keep="last")
    if "metrics.test_random_top1_score" in chance and chance["metrics.test_random_top1_score"].notna().any():
        rows.append({"row": "random pick (exact expectation)",
                     "top-1": _fmt(chance["metrics.test_random_top1_score"].tolist()),
                     "top-5": _fmt(chance.get("metrics.test_random_top5_score", chance["metrics.test_random_top1_score"])
                                   .tolist()), "pairwise acc.": "0.500", "validation top-1": ""})
    caption = (f"Test part of split `{split}`" + (f" (held out: {heldout})" if heldout else "") +
               ": mean [min, max] over seeds; top-k over tasks with enough test records.")
    return {"columns": list(CARD_METRICS.values()), "rows": rows, "caption": caption}


def run_metrics(runs: pd.DataFrame, run) -> dict[str, float]:
    """The run's validation and test metrics, with its validation figures over its validation
    networks alone (`tracking.validation_on_own_networks`) where `runs` holds the run."""
    logged = {k: v for k, v in run.data.metrics.items() if k.startswith(("val_", "test_"))}
    row = runs[runs["run_id"] == run.info.run_id] if "run_id" in runs else runs.iloc[:0]
    if row.empty:
        return logged
    row = tracking.validation_on_own_networks(row)
    read = {k: row.iloc[0].get(f"metrics.{k}") for k in logged}
    return {k: float(read[k]) if read[k] is not None and np.isfinite(read[k]) else v for k, v in logged.items()}


def model_release_name(training: str, model: str, features: str, heldout: str) -> str:
    held = f"without-{heldout.replace('+', '-')}" if heldout else "all"
    feats = "" if features == "static" else f"-{features}"
    return f"{training}-{model}{feats}-{held}"


def release_models(store: tracking.Store, ws: Workspace, uris: list[str], root: Path, *, name: str | None = None,
                   licence: str, force: bool = False) -> list[str]:
    """Release each MLflow model of `uris` (runs of `store`) under `root`; returns the release
    names (`name` names a single model's release; default: training release, model, features,
    held-out networks)."""
    mlflow.set_tracking_uri(store.uri)
    origin = R.workspace_release(ws.root) or {}
    # a workspace grown by kept tuning runs names them: its models are not the release's alone
    grown = R.workspace_tuning_networks(ws.root)
    training = (origin.get("name") or ws.name) + (f"-tuning-{'-'.join(grown)}" if grown else "")
    runs = tracking.workspace_runs(store)
    names = []
    for uri in uris:
        run_id = tracking.uri_run(uri)[0]
        if run_id is None:
            raise R.ReleaseError(f"release.models: {uri!r} is not an MLflow model URI: give models:/<name>@<alias>, "
                                 f"models:/<name>/<version> or runs:/<run id>/model")
        run = mlflow.get_run(run_id)
        tags = run.data.tags
        if tags.get("workspace_id") and tags["workspace_id"] != store.tags["workspace_id"]:
            raise R.ReleaseError(f"release.models: {uri} was trained on workspace {tags.get('workspace')}, not on "
                                 f"{ws.name}: release it with that workspace's settings")
        split = tracking.split_of_run(run.info.run_id)
        model, features, heldout = tags.get("model"), tags.get("features", "static"), tags.get("heldout", "")
        release = R.check_name(name if name and len(uris) == 1 else
                               model_release_name(training, model, features, heldout))
        info = {"model": model, "features": features, "target_kind": tags.get("target_kind", "cpu"),
                "training_release": origin.get("name") or ws.name, "tuning_networks": grown,
                "training_workspace_id": tags.get("workspace_id"),
                "split": split.get("kind"), "seed": split.get("seed"),
                "test_networks": split.get("test_networks") or [], "test_tasks": split.get("test_tasks") or [],
                "trained_tasks": sorted(set(ws.read("tasks", columns=["task_id"])["task_id"])
                                        - set(split.get("test_tasks") or [])),
                "run_id": run.info.run_id, "uri": uri,
                "hardware": (origin.get("hardware") or R.hardware_of(ws.read("measurements")))["hardware"],
                "metrics": run_metrics(runs, run),
                "evaluation": evaluation(runs, model, features, split.get("kind", ""), heldout),
                "versions": R.versions(), "licence": licence}
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(mlflow.artifacts.download_artifacts(f"runs:/{run.info.run_id}/model", dst_path=tmp))
            R.pack_model(folder, Path(root) / release, info=info, card=R.model_card, force=force)
        log.info("released model %s (%s, run %s)", release, uri, run.info.run_id)
        names.append(release)
    return names
