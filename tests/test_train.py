"""stage=train and stage=compare end to end on a tiny real workspace, and their bad inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from hydra.errors import MissingConfigException

from models import registry
from models.splits import SplitError
from models.tables import FeatureSetError, build_table
from pipeline.config import compose, run_stage
from pipeline.core.workspace import Workspace, WorkspaceError

DEFAULT_ROWS = {("lgbm", "static"), ("xgb", "static"), ("mlp", "static"), ("ms_xgb", "static"),
                ("lgbm", "profiler"), ("xgb", "profiler"), ("mlp", "profiler")}


@pytest.fixture(scope="module")
def trained(collected_workspace, tmp_path_factory):
    """The default train (model=all, features=each) and compare, into a test-only MLflow store;
    one model of the list gets a per-model override."""
    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}"]
    out = run_stage("train", [*over, "model.lgbm.params.num_leaves=15"])
    report = run_stage("compare", over)
    return root, over, out, report, db


def test_default_train_and_compare(trained):
    root, over, out, report, db = trained
    assert out["runs"] == len(DEFAULT_ROWS) and out["skipped_feature_sets"] == 0
    table = pd.read_csv(root / "reports" / "compare-within_task.csv")
    assert set(zip(table["model"], table["features"])) == DEFAULT_ROWS
    assert (table["split"] == "within_task").all() and report["runs"] == len(DEFAULT_ROWS)
    for m in ("spearman", "kendall", "pair_acc", "peak1", "peak5", "recall32of128", "recall25pct",
              "top1_score", "top5_score", "rmse", "r2"):
        assert f"test_{m}" in table.columns
    # Every model has the rank metrics; RMSE exactly where scores estimate throughput.
    assert table[["test_pair_acc", "test_peak1", "test_top1_score", "test_top5_score"]].notna().all().all()
    calibrated = table["model"].isin(["lgbm", "xgb", "ms_xgb"])
    assert table.loc[calibrated, "test_rmse"].notna().all() and table.loc[~calibrated, "test_rmse"].isna().all()
    assert ((table["test_peak1"] > 0) & (table["test_peak1"] <= 1)).all()
    rows = [line.split("|")[1].strip() for line in (root / "reports" / "compare-within_task.md").read_text().splitlines()
            if line.startswith("|")]
    assert rows.count("ms_xgb") == 1 and rows.count("lgbm") == 2
    assert (root / "reports" / "compare-within_task.png").stat().st_size > 1000


def test_mlflow_runs_params_artifacts_and_aliases(trained):
    root, over, out, report, db = trained
    cfg = compose(over)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[cfg.workspace])
    assert len(runs) == len(DEFAULT_ROWS)
    lgbm = runs[(runs["tags.model"] == "lgbm") & (runs["tags.features"] == "static")].iloc[0]
    # the flattened config, the effective model config and the split's seed are params; the
    # per-model override given with model=all reached the model (and only that one)
    assert lgbm["params.model.library"] == "lightgbm" and lgbm["params.split.seed"] == "0"
    assert lgbm["params.model.name"] == "lgbm" and lgbm["params.model.params.num_leaves"] == "15"
    xgb = runs[runs["tags.model"] == "xgb"].iloc[0]
    assert xgb["params.model.library"] == "xgboost" and "params.model.lgbm.name" not in runs.columns
    assert lgbm["params.dataset.name"] == "ops" and json.loads(lgbm["params.split.sizes"])["test"] > 0
    client = mlflow.MlflowClient()
    files = {a.path for a in client.list_artifacts(lgbm["run_id"])}
    assert {"features.json", "test_per_task.json", "split.json", "training_info.json", "plots"} <= files
    per_task = client.load_table(lgbm["experiment_id"], "test_per_task.json", run_ids=[lgbm["run_id"]])
    assert len(per_task) == lgbm["metrics.test_n_tasks"] == 3 and {"task_id", "peak1"} <= set(per_task.columns)
    plots = {a.path for a in client.list_artifacts(lgbm["run_id"], "plots")}
    assert {"plots/predicted_vs_measured.png", "plots/topk_curve.png", "plots/feature_importance.png"} <= plots
    # aliases: best overall and per feature set; the pyfunc predicts from the stored feature tables
    name = f"{cfg.workspace}-cost-model"
    for alias in ("best", "best-static", "best-profiler"):
        assert client.get_model_version_by_alias(name, alias).version
    model = mlflow.pyfunc.load_model(f"models:/{name}@best-profiler")
    meta = model.metadata.metadata
    assert meta["feature_set"] == "profiler" and meta["tables"] == ["features/cpu/device=cpu"]
    scores = model.predict(pd.read_parquet(root / meta["tables"][0]))
    table = build_table(Workspace.from_cfg(cfg), "profiler", device="cpu")
    assert set(scores["record_id"]) == set(table.frame["record_id"]) and np.isfinite(scores["score"]).all()


def test_sweep_of_one_model_and_split(trained, tmp_path):
    """model=<name> features=<set> split=<kind> trains exactly one run (what a -m sweep does per job)."""
    root, over, *_ = trained
    db = tmp_path / "m.db"
    out = run_stage("train", [*over, "model=lgbm_rank", "features=all", "split=by_task", f"mlflow.tracking_uri=sqlite:///{db}"])
    assert out["runs"] == 1
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    run = mlflow.search_runs(experiment_names=[compose(over).workspace]).iloc[0]
    assert (run["tags.model"], run["tags.features"], run["tags.split"]) == ("lgbm_rank", "all", "by_task")
    info = json.loads(run["params.split.info"])
    assert info["test_tasks"] and run["tags.calibrated"] == "False"


def test_workspace_without_measurements(collected_workspace, tmp_path):
    root, over = collected_workspace
    (tmp_path / root.name).mkdir()
    shutil.copy(root / "tasks.parquet", tmp_path / root.name / "tasks.parquet")
    bad = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={tmp_path}"]
    with pytest.raises(WorkspaceError, match="measurements does not exist: run `python -m pipeline stage=measure`"):
        run_stage("train", [*bad, f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"])


def test_feature_set_without_rows(collected_workspace, tmp_path):
    root, over = collected_workspace
    shutil.copytree(root, tmp_path / root.name, ignore=shutil.ignore_patterns("lib", "reports"))
    bad = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={tmp_path}",
                                                                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/m.db"]
    # every counter excluded: no usable column
    with pytest.raises(FeatureSetError, match="features=profiler: .* no usable counter.*use features=static"):
        run_stage("train", [*bad, "model=lgbm", "features=profiler", "features.exclude=['.*']"])
    # no counter table at all
    shutil.rmtree(tmp_path / root.name / "features" / "cpu")
    with pytest.raises(FeatureSetError, match="no CPU counter table.*stage=collect.*or use features=static"):
        run_stage("train", [*bad, "model=lgbm", "features=profiler"])
    # features=each skips the missing set loudly and trains the others
    out = run_stage("train", [*bad, "train.models=[lgbm]"])
    assert out["runs"] == 1 and out["skipped_feature_sets"] == 1
    # no static features for any measured record
    shutil.rmtree(tmp_path / root.name / "features" / "static")
    with pytest.raises(FeatureSetError, match="static does not exist: run `python -m pipeline stage=collect`"):
        run_stage("train", [*bad, "model=lgbm", "features=static"])


def test_unknown_model_and_bad_split(collected_workspace):
    root, over = collected_workspace
    with pytest.raises(MissingConfigException, match="model/catboost"):
        compose([*over, "stage=train", "model=catboost"])
    with pytest.raises(registry.UnknownModelError, match="model='catboost' is not a model; valid: .*lgbm"):
        run_stage("train", [*over, "train.models=[lgbm,catboost]"])
    with pytest.raises(SplitError, match="no networks in this workspace.*use split=by_task"):
        run_stage("train", [*over, "model=lgbm", "split=by_network"])
