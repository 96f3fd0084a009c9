"""MLflow tracking: a registered model that loads anywhere, runs found by workspace identity,
input datasets, learning curves as step metrics, and stage=compare per selection."""

from __future__ import annotations

import hashlib
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

from conftest import ROOT
from models import pyfunc
from models.tables import build_table
from pipeline.config import compose, run_stage
from pipeline.core.workspace import SELECTION_KEY, Workspace, WorkspaceError
from pipeline.options import workspace_of

STATIC_MODELS = ("lgbm", "xgb", "mlp", "ms_xgb")


@pytest.fixture(scope="module")
def store(collected_workspace, tmp_path_factory):
    """Every model on static features (split within_task), then LightGBM on split by_task, which
    therefore holds alias `best` (the best run of the split just trained)."""
    src, over = collected_workspace
    data = tmp_path_factory.mktemp("tracking")
    root = data / src.name  # a copy: this module's reports stay its own
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("reports"))
    db = data / "mlflow.db"
    over = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={data}", f"mlflow.tracking_uri=sqlite:///{db}"]
    run_stage("train", [*over, "features=static"])
    run_stage("train", [*over, "model=lgbm", "features=static", "split=by_task"])
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return root, over, db


def _runs(db: Path, name: str) -> pd.DataFrame:
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    return mlflow.search_runs(experiment_names=[name])


def _reference(root: Path, over: list[str], uri: str) -> pd.Series:
    """Scores of the project's own model behind `uri` on its training table (the columns under
    their training names), by record id."""
    model = pyfunc.load_cost_model(uri)
    table = build_table(workspace_of(compose(over)), "static", device="cpu")
    frame = table.store_frame() if model.spec.input == "stores" else table.frame
    return model.predict_frame(frame).set_index("record_id")["score"]


