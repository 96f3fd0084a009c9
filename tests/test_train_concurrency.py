"""stage=train and stage=compare at once on one workspace and one MLflow store, as the jobs of
a parallel sweep run them: a compare reads whole trainings only, and trainings that overlap
choose `best` one after the other."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time

import mlflow
import pytest

from models import tracking
from pipeline.config import compose, run_stage
from pipeline.core import locks
from pipeline.options import tracking_store

from conftest import ROOT, copy_workspace


def start_train(over: list[str], folder, model: str) -> subprocess.Popen:
    """`python -m pipeline stage=train model=<model>` in a process of its own, its output in
    `folder`/out.txt."""
    folder.mkdir(parents=True)
    return subprocess.Popen([sys.executable, "-m", "pipeline", "stage=train", *over, f"model={model}",
                             f"hydra.run.dir={folder}"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=open(folder / "out.txt", "w"), stderr=subprocess.STDOUT)


def wait_until(ready, procs, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert all(p.poll() is None for p in procs), f"a stage=train ended before {what}"
        assert time.time() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def overlapping(collected_workspace, tmp_path_factory):
    """Two trainings (lgbm, xgb) started at once on a copy of the collected workspace with a
    store of its own, then, while they run, a compare (refused) and one that waits for them.

    The registered model's lock is held here until both have finished their runs, and the
    validation metrics are changed meanwhile (the run that ranks lower is made the best), as
    another training's run that finished late would change what is best."""
    tmp = tmp_path_factory.mktemp("overlap")
    root, over = copy_workspace(*collected_workspace, tmp / "data", "reports")
    over = [*over, f"mlflow.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "train.topk_min_records=2",
            "features=static"]
    cfg = compose(over)
    store = tracking_store(cfg)
    name = store.registered_model
    tracking.setup(store)
    client = mlflow.MlflowClient()

    def finished():
        return mlflow.search_runs(experiment_names=[cfg.workspace], filter_string="attributes.status = 'FINISHED'")

    trains = {}
    try:
        with tracking.store_lock(store, f"registered model {name}"):
            trains = {m: start_train(over, tmp / m, m) for m in ("lgbm", "xgb")}
            wait_until(lambda: len(finished()) == 2, trains.values(), "two finished runs")
            with pytest.raises(locks.LockHeld) as refused:
                run_stage("compare", over)
            reports_after_refusal = (root / "reports").exists()
            bad, good = tracking.rank_runs(finished(), store.best_metric)["tags.model"]
            runs = finished().set_index("tags.model")
            for model, value in ((good, 1.0), (bad, 0.0)):
                client.log_metric(runs.loc[model, "run_id"], "val_top1_score", value)
            time.sleep(1)
            assert all(p.poll() is None for p in trains.values())  # both wait to choose `best`
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            compared = run_stage("compare", [*over, "lock.wait_s=300"])  # waits for both to end
        for p in trains.values():
            assert p.wait(timeout=120) == 0
    finally:
        for p in trains.values():
            p.kill()
    outs = {m: (tmp / m / "out.txt").read_text() for m in trains}
    return dict(root=root, cfg=cfg, name=name, pids={m: p.pid for m, p in trains.items()}, outs=outs, runs=runs,
                good=good, bad=bad, refused=str(refused.value), reports_after_refusal=reports_after_refusal,
                compared=compared, said=said.getvalue())


def test_a_compare_during_a_train_is_refused_or_waits_and_says_so(overlapping):
    o = overlapping
    assert o["refused"].startswith(f"stage=train on workspace {o['root'].name} is running: pid ")
    assert all(f"pid {pid} " in o["refused"] for pid in o["pids"].values())  # both trainings named
    assert "a comparison now would mix them" in o["refused"] and "lock.wait_s=<seconds>" in o["refused"]
    assert not o["reports_after_refusal"]  # refused before it read or wrote anything
    # the compare that waited read both trainings whole, and says that it waited for them
    assert o["compared"]["runs"] == 2
    said = next(line for line in o["said"].splitlines() if line.startswith("stage=compare, workspace"))
    assert "with no stage=train running on this workspace" in said
    head = (o["root"] / "reports" / "compare-within_task-static.md").read_text().splitlines()[2]
    assert "with no stage=train running on this workspace" in head
    if "after waiting" in said:  # (both trainings may end before the compare takes the lock: nothing to wait for)
        waited = re.search(r"for stage=train \((pid \d+(, pid \d+)*)\) to end", said).group(1)
        assert {int(p.split()[1]) for p in waited.split(", ")} <= set(o["pids"].values())  # (one may end first)
        assert "after waiting" in head


def test_two_trains_at_once_choose_best_one_after_the_other(overlapping):
    """Each training reads the runs under the lock, so both choose on what is there when they
    choose: the same run, registered once; the second one keeps it."""
    o = overlapping
    name, runs, good, bad, cfg = o["name"], o["runs"], o["good"], o["bad"], o["cfg"]
    store = tracking_store(cfg)
    client = mlflow.MlflowClient(store.uri)
    for alias in ("best", "best-static"):
        assert client.get_model_version_by_alias(name, alias).run_id == runs.loc[good, "run_id"]
    assert len(client.search_model_versions(f"name = '{name}'")) == 1  # not once per training
    lines = [next(line for line in out.splitlines() if f"models:/{name}@best ->" in line) for out in o["outs"].values()]
    assert all(f"-> {good}/static/within_task seed 0 (v1, val_top1_score 1.000; " in line for line in lines), lines
    assert sorted(line.rsplit("; ", 1)[1] for line in lines) == ["kept)", "new)"]

    # a tie keeps the holder; a run that ranks above it takes the alias
    mlflow.set_tracking_uri(store.uri)
    client.log_metric(runs.loc[bad, "run_id"], "val_top1_score", 1.0)
    for model in (good, bad):
        for m in tracking.TIEBREAK:
            client.log_metric(runs.loc[model, "run_id"], m, 0.5)
    kept = tracking.update_aliases(store, ("within_task", "", 0))
    assert kept["best"].endswith("kept)")
    assert client.get_model_version_by_alias(name, "best").run_id == runs.loc[good, "run_id"]
    client.log_metric(runs.loc[bad, "run_id"], "val_top1_score", 1.5)
    moved = tracking.update_aliases(store, ("within_task", "", 0))
    assert moved["best"].endswith("was v1)")
    assert client.get_model_version_by_alias(name, "best").run_id == runs.loc[bad, "run_id"]
