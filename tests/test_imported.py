"""Kept tuning runs as training records (pipeline/tuning/imported.py): a committed run of the
committed transfer release joins a workspace made from that release, labelled against its own
timer, trained on and never scored; bad runs and settings are refused before anything is made."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from models.splits import make_split, training_only
from models.tables import HARNESS, build_table, labelled_records, memberships
from pipeline.config import compose, run_stage
from pipeline.core import database as D
from pipeline.core import release as R
from pipeline.core.workspace import Workspace
from pipeline.stages.tasks import kept_runs_importer
from pipeline.tuning import imported
from pipeline.tuning.comparison import RESULT_FILE

RELEASE = ROOT / "data" / "releases" / "zoo_ops-llvm-epyc2-v1"
RESULTS = ROOT / "data" / "tuning" / RELEASE.name
NETWORK = "mobilenet_v2"


@pytest.fixture(scope="module")
def one_run() -> Path:
    """A committed random-search run of MobileNet-V2 (640 measured schedules)."""
    runs = [r for r in imported.kept_runs([RESULTS], [NETWORK]) if r.name == "random-s0"]
    assert runs, f"no committed random-s0 run of {NETWORK} under {RESULTS}"
    return runs[0]


@pytest.fixture(scope="module")
def grown(one_run, tmp_path_factory) -> tuple[Workspace, dict]:
    root = tmp_path_factory.mktemp("grown") / "ws"
    counts = R.unpack(RELEASE, root, then=lambda ws: imported.import_runs(ws, [one_run]))
    return Workspace(root), counts


def test_every_schedule_of_a_kept_run_becomes_a_record_with_its_features(grown, one_run):
    ws, counts = grown
    trials = json.loads((one_run / RESULT_FILE).read_text())["trials"]
    assert counts["runs"] == 1 and counts["schedules"] == sum(t["error"] is None for t in trials) == 640
    assert counts["imported"] + counts["already_held"] == 640 and counts["imported"] > 600
    cands = ws.read("candidates")
    new = cands[cands["strategy"] == "tuning:random"]
    assert len(new) == counts["imported"] and len(cands) == counts["candidates"] + counts["imported"]
    meas = ws.read("measurements").set_index("record_id")
    assert (meas.loc[new["record_id"], "timer"] == imported.TIMER).all()
    assert meas["timer"].isna().sum() == counts["measurements"]  # the release's own labels
    static = ws.read("static")
    assert set(new["record_id"]) <= set(static.loc[static["error"].isna(), "record_id"])
    # the workspace's MetaSchedule database holds every candidate, with the run times it was measured with
    lines, bad = D.read_record_lines(D.record_files(ws))
    assert not bad and len(lines) == len(cands)
    best_kept = min(t["latency_s"] for t in trials if t["error"] is None)
    assert meas.loc[new["record_id"], "min_s"].min() <= best_kept * 1.0001


def test_labels_compare_a_record_only_with_its_task_timed_the_same_way(grown):
    ws, _ = grown
    recs = labelled_records(ws)
    best = recs.groupby(["task_id", "timer"])["label"].max()
    assert np.allclose(best.to_numpy(), 1.0)
    harness = recs[recs["timer"] == HARNESS]
    own = harness.groupby("task_id")["mean_s"].transform("min") / harness["mean_s"]
    assert np.allclose(harness["label"], own)  # the imported rows change no harness label
    table = build_table(ws, "static")
    codes = table.task_codes
    frame = table.frame.assign(code=codes)
    tuned = frame[frame["timer"] != HARNESS]
    assert tuned["task_id"].nunique() == 5
    # one ranking group per task and timer: a task's tuned records never share the harness records' group
    assert frame.groupby("code")[["task_id", "timer"]].nunique().max().max() == 1
    assert frame["code"].nunique() == frame[["task_id", "timer"]].drop_duplicates().shape[0]


def test_imported_records_are_trained_on_and_never_scored(grown):
    ws, _ = grown
    recs = labelled_records(ws)
    tuned = (recs["timer"] != HARNESS).to_numpy()
    for network in ("resnet18", NETWORK):  # seed 0 validates on the BERT encoder in both
        split = training_only(make_split(recs, "by_network", seed=0, test_networks=[network],
                                         members=memberships(ws), val_unit="network"),
                              tuned, recs["task_id"].to_numpy(), per_task=2)
        assert not tuned[split.val].any() and not tuned[split.test].any()
        assert tuned[split.train].any() == (network != NETWORK)  # a held-out network's runs are never trained on
        assert split.info["training_only"] == tuned.sum()
        _, per_task = np.unique(recs["task_id"].to_numpy()[split.train[tuned[split.train]]], return_counts=True)
        assert (per_task <= 2).all()  # the cap holds per task


def test_a_network_without_kept_runs_is_refused_with_the_fix(tmp_path):
    with pytest.raises(imported.KeptRunError, match="no kept tuning run of network 'vgg16'.*tuning_networks"):
        imported.kept_runs([RESULTS], ["vgg16"])


def test_runs_tuned_on_the_release_a_release_extends_are_found(tmp_path):
    """A workspace of zoo_ops-llvm-epyc2-v2 (which extends v1) holds v1's tasks: the runs tuned on
    v1 are its runs too; the folders are searched in turn, the release's own first."""
    cfg = compose(["dataset=release", "dataset.release=zoo_ops-llvm-epyc2-v2", f"paths.data={tmp_path}",
                   f"dataset.tuning_networks=[{NETWORK}]", f"dataset.tuning_results={RESULTS.parent}"])
    assert kept_runs_importer(cfg) is not None
    assert imported.kept_runs([tmp_path / "none", RESULTS], [NETWORK]) == imported.kept_runs([RESULTS], [NETWORK])
    with pytest.raises(imported.KeptRunError, match=f"under {tmp_path / 'none'} or {RESULTS}"):
        imported.kept_runs([tmp_path / "none", RESULTS], ["vgg16"])