def _clean_env() -> dict:
    """The environment without anything that points Python at this project."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")} | \
        {"PYTHONNOUSERSITE": "1"}


# Run from outside the project: refuses any import of the project's packages, loads each model
# as a pyfunc and through its native flavor, and predicts on the stored feature tables.
LOAD_SCRIPT = r'''
import importlib.abc, json, sys
class NoProject(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("models", "pipeline", "features"):
            raise ImportError(f"the model imported {name}, a module of the project")
sys.meta_path.insert(0, NoProject())
import mlflow, pandas as pd
tracking, workspace, uris = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
mlflow.set_tracking_uri(tracking)
out = {}
for uri in uris:
    model = mlflow.pyfunc.load_model(uri)
    meta = model.metadata.metadata
    # as stored: no renaming, no selection; a second table's columns joined on record_id
    table = pd.read_parquet(f"{workspace}/{meta['tables'][0]}")
    for extra in meta["tables"][1:]:
        more = pd.read_parquet(f"{workspace}/{extra}")
        table = table.merge(more[["record_id", *[c for c in more.columns if c not in table.columns]]], on="record_id")
    scores = model.predict(table)
    native = getattr(mlflow, meta["flavor"]).load_model(uri) if meta["flavor"] else None  # an ensemble has none
    row = {"records": scores["record_id"].tolist(), "scores": scores["score"].tolist(), "input": meta["input"],
           "native": type(native).__module__.split(".")[0] if native is not None else ""}
    if meta["flavor"] == "lightgbm" and meta["input"] == "records":  # the Booster on the columns, in their order
        row["native_scores"] = native.predict(table[meta["columns"]].to_numpy()).tolist()
    out[uri] = row
print("RESULT " + json.dumps(out))
'''


def _load_outside(python: str, tracking: str, workspace: Path, uris: list[str], cwd: Path) -> dict:
    script = cwd / "load_models.py"
    script.write_text(LOAD_SCRIPT)
    r = subprocess.run([python, str(script), tracking, str(workspace), json.dumps(uris)], cwd=cwd, env=_clean_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def test_every_flavor_loads_without_the_project(store, tmp_path):
    """Each library's model: the pyfunc scores the stored table exactly as the project's own
    model scores the training table, and the native flavor loads; no module of the project is
    imported on the way."""
    root, over, db = store
    runs = _runs(db, root.name)
    runs = runs[runs["tags.split"] == "within_task"].set_index("tags.model")
    assert set(runs.index) == set(STATIC_MODELS)
    uris = [runs.loc[m, "tags.pyfunc_model_uri"] for m in STATIC_MODELS]
    got = _load_outside(sys.executable, f"sqlite:///{db}", root, uris, tmp_path)
    natives = {"lgbm": "lightgbm", "xgb": "xgboost", "mlp": "torch", "ms_xgb": "xgboost"}
    for m, uri in zip(STATIC_MODELS, uris):
        row = got[uri]
        assert row["input"] == ("stores" if m in ("mlp", "ms_xgb") else "records") and row["native"] == natives[m]
        ref = _reference(root, over, uri)
        scores = pd.Series(row["scores"], index=row["records"])
        assert set(scores.index) == set(ref.index), m
        np.testing.assert_allclose(scores[ref.index].to_numpy(), ref.to_numpy(), rtol=1e-5, atol=1e-5, err_msg=m)
        if "native_scores" in row:
            np.testing.assert_allclose(row["native_scores"], row["scores"], rtol=1e-6)


def test_store_trees_and_ensemble_load_without_the_project(store, tmp_path):
    """Trees on per-store rows with a column of their record beside each store (pack-sum with
    context), with each store's roofline bound (computed by the roofline file shipped in the
    model), and ensembles of such models (no native flavor; one with MetaSchedule's XGBModel
    a member): outside the project, the pyfunc scores the stored tables as the project's own
    model scores the training table."""
    root, over, db = store
    name = f"{root.name}-store-models"  # an experiment of its own: the other tests see their runs only
    models = ("lgbm_ps", "ens_ps", "lgbm_ps_rank4_roofbase", "ens_ps_msx_fixed")  # the last with ms_xgb a member
    run_stage("train", [*over, "features=static", f"train.models=[{','.join(models)}]",
                        "model.lgbm_ps.context=[n_stores]",
                        # the task's context is computed from its TIR, in no stored table: left out here
                        "model.ens_ps_msx_fixed.members.lgbm_ps_rank4_task.task_context=false",
                        f"mlflow.experiment={name}", f"mlflow.registered_model={name}"])
    runs = _runs(db, name).set_index("tags.model")
    uris = {m: runs.loc[m, "tags.pyfunc_model_uri"] for m in models}
    got = _load_outside(sys.executable, f"sqlite:///{db}", root, list(uris.values()), tmp_path)
    for m, uri in uris.items():
        row = got[uri]
        assert row["input"] == "stores" and row["native"] == ("" if m.startswith("ens_") else "lightgbm")
        ref = _reference(root, over, uri)
        scores = pd.Series(row["scores"], index=row["records"])
        assert set(scores.index) == set(ref.index), m
        np.testing.assert_allclose(scores[ref.index].to_numpy(), ref.to_numpy(), rtol=1e-5, atol=1e-5, err_msg=m)
    assert pyfunc.load_cost_model(uris["lgbm_ps"]).spec.columns == ["static.n_stores"]


def test_model_documents_its_input(store):
    root, over, db = store
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    info = mlflow.models.get_model_info(f"models:/{root.name}-cost-model@best")
    stored = pd.read_parquet(root / "features" / "static").columns
    names = [c["name"] for c in info.signature.inputs.to_dict()]
    assert names[0] == "record_id" and not any(c.startswith("static.") for c in names)
    assert set(info.metadata["columns"]) <= set(stored) and info.metadata["tables"] == ["features/static"]
    assert {"lightgbm", "python_function"} <= set(info.flavors)
    local = mlflow.artifacts.download_artifacts(f"models:/{root.name}-cost-model@best")
    example = mlflow.models.Model.load(local).load_input_example(local)
    assert list(example.columns) == ["record_id", *info.metadata["columns"]] and len(example) == 4
    # a table without the model's columns: one short message naming them
    with pytest.raises(Exception, match=r"lacks \d+ feature column\(s\).*e\.g\.") as e:
        mlflow.pyfunc.load_model(f"models:/{root.name}-cost-model@best").predict(
            pd.read_parquet(root / "features" / "static_stores"))
    assert len(str(e.value)) < 600


def _wheels(request, requirements: Path) -> Path:
    """A folder of wheels for `requirements`, downloaded once into pytest's cache folder."""
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    folder = request.config.cache.mkdir(f"model-wheels-{key}")
    if (folder / "complete").exists():
        return folder
    pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(folder)]
    r = subprocess.run([*pip, "-r", str(requirements)], capture_output=True, text=True, timeout=900)
    if r.returncode:
        probe = subprocess.run([*pip, "--no-deps", "six"], capture_output=True, text=True, timeout=300)
        if probe.returncode:
            pytest.skip(f"no package index reachable to fetch the model's requirements: {probe.stderr[-300:]}")
        pytest.fail(f"the model's requirements are not all on the package index:\n{r.stderr[-2000:]}")
    (folder / "complete").touch()
    return folder


