"""The counter model (models/counters.py) on the committed H200 release: trained on static
features and Nsight Compute counters, it reads static features only."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import ROOT
from features.candidates import feature_plan
from models import pyfunc, registry
from models.base import FeatureSpec
from models.counters import CounterModel
from models.tables import build_table
from pipeline.config import compose, run_stage
from pipeline.options import workspace_of

GPU_RELEASE = ROOT / "data" / "releases" / "zoo_ops-h200-h200-v2"

pytestmark = pytest.mark.skipif(not GPU_RELEASE.is_dir(), reason=f"{GPU_RELEASE} is not committed")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("counters")
    over = ["dataset=release", f"dataset.release={GPU_RELEASE}", f"paths.data={tmp / 'data'}", "target=h200",
            "model=all", "features=all", "train.models=[counters]", "split=by_task", "train.topk_min_records=2",
            f"mlflow.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]
    out = run_stage("train", over)
    mlflow.set_tracking_uri(f"sqlite:///{tmp / 'mlflow.db'}")
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    return over, out, run


def test_trained_on_counters_it_reads_static_features_only(trained):
    over, out, run = trained
    assert out["runs"] == 1
    assert run.data.tags["features"] == "static" and run.data.tags["trained_on"] == "all"
    uri = run.data.tags["pyfunc_model_uri"]
    model = pyfunc.load_cost_model(uri)
    assert isinstance(model, CounterModel) and model.spec.feature_set == "static"
    assert model.spec.columns and all(c.startswith("static.") for c in model.spec.columns)
    assert {"profiler.dram__bytes_read.sum", "profiler.sm__throughput.avg.pct_of_peak_sustained_elapsed"} \
        <= set(model.counters)
    feature_plan(model.spec)  # what the tuner computes for an unmeasured candidate: accepted
    # The counters it predicts across tasks explain some of the measured ones (R² > 0 for most).
    quality = model.info["counters"]
    assert np.mean([q["r2_across_tasks"] > 0 for q in quality.values()]) > 0.5

    # The logged MLflow model scores the stored static table alone, as the saved model does.
    ws = workspace_of(compose(over))
    static = pd.read_parquet(ws.root / "features" / "static")
    portable = mlflow.pyfunc.load_model(uri)
    assert portable.metadata.metadata["tables"] == ["features/static"]
    needs = open(mlflow.pyfunc.get_model_dependencies(uri)).read()
    assert "lightgbm==" in needs and "torch" not in needs  # the boosters' library, nothing the MLP needs
    scores = portable.predict(static)
    table = build_table(ws, "all")
    own = pd.DataFrame({"record_id": table.frame["record_id"], "own": model.predict(table)})
    both = own.merge(scores, on="record_id")
    assert len(both) == len(table) == 265
    np.testing.assert_allclose(both["score"], both["own"], rtol=1e-5, atol=1e-6)


def test_the_latency_model_reads_predicted_counters_and_learns_from_them(trained):
    over, _, run = trained
    model = pyfunc.load_cost_model(run.data.tags["pyfunc_model_uri"])
    imp = model.importance()
    assert set(imp.index) == {*model.spec.columns, *model.predicted}
    assert imp[model.predicted].sum() > 0  # the trees split on predicted counters
    # Saved and loaded: the same scores; a clone trains on the table it was made for.
    table = build_table(workspace_of(compose(over)), "all")
    again = model.copy()
    np.testing.assert_array_equal(again.predict(table), model.predict(table))
    assert model.clone().table_spec == model.table_spec
    assert not [c for c in model.counters if "time_duration" in c]  # not the label's own measure


def test_it_scores_metaschedule_candidates_that_never_ran(trained):
    """Through the tuning adapter, on CUDA candidates rebuilt from the release's traces (no
    GPU: nothing is compiled or run, the features come from the schedules)."""
    from test_adapter import _task_candidates
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel

    over, _, run = trained
    cm = PipelineCostModel.from_uri(run.data.tags["pyfunc_model_uri"], threads=1)  # models:/m-<id>, as logged
    assert cm.info["run_id"] == run.info.run_id and cm.info["test_tasks"]  # its held-out tasks known
    ctx, cands, _, _ = _task_candidates(workspace_of(compose(over)).root)
    assert str(ctx.target.kind) == "cuda" and len(cands) > 0
    scores = ms.cost_model.CostModel.predict(cm, ctx, cands)  # as MetaSchedule's search calls it
    assert len(scores) == len(cands) and np.isfinite(scores).all()


def test_a_table_without_counters_is_refused_naming_features_all():
    cfg = OmegaConf.to_container(compose(["model=counters"]).model)
    with pytest.raises(ValueError, match="trains on features=all"):
        registry.create(cfg, FeatureSpec("static", ["static.sum.float_mad"], [], "cuda"))
    mlp = OmegaConf.to_container(compose(["model=mlp"]).model)
    with pytest.raises(ValueError, match="not a GBDT on record rows"):
        registry.create({**cfg, "latency": mlp}, FeatureSpec("all", ["static.sum.float_mad", "profiler.x"], [], "cuda"))
    # An XGBoost latency model: its logged model needs both libraries.
    xgb = OmegaConf.to_container(compose(["model=xgb"]).model)
    both = registry.create({**cfg, "latency": xgb}, FeatureSpec("all", ["static.sum.float_mad", "profiler.x"], [], "cuda"))
    assert {r.split("==")[0] for r in pyfunc.requirements(both)} >= {"lightgbm", "xgboost"}