def test_a_damaged_kept_run_leaves_no_workspace(one_run, tmp_path):
    run = tmp_path / "results" / RELEASE.name / "settings" / NETWORK / one_run.name
    shutil.copytree(one_run, run)
    packed = run / f"{imported.DATABASE_FILES[1]}.gz"
    packed.write_bytes(gzip.compress(gzip.decompress(packed.read_bytes())[:-200] + b"\n"))
    over = ["dataset=release", f"dataset.release={RELEASE}", f"paths.data={tmp_path / 'data'}",
            f"dataset.tuning_networks=[{NETWORK}]", f"dataset.tuning_results={tmp_path / 'results'}"]
    with pytest.raises(imported.KeptRunError, match="unreadable records"):
        run_stage("tasks", over)
    assert not (tmp_path / "data" / f"{RELEASE.name}+tuning-{NETWORK}" / "tasks.parquet").exists()


def test_the_workspace_is_named_by_the_networks_imported():
    cfg = compose(["dataset=release", f"dataset.release={RELEASE.name}", "dataset.tuning_networks=[resnet18,bert_encoder]"])
    assert cfg.workspace == f"{RELEASE.name}+tuning-bert_encoder-resnet18"
    assert compose(["dataset=release", f"dataset.release={RELEASE.name}"]).workspace == RELEASE.name


def test_imported_runs_need_the_release_labels(tmp_path):
    over = ["dataset=release", f"dataset.release={RELEASE}", f"paths.data={tmp_path}", "dataset.labels=false",
            f"dataset.tuning_networks=[{NETWORK}]"]
    with pytest.raises(R.ReleaseError, match="dataset.labels=true"):
        run_stage("tasks", over)


def test_a_run_tuned_on_another_cpu_is_refused_before_the_release_is_unpacked(tmp_path):
    """The second Xeon's committed MobileNet-V2 run (its result.json names the CPU) does not
    join the EPYC release's labels; a run of the labels' machine, or one kept before runs
    recorded their CPU, does."""
    xeon = ROOT / "data" / "tuning-xeon2-b" / RELEASE.name
    kept = [r for r in imported.kept_runs([xeon], [NETWORK]) if r.name == "xgb-s0"][0]
    run = tmp_path / "results" / RELEASE.name / "settings" / NETWORK / kept.name
    shutil.copytree(kept, run)
    over = ["dataset=release", f"dataset.release={RELEASE}", f"paths.data={tmp_path / 'data'}",
            f"dataset.tuning_networks=[{NETWORK}]", f"dataset.tuning_results={tmp_path / 'results'}"]
    with pytest.raises(imported.KeptRunError, match=f"{run}: tuned on GenuineIntel.*dataset.tuning_results"):
        run_stage("tasks", over)
    assert not list((tmp_path / "data").rglob("*.parquet"))  # refused before the release was unpacked
    hardware = R.read_manifest(RELEASE)["hardware"]
    assert "EPYC" in hardware["cpu_model"]
    row = json.loads((run / RESULT_FILE).read_text())

    def with_row(**changed) -> list[Path]:
        (run / RESULT_FILE).write_text(json.dumps({**row, "row": {**row["row"], **changed}}))
        return [run]

    imported.check_same_cpu(with_row(cpu_signature=None), hardware)  # kept before runs wrote their CPU
    imported.check_same_cpu(with_row(cpu_model=hardware["cpu_model"], cpu_signature=None), hardware)
    with pytest.raises(imported.KeptRunError, match="tuned on Intel"):
        imported.check_same_cpu(with_row(cpu_model="Intel(R) Xeon(R) Processor"), hardware)