def test_best_model_in_a_fresh_venv(store, tmp_path, request):
    """`models:/<ws>-cost-model@best` in a virtual environment holding only the model's own
    requirements (from a wheel folder built once), from outside the project, on the
    workspace's features/static table as stored."""
    root, over, db = store
    uri = f"models:/{root.name}-cost-model@best"
    requirements = Path(mlflow.artifacts.download_artifacts(f"{uri}/requirements.txt", dst_path=str(tmp_path)))
    pins = requirements.read_text().split()
    assert {p.split("==")[0] for p in pins} == {"mlflow", "numpy", "pandas", "lightgbm"}
    assert all("==" in p and "+" not in p for p in pins), pins
    wheels = _wheels(request, requirements)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-compile", "--no-index", "--find-links", str(wheels), "-r", str(requirements)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    got = _load_outside(str(venv / "bin" / "python"), f"sqlite:///{db}", root, [uri], tmp_path)[uri]
    ref = _reference(root, over, uri)
    scores = pd.Series(got["scores"], index=got["records"])
    assert got["native"] == "lightgbm" and set(scores.index) == set(ref.index)
    np.testing.assert_allclose(scores[ref.index].to_numpy(), ref.to_numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["native_scores"], got["scores"], rtol=1e-6)


def test_runs_log_inputs_and_learning_curves(store):
    root, over, db = store
    runs = _runs(db, root.name).set_index(["tags.model", "tags.split"])
    client = mlflow.MlflowClient()
    lgbm = client.get_run(runs.loc[("lgbm", "within_task"), "run_id"])
    inputs = {i.tags[0].value: i.dataset for i in lgbm.inputs.dataset_inputs}
    assert set(inputs) == {"train", "validation", "test"}
    assert len({d.digest for d in inputs.values()}) == 3 and all(d.digest for d in inputs.values())
    assert str(root) in inputs["train"].source
    assert json.loads(inputs["test"].profile)["num_rows"] == lgbm.data.metrics["n_test"]
    # learning curves: one step per boosting round / epoch, as training_info.json has them
    for model, key, info_key in (("lgbm", "curve/val_rmse", ("val_curve", "rmse")), ("mlp", "curve/train_loss",
                                                                                      ("train_loss",))):
        rid = runs.loc[(model, "within_task"), "run_id"]
        info = json.loads(Path(mlflow.artifacts.download_artifacts(run_id=rid, artifact_path="training_info.json"))
                          .read_text())
        values = info[info_key[0]] if len(info_key) == 1 else info[info_key[0]][info_key[1]]
        history = client.get_metric_history(rid, key)
        assert [m.step for m in history] == list(range(1, len(values) + 1)) and len(values) > 1
        np.testing.assert_allclose([m.value for m in history], values)


