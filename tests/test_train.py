"""stage=train and stage=compare end to end on a tiny real workspace, and their bad inputs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from hydra.errors import MissingConfigException

from models import checks, registry, tracking
from models.splits import SplitError
from models.tables import FeatureSetError, build_table
from models.tracking import SelectionError
from pipeline.config import compose, run_stage
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, WorkspaceError, read_table, write_table
from pipeline.options import tracking_store, workspace_of

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_ROWS = {("lgbm", "static"), ("xgb", "static"), ("mlp", "static"), ("ms_xgb", "static"),
                ("lgbm", "profiler"), ("xgb", "profiler"), ("mlp", "profiler")}


@pytest.fixture(scope="module")
def trained(collected_workspace, tmp_path_factory):
    """The default train (model=all, features=each) and compare, into a test-only MLflow store;
    one model of the list gets a per-model override."""
    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    # 2 test records per task here: top-k figures over tasks with at least 2
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}", "train.topk_min_records=2"]
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
    assert runs["tags.stage"].tolist().count("compare") == 1  # stage=compare's tables
    runs = runs[runs["tags.model"].notna()]
    assert len(runs) == len(DEFAULT_ROWS)
    assert set(runs["tags.heldout"]) == {""} and set(runs["tags.split_seed"]) == {"0"}
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
    table = build_table(workspace_of(cfg), "profiler", device="cpu")
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
    # what the entry point returns to a sweeper: the run's mlflow.best_metric, read back from MLflow
    assert out["objective"]["name"] == "val_top1_score"
    assert out["objective"]["value"] == pytest.approx(run.get("metrics.val_top1_score", float("nan")), nan_ok=True)


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


def test_best_is_chosen_on_validation_never_on_test(collected_workspace, tmp_path):
    """`best` reads validation metrics only: the default is one, a test metric is refused before
    any work, and where validation and test disagree the alias follows validation."""
    root, over = collected_workspace
    assert compose(over).mlflow.best_metric.startswith("val_")  # the default selects on validation
    db = tmp_path / "m.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}", "features=static", "train.models=[lgbm,xgb]"]
    with pytest.raises(SelectionError, match="mlflow.best_metric='test_top1_score' is not a validation metric"):
        run_stage("train", [*over, "mlflow.best_metric=test_top1_score"])
    assert not db.exists()  # refused before training
    run_stage("train", over)
    cfg = compose(over)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[cfg.workspace]).set_index("tags.model")
    client = mlflow.MlflowClient()
    name = f"{cfg.workspace}-cost-model"
    identity = ("within_task", "", 0)
    for good, bad in (("lgbm", "xgb"), ("xgb", "lgbm")):
        # the better model on validation is the worse one on test
        for model, val, test in ((good, 0.9, 0.1), (bad, 0.5, 1.0)):
            client.log_metric(runs.loc[model, "run_id"], "val_top1_score", val)
            client.log_metric(runs.loc[model, "run_id"], "test_top1_score", test)
        tracking.update_aliases(tracking_store(cfg), identity)
        assert client.get_model_version_by_alias(name, "best").run_id == runs.loc[good, "run_id"]


def test_best_is_a_model_that_can_serve_tuning(collected_workspace, tmp_path):
    """`best` goes to the best model on static features even where a profiler model validates
    higher (tuning cannot compute profiler counters for unmeasured candidates); that one is
    `best-profiler`, reported beside it. A split with no static model leaves `best` unset."""
    root, over = collected_workspace
    db = tmp_path / "m.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}", "train.models=[lgbm]"]
    out = run_stage("train", over)  # features=each: lgbm on static and on profiler
    cfg = compose(over)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[cfg.workspace]).set_index("tags.features")
    client = mlflow.MlflowClient()
    name = f"{cfg.workspace}-cost-model"
    client.log_metric(runs.loc["profiler", "run_id"], "val_top1_score", 0.9)
    client.log_metric(runs.loc["static", "run_id"], "val_top1_score", 0.5)
    aliases = tracking.update_aliases(tracking_store(cfg), ("within_task", "", 0))
    assert client.get_model_version_by_alias(name, "best").run_id == runs.loc["static", "run_id"]
    assert client.get_model_version_by_alias(name, "best-profiler").run_id == runs.loc["profiler", "run_id"]
    assert aliases["best"].startswith("lgbm/static/") and aliases["best-profiler"].startswith("lgbm/profiler/")
    assert out["best"].startswith("lgbm/static/") and out["best-profiler"].startswith("lgbm/profiler/")
    assert "best-static" not in out  # the same model as `best`
    run_stage("train", [*over, "features=profiler", "split=by_task"])
    with pytest.raises(mlflow.exceptions.MlflowException):
        client.get_model_version_by_alias(name, "best")


def test_tables_show_the_columns_that_have_values(collected_workspace, tmp_path, capsys):
    """With 2 test records per task and top-k figures over tasks with >= 32, no top-k figure
    exists: the console tables and compare-*.md leave those columns out and say so in one line;
    the CSV keeps every column."""
    from pipeline.summary import with_values

    frame = pd.DataFrame({"a": [1.0, np.nan], "b": [np.nan, np.nan], "c": ["", " "], "d": [None, "x"]})
    shown, empty = with_values(frame)
    assert list(shown.columns) == ["a", "d"] and empty == ["b", "c"]
    root, over = collected_workspace
    over = [*over, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}", "features=static", "train.models=[lgbm]",
            "train.topk_min_records=32"]
    run_stage("train", over)
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.lstrip().startswith("model"))
    assert "pair_acc" in header and "top1" not in header and "peak5" not in header, printed
    assert "no value in any run: val_top1, top1, peak5" in printed, printed
    assert "(a top-k figure counts only tasks with >= 32 records in the part scored" in printed
    out = run_stage("compare", over)
    printed = capsys.readouterr().out
    assert "no value in any run: top-1, top-5" in printed, printed
    md = Path(out["report"]).read_text()
    assert "test_top1_score" not in md.split("No value in any run")[0] and "test_pair_acc" in md
    assert "No value in any run (not shown): " in md and "test_top1_score" in md.split("No value in any run")[1]
    assert "test_top1_score" in pd.read_csv(Path(out["report"]).with_suffix(".csv")).columns


@pytest.fixture(scope="module")
def networks_workspace(collected_workspace, tmp_path_factory):
    """A copy of the collected workspace whose tasks belong to networks, as stage=tasks records a
    zoo dataset in network_tasks.parquet: netA calls the first task, netB the second, netC the
    second and the third (a task shared by two networks)."""
    root, over = collected_workspace
    data = tmp_path_factory.mktemp("networks")
    shutil.copytree(root, data / root.name, ignore=shutil.ignore_patterns("reports"))
    tasks = read_table(data / root.name / "tasks.parquet", S.TASKS).sort_values("name").reset_index(drop=True)
    calls = {"netA": [0], "netB": [1], "netC": [1, 2]}
    rows = [dict(network=n, task_id=tasks.task_id[i], name=tasks.name[i], weight=1 + i)
            for n, ix in calls.items() for i in ix]
    write_table(pd.DataFrame(rows), S.NETWORK_TASKS, data / root.name / "network_tasks.parquet")
    over = [o for o in over if not o.startswith("paths.data=")] + [
        f"paths.data={data}", f"mlflow.tracking_uri=sqlite:///{data / 'mlflow.db'}", "train.topk_min_records=4"]
    return data / root.name, over, tasks


def test_leave_one_network_out_sweep_and_compare(networks_workspace, tmp_path):
    """The leave-one-network-out commands (README, docs/models.md) at test size: a Hydra multirun over held-out
    networks and seeds, then stage=compare's tables with spreads and its MLflow run."""
    root, over, tasks = networks_workspace
    sweep = [sys.executable, "-m", "pipeline", "-m", "stage=train", *over, "split=by_network",
             "split.test_networks=[netA],[netB]", "seed=0,1", "features=static", "train.models=[lgbm,lgbm_ps]",
             f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    done = subprocess.run(sweep, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    cfg = compose(over)
    mlflow.set_tracking_uri(cfg.mlflow.tracking_uri)
    runs = mlflow.search_runs(experiment_names=[cfg.workspace])
    runs = runs[runs["tags.model"].notna()]
    assert len(runs) == 8
    assert set(zip(runs["tags.heldout"], runs["tags.split_seed"])) == {("netA", "0"), ("netA", "1"), ("netB", "0"),
                                                                         ("netB", "1")}
    # netB's task is also called by netC: its test part is scored for netB alone
    client = mlflow.MlflowClient()
    netb = runs[(runs["tags.heldout"] == "netB") & (runs["tags.model"] == "lgbm")].iloc[0]
    groups = client.load_table(netb["experiment_id"], "test_per_group.json", run_ids=[netb["run_id"]])
    assert groups["group"].tolist() == ["netB"] and groups["n_tasks_topk"].tolist() == [1]
    # the alias is chosen among the runs of the last split trained (netB, seed 1)
    best = client.get_model_version_by_alias(f"{cfg.workspace}-cost-model", "best")
    assert (best.tags["heldout"], best.tags["split_seed"]) == ("netB", "1")

    # the comparison of what the sweep trained: split, features and models as in its command
    out = run_stage("compare", [*over, "split=by_network", "features=static", "train.models=[lgbm,lgbm_ps]"])
    assert out["heldout_rows"] == 9 and out["ablation_rows"] == 2 and out["runs"] == 8  # + a random row per net
    assert Path(out["report"]).name == "compare-by_network-static.md"
    table = pd.read_csv(root / "reports" / "heldout-by_network-static.csv", keep_default_na=False, na_values=[""])
    assert set(zip(table["heldout"], table["model"])) == {(h, m) for h in ("netA", "netB", "mean")
                                                          for m in ("lgbm", "lgbm_ps", "random")}
    chance = table[table["model"] == "random"].set_index("heldout")
    assert (chance["test_pair_acc"] == 0.5).all() and (chance["test_top1_score"] < 1).all()
    assert (chance["test_topk_pair_acc"] == 0.5).all()
    table = table[table["model"] != "random"]
    assert (table["n_seeds"] == 2).all()
    for model in ("lgbm", "lgbm_ps"):
        mine = runs[runs["tags.model"] == model]
        rows = table[table["model"] == model].set_index("heldout")
        for net in ("netA", "netB"):
            vals = mine.loc[mine["tags.heldout"] == net, "metrics.test_pair_acc"]
            assert rows.loc[net, "test_pair_acc"] == pytest.approx(vals.mean())
            assert (rows.loc[net, "test_pair_acc_min"], rows.loc[net, "test_pair_acc_max"]) == pytest.approx(
                (vals.min(), vals.max()))
            assert rows.loc[net, "test_n_tasks_topk"] == 1
            # pairwise accuracy over the top-k tasks alone (one here), beside the every-task figure
            topk = mine.loc[mine["tags.heldout"] == net, "metrics.test_topk_pair_acc"]
            assert rows.loc[net, "test_topk_pair_acc"] == pytest.approx(topk.mean())
        per_net = rows.loc[["netA", "netB"], "test_top1_score"]
        assert rows.loc["mean", "test_top1_score"] == pytest.approx(per_net.mean())
        assert rows.loc["mean", "test_top1_score_min"] == pytest.approx(per_net.min())
    report = Path(out["evaluation"]).read_text()
    assert Path(out["evaluation"]) == root / "reports" / "evaluation-by_network-static.md"
    assert "## Leave one network out" in report and "## Ablation (ordered by val_top1_score" in report
    assert report.count("| lgbm_ps ") >= 4 and "| top-k pair acc " in report
    # each run validated on one whole training network, and the report names them per held-out network
    validated: dict[str, set] = {}
    for held, info in zip(runs["tags.heldout"], runs["params.split.info"]):
        validated.setdefault(held, set()).update(json.loads(info)["val_networks"])
    assert validated["netA"] and "netA" not in validated["netA"] and "netB" not in validated["netB"]
    line = next(l for l in report.splitlines() if l.startswith("Validation: one whole training network per run"))
    for held, nets in validated.items():
        assert f"{held} {len(nets)} ({', '.join(sorted(nets))})" in line
    assert (root / "reports" / "heldout-by_network-static.png").stat().st_size > 1000
    # task by task (one top-k task per network here): its share is the whole network's time
    # and its top-1 score, over seeds, is the network's weighted one; no ms_xgb, no margin
    tasks_csv = pd.read_csv(root / "reports" / "per_task-by_network-static.csv")
    assert len(tasks_csv) == 4 and (tasks_csv["share"] == 1.0).all() and tasks_csv["minus_ms_xgb"].isna().all()
    assert (tasks_csv["picked_share"] == 1.0).all()  # one scored task per network: all of the picks' time
    assert set(tasks_csv["name"]) <= set(tasks["name"]) and (tasks_csv["n_seeds"] == 2).all()
    nets = table[table["model"] != "random"].set_index(["heldout", "model"])["test_top1_score"]
    for held, model, score in zip(tasks_csv["heldout"], tasks_csv["model"], tasks_csv["score"]):
        assert score == pytest.approx(nets[(held, model)])
    logged = mlflow.search_runs(experiment_names=[cfg.workspace], filter_string="tags.stage = 'compare'")
    assert len(logged) == 1 and logged["tags.report"].iloc[0] == "compare-by_network-static"
    back = client.load_table(logged["experiment_id"].iloc[0], "heldout.json", run_ids=[logged["run_id"].iloc[0]])
    assert len(back) == 9
    # each model against the reference... which this sweep did not train: no interval, no error
    assert "## Against ms_xgb" not in report
    # the choice (the ablation's first row) minus the other model, paired over the 4 runs
    choice = pd.read_csv(root / "reports" / "ablation-by_network-static.csv")["model"].iloc[0]
    margins = pd.read_csv(root / "reports" / "margins-by_network-static.csv")
    assert set(margins["model"]) == {choice} and set(margins["reference"]) == {"lgbm", "lgbm_ps"} - {choice}
    assert {"val_top1_score", "test_top1_score"} <= set(margins["metric"]) and (margins["n_runs"] == 4).all()
    assert "## Paired over runs" in report
    # a named pair adds its margins, unless it is the choice's own (the choice depends on timed labels)
    other = ({"lgbm", "lgbm_ps"} - {choice}).pop()
    twin = run_stage("compare", [*over, "split=by_network", "features=static", "train.models=[lgbm,lgbm_ps]",
                                 f"compare.pairs=[[{other},{choice}]]"])
    assert twin["margins_rows"] == 2 * len(margins)
    # ... and its interval over the held-out tasks (one top-k task per network here: the
    # difference of the two models' top-1 scores, mean over seeds, and a point interval)
    assert twin["pairs_rows"] == 3
    pair = pd.read_csv(root / "reports" / "pairs-by_network-static.csv").set_index("heldout")
    assert set(pair["model"]) == {other} and set(pair["reference"]) == {choice}
    for net in ("netA", "netB"):
        assert pair.loc[net, "diff"] == pytest.approx(nets[(net, other)] - nets[(net, choice)])
        assert pair.loc[net, "lo"] == pytest.approx(pair.loc[net, "diff"]) == pair.loc[net, "hi"]
    assert pair.loc["mean", "diff"] == pytest.approx(pair.loc[["netA", "netB"], "diff"].mean())
    assert "## The pairs of `compare.pairs`, paired over held-out tasks" in Path(twin["evaluation"]).read_text()
    assert "## The pairs of `compare.pairs`" not in report
    # the ledger of every check takes a check's rows from these reports: each network's figures
    # and the check's, with its pairwise margin over the 4 runs
    ledger = checks.rows_from_reports(root / "reports", "nets-v1", {"netA": "A", "netB": "B"}, model=other,
                                      reference=choice)
    rows = ledger[ledger["network"] != ""].set_index("network")
    for net in ("netA", "netB"):
        assert (rows.loc[net, "model"], rows.loc[net, "ms_xgb"], rows.loc[net, "random"]) == pytest.approx(
            (nets[(net, other)], nets[(net, choice)], chance.loc[net, "test_top1_score"]))
        assert (rows.loc[net, "diff"], rows.loc[net, "lo"]) == pytest.approx((pair.loc[net, "diff"], pair.loc[net, "lo"]))
    check = ledger[ledger["network"] == ""].iloc[0]
    margin = pd.read_csv(root / "reports" / "margins-by_network-static.csv").query(
        "model == @other and reference == @choice and metric == 'test_pair_acc'").iloc[0]
    assert (check["pair_won"], check["pair_runs"], check["diff"]) == (margin["won"], 4, pytest.approx(
        pair.loc["mean", "diff"]))
    assert checks.table_rows(ledger)[0].startswith("| A (v1) | ")
    copy = tmp_path / "checks.csv"
    shutil.copy(checks.LEDGER, copy)
    checks.main(["--ledger", str(copy), "add", "--release", "nets-v1", "--reports", str(root / "reports"),
                 "--label", "netA=A", "--label", "netB=B", "--model", other, "--reference", choice])
    grown = checks.read(copy)
    assert len(grown) == len(checks.read()) + 3 and grown["label"].iloc[-3:].tolist() == ["A", "B", ""]
    with pytest.raises(ValueError, match=r"a label without a network names the one held-out network; .* holds "
                                         r"\['netA', 'netB'\]: pass --label network=NAME"):
        checks.rows_from_reports(root / "reports", "nets-v1", {"": "A"}, model=other, reference=choice)
    own = run_stage("compare", [*over, "split=by_network", "features=static", "train.models=[lgbm,lgbm_ps]",
                                f"compare.pairs=[[{choice},{other}]]"])
    assert own["margins_rows"] == len(margins)
    with pytest.raises(WorkspaceError,
                       match=r"compare.pairs=\[\['lgbm_ps', 'xgb'\]\]: each pair is \[model, reference\]"):
        run_stage("compare", [*over, "split=by_network", "features=static", "train.models=[lgbm,lgbm_ps]",
                              "compare.pairs=[[lgbm_ps,xgb]]"])
    # against another workspace's runs of the same selection, paired task by task: against its own
    # runs every model's difference is nil, on every network and on average
    sel = [*over, "split=by_network", "features=static", "train.models=[lgbm,lgbm_ps]"]
    out = run_stage("compare", [*sel, f"compare.against={cfg.workspace}"])
    against = pd.read_csv(root / "reports" / "against-by_network-static.csv")
    assert out["against_rows"] == 6 and set(against["heldout"]) == {"netA", "netB", "mean"}
    assert (against[["diff", "lo", "hi"]] == 0).all().all() and (against["n_seeds"] == 2).all()
    assert f"## Against the same models trained on {cfg.workspace}" in Path(out["evaluation"]).read_text()
    with pytest.raises(WorkspaceError, match="compare.against=nope: no training run of workspace nope"):
        run_stage("compare", [*sel, "compare.against=nope"])


def test_ms_xgb_on_stored_features_predicts_as_on_replayed_schedules(collected_workspace):
    """MetaSchedule's XGBModel fed the stored PerStoreFeature rows learns exactly what it learns
    extracting them itself from the replayed schedules, and is saved to extract them itself."""
    import dataclasses

    from models.baseline import MSXGBModel, StoredFeatures

    root, over = collected_workspace
    ws = Workspace(root)
    table = build_table(ws, "static")
    tasks = sorted(set(table.frame["task_id"]))
    train = table.take(np.flatnonzero(table.frame["task_id"].isin(tasks[:2]).to_numpy()))
    test = table.take(np.flatnonzero(table.frame["task_id"].isin(tasks[2:]).to_numpy()))
    bare = {"train": dataclasses.replace(train, stores=None, offsets=None),
            "test": dataclasses.replace(test, stores=None, offsets=None)}
    stored = MSXGBModel(table.spec, seed=0, threads=1).bind(ws)
    stored.fit(train, None)
    replayed = MSXGBModel(table.spec, seed=0, threads=1).bind(ws)
    replayed.fit(bare["train"], None)
    np.testing.assert_array_equal(stored.predict(test), replayed.predict(bare["test"]))
    assert not np.allclose(stored.predict(test), stored.predict(test)[0])  # a real ranking, not a constant
    assert not isinstance(stored.ms_model._inst.extractor, StoredFeatures)
    # a record without store rows (a constant fill has none) scores 0, the sum over no stores,
    # and its task's other records score as before: XGBModel's own pack-sum fails on such a batch
    empty = test.offsets.copy()
    first = 0  # the first test record's rows removed
    cut = empty[first + 1] - empty[first]
    gone = dataclasses.replace(test, stores=test.stores[cut:], offsets=np.r_[0, empty[first + 1:] - cut])
    scores = stored.predict(gone)
    assert scores[first] == 0.0
    np.testing.assert_allclose(scores[first + 1:], stored.predict(test)[first + 1:], rtol=1e-6)
