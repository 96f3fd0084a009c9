"""stage=tune: a tiny real tuning comparison, and the report's arithmetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.config import run_stage

TINY = ["tune.max_tasks=1", "tune.trials=8", "tune.per_iter=8", "tune.cost_models=[ours,random]",
        "tune.strategy.population_size=32", "tune.strategy.init_min_unmeasured=16", "tune.runner.min_repeat_ms=10",
        "tune.strategy.genetic_num_iters=2"]


@pytest.fixture(scope="module")
def trained_store(collected_workspace, tmp_path_factory):
    """A static LightGBM trained by stage=train into a test-only MLflow store (alias best)."""
    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow_tune") / "mlflow.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}"]
    run_stage("train", [*over, "model=lgbm", "features=static"])
    return root, over, db


def test_tiny_tune_ours_vs_random(trained_store):
    import mlflow

    from pipeline.core import schema as S
    from pipeline.core.workspace import read_table

    root, over, db = trained_store
    out = run_stage("tune", [*over, *TINY])
    assert out["runs"] == 2 and out["failed_runs"] == 0 and out["trials"] == 16
    trials = read_table(root / "tune_trials", S.TUNE_TRIALS)
    assert set(trials["cost_model"]) == {"ours", "random"}
    assert trials.groupby("cost_model")["trial"].max().to_dict() == {"ours": 8, "random": 8}
    assert trials["latency_s"].notna().sum() > 0
    summary = pd.read_csv(root / "reports" / "tune.csv")
    assert list(summary["cost_model"]) == ["ours", "random"]
    assert (summary["best_latency_us"] > 0).all() and (summary["tuning_min"] > 0).all()
    for name in ("tune.md", "tune_curves.png", "tune_runs.csv", "tune_trials.csv"):
        assert (root / "reports" / name).stat().st_size > 0
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[root.name], filter_string="tags.stage = 'tune'")
    assert len(runs) == 1 and runs["tags.ours_uri"].iloc[0].endswith("@best")
    art = mlflow.MlflowClient().list_artifacts(runs["run_id"].iloc[0], "tune")
    assert {"tune.md", "tune_curves.png"} <= {a.path.split("/")[-1] for a in art}


def test_tune_refuses_profiler_model_uri(trained_store):
    from pipeline.stages.tune import TuneError

    root, over, db = trained_store
    run_stage("train", [*over, "model=lgbm", "features=profiler"])
    uri = f"models:/{root.name}-cost-model@best-profiler"
    with pytest.raises(TuneError, match="Profiler counters exist only after a kernel has run"):
        run_stage("tune", [*over, *TINY, f"tune.model_uri={uri}"])


def test_report_curves_and_reach():
    from models import tuning_report as R

    lat = {"xgb": [5.0, 4.0, None, 3.0], "ours": [4.0, 2.9, 3.5, 3.1], "random": [9.0, 8.0, 7.0, 6.0]}
    rows = [{"task": "T", "cost_model": cm, "seed": 0, "trial": i + 1, "batch": i // 2 + 1, "latency_s": v,
             "elapsed_s": float(i)} for cm, vs in lat.items() for i, v in enumerate(vs)]
    trials = pd.DataFrame(rows)
    c = R.curves(trials)
    assert list(c[c["cost_model"] == "xgb"]["best_s"]) == [5.0, 4.0, 4.0, 3.0]
    runs = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "wall_s": 60.0, "error": None} for cm in lat])
    table = R.per_run(trials, runs, {"T": 3e9})
    by = table.set_index("cost_model")
    assert by.loc["xgb", "trials_to_xgb_best"] == 4 and by.loc["ours", "trials_to_xgb_best"] == 2
    assert np.isnan(by.loc["random", "trials_to_xgb_best"])
    assert by.loc["ours", "speedup_vs_xgb"] == pytest.approx(3.0 / 2.9)
    assert by.loc["xgb", "gflops"] == pytest.approx(1.0) and by.loc["xgb", "valid_trials"] == 3
    s = R.summary(table)
    assert list(s["cost_model"]) == ["xgb", "ours", "random"] and s["reached"].tolist() == [1, 1, 0]
    assert R.batch_curves(trials).groupby("cost_model")["batch"].max().to_dict() == {"ours": 2, "random": 2, "xgb": 2}