def test_copied_workspace_keeps_its_runs(store, tmp_path):
    """Runs are found by the workspace's identity: a copy elsewhere finds them; a workspace of
    the same name with other tasks does not."""
    root, over, db = store
    copy = tmp_path / "copy"
    shutil.copytree(root, copy / root.name, ignore=shutil.ignore_patterns("lib", "reports"))
    moved = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={copy}"]
    out = run_stage("compare", moved)
    assert out["runs"] == len(STATIC_MODELS) and Path(out["report"]).parent == copy / root.name / "reports"
    ids = {workspace_of(c).identity(c.dataset.name, c.target.name)["workspace_id"]
           for c in (compose(o) for o in (over, moved))}
    assert len(ids) == 1
    # other tasks under the same workspace name: another identity, no runs
    ws = Workspace(copy / root.name)
    ws.write("tasks", ws.read("tasks").iloc[1:], metadata={SELECTION_KEY: json.dumps(ws.selection())})
    with pytest.raises(WorkspaceError, match="no MLflow training run"):
        run_stage("compare", moved)


def test_compare_sweep_over_splits(store, tmp_path):
    """`-m stage=compare split=within_task,by_task`: one report per job, each of its split."""
    root, over, db = store
    cmd = [sys.executable, "-m", "pipeline", "-m", "stage=compare", "split=within_task,by_task", *over,
           f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    reports = root / "reports"
    within = pd.read_csv(reports / "compare-within_task.csv")
    by_task = pd.read_csv(reports / "compare-by_task.csv")
    assert set(within["model"]) == set(STATIC_MODELS) and (within["split"] == "within_task").all()
    assert list(by_task["model"]) == ["lgbm"] and (by_task["split"] == "by_task").all()
    assert (reports / "compare-within_task.md").read_text() != (reports / "compare-by_task.md").read_text()
    # a selection of one model and feature set is a report of its own
    out = run_stage("compare", [*over, "model=lgbm", "features=static"])
    assert Path(out["report"]).name == "compare-within_task-lgbm-static.md" and out["runs"] == 1
    with pytest.raises(WorkspaceError, match="none of the .* training runs .* split=by_network"):
        run_stage("compare", [*over, "split=by_network"])


def test_validation_on_own_networks_reads_a_run_logged_with_partial_networks(tmp_path):
    """A run whose validation top-1 averaged its validation network with training networks
    that call a few of its tasks reads, for stage=compare, as its validation network alone."""
    from models import tracking
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = mlflow.create_experiment("old-runs", artifact_location=str(tmp_path / "mlruns"))
    groups = pd.DataFrame({"group": ["netB", "netC"], "n_tasks": [2, 1], "n_tasks_topk": [2, 1],
                           "top1_score": [0.6, 1.0], "top5_score": [0.8, 1.0],
                           "random_top1_score": [0.2, 0.4], "random_top5_score": [0.5, 0.7]})
    ids = []
    for info in ({"val_unit": "network", "val_networks": ["netB"]}, {"val_unit": "tasks", "val_tasks": ["t2"]}):
        with mlflow.start_run(experiment_id=exp) as run:
            mlflow.log_param("split.info", json.dumps(info))
            mlflow.log_metrics({"val_top1_score": 0.8, "val_top5_score": 0.9, "val_random_top1_score": 0.3,
                                "val_pair_acc": 0.7})
            mlflow.log_table(groups, "val_per_group.json")
            ids.append(run.info.run_id)
    runs = mlflow.search_runs(experiment_ids=[exp]).set_index("run_id", drop=False).loc[ids]
    read = tracking.validation_on_own_networks(runs)
    own, by_tasks = read.loc[ids[0]], read.loc[ids[1]]
    assert (own["metrics.val_top1_score"], own["metrics.val_top5_score"], own["metrics.val_random_top1_score"]) == \
        pytest.approx((0.6, 0.8, 0.2))
    assert own["metrics.val_pair_acc"] == pytest.approx(0.7)  # a mean over tasks: no network in it
    assert by_tasks["metrics.val_top1_score"] == pytest.approx(0.8)  # validated on tasks: as logged
    assert runs.loc[ids[0], "metrics.val_top1_score"] == pytest.approx(0.8)  # the runs handed in stay as they were
