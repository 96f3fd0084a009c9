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
    parent = runs[runs["tags.mlflow.parentRunId"].isna()]
    assert len(parent) == 1 and parent["tags.ours_uri"].iloc[0].endswith("@best")
    client = mlflow.MlflowClient()
    art = client.list_artifacts(parent["run_id"].iloc[0], "tune")
    assert {"tune.md", "tune_curves.png"} <= {a.path.split("/")[-1] for a in art}
    # one nested run per (task, cost model): names as tags, metrics and params named as in training runs
    children = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
    assert sorted(children["tags.cost_model"]) == ["ours", "random"] and children["tags.task"].nunique() == 1
    metrics = {c[len("metrics."):] for c in children.columns if c.startswith("metrics.") and children[c].notna().any()}
    assert {"best_latency_us", "gflops", "tuning_min", "trials"} <= metrics and not any("." in m for m in metrics)
    assert (children["params.budget.name"] == "smoke").all() and "params.budget" not in children.columns
    assert children["params.dataset.name"].eq("ops").all() and children["tags.workspace_id"].notna().all()
    ours = children[children["tags.cost_model"] == "ours"].iloc[0]
    curve = client.get_metric_history(ours["run_id"], "best_latency_us")
    assert [m.step for m in curve] == [8] and curve[-1].value == pytest.approx(
        summary.set_index("cost_model").loc["ours", "best_latency_us"])
    # compare after tuning: training runs only, no blank row
    compared = run_stage("compare", over)
    table = pd.read_csv(compared["report"].replace(".md", ".csv"))
    assert compared["runs"] == 1 and table["model"].notna().all() and list(table["model"]) == ["lgbm"]


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


def test_report_markdown_and_files(tmp_path):
    from models import tuning_report as R

    trials = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "trial": i + 1, "batch": 1,
                            "latency_s": v, "elapsed_s": float(i)}
                           for cm, vs in {"xgb": [2e-3, 1e-3], "ours": [None, 1.5e-3]}.items()
                           for i, v in enumerate(vs)])
    runs = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "wall_s": 30.0, "error": None}
                         for cm in ("xgb", "ours")] + [{"task": "T", "cost_model": "mlp", "seed": 0,
                                                        "wall_s": float("nan"), "error": "ValueError: boom"}])
    report = R.write(trials, runs, pd.DataFrame(), {"mlp": "ValueError: boom"}, folder=tmp_path, prefix="tune",
                     heading="ws, workspace", curves_title="curves", flops={"T": 1e6}, weights={"T": 1})
    lines = report.text.split("## Per task (mean over seeds)")[1].split("##")[0].strip().splitlines()
    head, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert len(rows) == 1 + 3 and all(set(c) <= set("-:") for c in rows[0])  # separator + 3 cost models
    by = {r[head.index("cost_model")]: dict(zip(head, r)) for r in rows[1:]}
    # best latency (us) and speedup with 3 significant digits; missing values are empty cells
    assert by["ours"]["best_latency_us"] == "1.5e+03" and by["ours"]["speedup_vs_xgb"] == "0.667"
    assert by["mlp"]["best_latency_us"] == "" and by["xgb"]["trials"] == "2"
    assert "## Dropped cost models" in report.text and "- mlp: ValueError: boom" in report.text
    assert set(report.files) == {"summary_csv", "runs_csv", "trials_csv", "curves_png", "report_md"}
    assert all(p.stat().st_size > 0 for p in report.files.values())


def test_cost_model_kinds():
    from tvm.s_tir import meta_schedule as ms

    from models import tuning_models

    assert isinstance(tuning_models.create("random", seed=1, threads=1), ms.cost_model.RandomModel)
    assert isinstance(tuning_models.create("xgb", seed=1, threads=1, xgb_warmup=4), ms.cost_model.XGBModel)
    with pytest.raises(tuning_models.TuneError, match=r"unknown \['catboost'\]; valid: ours, xgb, mlp, random"):
        tuning_models.create("catboost", seed=0, threads=1)
    with pytest.raises(tuning_models.TuneError, match="needs the loaded pipeline model"):
        tuning_models.create("ours", seed=0, threads=1)


def test_comparison_loop_keeps_failures_as_rows_and_drops_flaky_kinds(tmp_path):
    """The loop's bookkeeping, with a stand-in for what is tuned (real tuning: the tiny tune above)."""
    from pipeline.tuning import RunResult, Setup, StrategyConfig, compare

    class Item:
        name = "net"

        def tune(self, cost_model, seed, setup, work_dir):
            if cost_model == "mlp":
                raise ValueError("need at least one array\nto concatenate")
            rows = [{"task": "T", "index": 1, "batch": 1, "latency_s": 1e-3 * (seed + 1), "error": None,
                     "elapsed_s": 0.1}]
            return RunResult(rows, 2.0, {"e2e_latency_ms": 3.0, "tuning_min": 2.0 / 60, "trials": 1})

    setup = Setup(None, 1, 1, StrategyConfig(), None, None, 1, tmp_path)
    out = compare([Item()], ["xgb", "mlp"], [0, 1], lambda kind, seed: kind, setup, drop_on_failure=("mlp",))
    assert list(zip(out.runs["cost_model"], out.runs["seed"])) == [("xgb", 0), ("mlp", 0), ("xgb", 1)]
    assert out.runs["error"].isna().tolist() == [True, False, True]
    assert out.runs["error"].iloc[1] == "ValueError: to concatenate"
    assert out.dropped == {"mlp": "ValueError: to concatenate"} and len(out.trials) == 2
    assert out.end_to_end[["network", "cost_model", "seed"]].values.tolist() == [["net", "xgb", 0], ["net", "xgb", 1]]
