"""Releases (pipeline/core/release.py, stage=release, dataset=release): a round trip on the
tiny workspace, refusals of damaged or mismatched releases, writing whole or not at all,
and the project's committed releases."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import ROOT
from models.tables import build_table
from pipeline.config import compose, run_stage
from pipeline.core import database as D
from pipeline.core import identity
from pipeline.core import release as R
from pipeline.core.workspace import Workspace
from pipeline.options import workspace_of

COMMITTED = ROOT / "data" / "releases"


@pytest.fixture(scope="module")
def released(collected_workspace, tmp_path_factory):
    """(workspace root, overrides, release folder) of the tiny collected workspace released."""
    root, over = collected_workspace
    releases = tmp_path_factory.mktemp("releases")
    over = [*over, f"paths.releases={releases}"]
    out = run_stage("release", over)
    return root, over, releases / out["release"]


def from_release(release: Path, data: Path, *extra: str) -> list[str]:
    return ["dataset=release", f"dataset.release={release}", f"paths.data={data}", *extra]


def test_release_holds_every_table_with_checksums_and_a_card(released, tmp_path):
    root, over, folder = released
    manifest = R.verify(folder, kind="dataset")
    assert folder.name == f"ops-llvm-{manifest['hardware'] and R.hardware_slug(manifest['hardware'])}-v1"
    assert {"tasks", "candidates", "kernels", "measurements", "static", "static_stores", "cpu_counters"} \
        <= set(manifest["tables"])
    assert not (folder / "lib").exists() and not list(folder.rglob("*.so"))
    assert manifest["counts"]["records"] == manifest["tables"]["candidates"] == 24
    for rel, entry in manifest["files"].items():
        assert R.sha256(folder / rel) == entry["sha256"]
    assert [c["stage"] for c in manifest["commands"]][:4] == ["tasks", "sample", "replay", "measure"]
    assert manifest["versions"]["apache-tvm"] and manifest["versions"]["apache-tvm-ffi"]
    assert manifest["timing"]["repeats"] == [2] and manifest["timing"]["load_avg_max"] is not None
    card = (folder / R.DATASET_CARD).read_text()
    assert "## How it was timed" in card and "24 records of 3 tasks" in card and "Apache-2.0" in card
    assert "The runs made on this task table (`history.jsonl`" in card and "summed over them (s): tasks" in card
    # The MetaSchedule database reads as one, every record with its run times.
    from tvm.s_tir import meta_schedule as ms

    assert "`database_workload.json.gz`" in card
    assert all((folder / f"{name}.gz").is_file() and not (folder / name).exists() for name in R.DATABASE_FILES)
    db = ms.database.JSONDatabase(*map(str, D.unpack_database(folder, tmp_path)))
    records = db.get_all_tuning_records()
    assert len(records) == 24 and all(r.run_secs is not None for r in records)
    # Again, without force: refused, the release untouched.
    with pytest.raises(R.ReleaseError, match="releases are not overwritten"):
        run_stage("release", over)
    R.verify(folder)


def test_workspace_from_a_release_gives_the_same_training_table_and_metrics(released, tmp_path):
    root, over, folder = released
    db = f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"
    train = ["model=lgbm", "features=static", "split=by_task", "train.topk_min_records=2", db]
    mine = from_release(folder, tmp_path / "data", *train)
    out = run_stage("train", mine)  # makes the workspace first (stage=tasks), builds and times nothing
    ws = workspace_of(compose(mine))
    assert ws.root == tmp_path / "data" / folder.name and not (ws.root / "lib").exists()
    assert R.workspace_release(ws.root)["name"] == folder.name
    a = build_table(Workspace(root), "static").frame.sort_values("record_id").reset_index(drop=True)
    b = build_table(ws, "static").frame.sort_values("record_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    theirs = run_stage("train", [*over, *train])
    assert out["objective"]["value"] == pytest.approx(theirs["objective"]["value"])
    # The workspace's records load in MetaSchedule, as the release's do.
    from tvm.s_tir import meta_schedule as ms

    assert len(ms.database.JSONDatabase(str(ws.db_workload), str(ws.db_tuning_record))
               .get_all_tuning_records()) == 24


def test_a_release_relabelled_on_another_machine_is_a_new_release(released, tmp_path):
    """labels=false: no measurements come along; replay and measure label the programs here,
    and stage=release publishes them as the next version."""
    root, over, folder = released
    mine = from_release(folder, tmp_path / "data", "dataset.labels=false", "measure.repeat=2",
                        "measure.min_repeat_ms=5", f"paths.releases={tmp_path / 'rel'}", "release.version=2")
    run_stage("tasks", mine)
    ws = workspace_of(compose(mine))
    assert ws.root.name == f"{folder.name}-relabel" and not ws.measurements.exists()
    assert ws.read("candidates")["record_id"].nunique() == 24
    run_stage("replay", mine)
    out = run_stage("measure", mine)
    assert out["measured"] == 24
    rel = run_stage("release", mine)
    manifest = R.verify(tmp_path / "rel" / rel["release"])
    assert rel["release"].startswith("ops-llvm-") and rel["release"].endswith("-v2")
    assert manifest["derived_from"]["name"] == folder.name and manifest["tables"]["measurements"] == 24
    assert manifest["derived_from"]["labels"] is False
    assert f"The programs of release `{folder.name}`" in (tmp_path / "rel" / rel["release"] / R.DATASET_CARD).read_text()


def test_a_release_of_a_workspace_that_kept_the_labels_says_what_was_timed_where(released, tmp_path):
    """A workspace made from a release with its labels, released again: the card names the
    base's labels and what was timed here, not a re-timing."""
    root, over, folder = released
    mine = from_release(folder, tmp_path / "data", f"paths.releases={tmp_path / 'rel'}", "release.version=2")
    run_stage("tasks", mine)
    rel = run_stage("release", mine)
    manifest = R.verify(tmp_path / "rel" / rel["release"])
    assert manifest["derived_from"] | {"hardware": None} == {"name": folder.name, "labels": True,
                                                             "measured_ok": 24, "hardware": None}
    card = (tmp_path / "rel" / rel["release"] / R.DATASET_CARD).read_text()
    assert f"The programs and labels of release `{folder.name}` (24 timed without error there" in card
    assert "nothing more timed here" in card and "timed again" not in card


def base_without_a_task(root: Path, over: list[str], dest: Path) -> tuple[Path, str]:
    """A release of the workspace less one task (what an earlier release held), and the task."""
    from pipeline.stages import release as stage

    ws = Workspace(root)
    left_out = sorted(ws.read("tasks")["task_id"])[-1]
    others = frozenset(ws.read("tasks")["task_id"]) - {left_out}
    info = stage.dataset_info(compose(over), ws, frozenset([left_out]))
    R.pack_dataset(ws, dest, info=info, card=R.dataset_card, record_lines=stage.record_lines(ws),
                   drop_tasks=frozenset([left_out]))
    assert set(pq.read_table(dest / R.TABLES_DIR / "tasks.parquet")["task_id"].to_pylist()) == others
    return dest, left_out


def test_timed_without_error_over_a_chain_prefers_its_total():
    """The chain's count is its top manifest's total; totals written before the count was
    added are summed over the parts, and a part without it leaves the count unknown."""
    from pipeline.stages.release import released_ok

    parts = [{"counts": {"measured_ok": 10}}, {"counts": {"measured_ok": 4}}]
    assert released_ok({"counts": {"measured_ok": 4}, "extends": {"total": {"measured_ok": 13}}, "parts": parts}) == 13
    assert released_ok({"counts": {"measured_ok": 4}, "extends": {"total": {"records": 20}}, "parts": parts}) == 14
    assert released_ok({"counts": {"measured_ok": 4}, "extends": {"total": {"records": 20}},
                        "parts": [{"counts": {}}, *parts]}) is None
    assert released_ok({"counts": {"measured_ok": 7}}) == 7


def test_sample_skips_the_tasks_a_release_holds(released, tmp_path):
    """sample.skip_released=<base>: the tasks the base holds are not drawn again, the one it
    lacks is."""
    root, over, _ = released
    base, left_out = base_without_a_task(root, over, tmp_path / "rel" / "ops-llvm-x-v3")
    shutil.copytree(root, tmp_path / "data" / root.name)
    mine = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={tmp_path / 'data'}", "force=true"]
    out = run_stage("sample", [*mine, f"sample.skip_released={base}"])
    drawn_alone = out["new"] + out["duplicates"]
    assert out["released_tasks"] == 2 and drawn_alone > 0
    everything = run_stage("sample", mine)
    assert "released_tasks" not in everything and everything["new"] + everything["duplicates"] > 2 * drawn_alone
    with pytest.raises(R.ReleaseError, match="nowhere"):
        run_stage("sample", [*mine, f"sample.skip_released={tmp_path / 'nowhere'}"])


def test_a_release_grows_by_a_release_that_extends_it(released, tmp_path):
    """release.extends: the new release holds only the tasks the base does not, goes on under
    the base's name with the next version, and dataset=release unpacks both into the
    workspace the whole would have made, one MetaSchedule database included."""
    from tvm.s_tir import meta_schedule as ms

    root, over, _ = released
    rel = tmp_path / "rel"
    base, new_task = base_without_a_task(root, over, rel / "ops-llvm-x-v3")
    out = run_stage("release", [*over, f"paths.releases={rel}", f"release.extends={base.name}"])
    grown = rel / out["release"]
    manifest = R.verify(grown)
    assert grown.name.startswith("ops-llvm-") and grown.name.endswith("-v4")
    assert manifest["extends"]["name"] == base.name and manifest["extends"]["total"]["tasks"] == 3
    assert pq.read_table(grown / R.TABLES_DIR / "tasks.parquet")["task_id"].to_pylist() == [new_task]
    assert set(pq.read_table(grown / R.TABLES_DIR / "candidates.parquet")["task_id"].to_pylist()) == {new_task}
    timed = R.verify(base)["counts"]["measured_ok"] + manifest["counts"]["measured_ok"]
    assert manifest["extends"]["total"]["measured_ok"] == timed
    assert f"3 tasks ({timed:,} timed without error); networks" in (grown / R.DATASET_CARD).read_text()
    assert "Extends release `ops-llvm-x-v3`" in (grown / R.DATASET_CARD).read_text()
    alone = ms.database.JSONDatabase(*map(str, D.unpack_database(grown, tmp_path / "grown-db")))
    own = pq.read_table(grown / R.TABLES_DIR / "candidates.parquet").num_rows
    assert len(list(D.nonblank_lines(grown / f"{R.DATABASE_FILES[0]}.gz"))) == 1
    assert len(alone.get_all_tuning_records()) == own > 0

    mine = from_release(grown, tmp_path / "data")
    run_stage("tasks", mine)
    ws = workspace_of(compose(mine))
    assert [p["name"] for p in R.workspace_release(ws.root)["parts"]] == [base.name, grown.name]
    a = build_table(Workspace(root), "static").frame.sort_values("record_id").reset_index(drop=True)
    b = build_table(ws, "static").frame.sort_values("record_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    # One database: every task's workload index names its own workload, every record is there.
    workloads = D.read_workload_lines(ws)
    for task in ws.read("tasks").itertuples():
        assert identity.task_id(D.load_workload_mod(workloads[task.workload_index])) == task.task_id
    db = ms.database.JSONDatabase(str(ws.db_workload), str(ws.db_tuning_record))
    assert len(db.get_all_tuning_records()) == 24
    # Released again with its labels: timed there is the whole chain's count, not the top release's.
    out = run_stage("release", [*mine, f"paths.releases={tmp_path / 'rel2'}"])
    again = R.verify(tmp_path / "rel2" / out["release"])
    assert again["derived_from"]["name"] == grown.name and again["derived_from"]["labels"]
    timed_there = again["derived_from"]["measured_ok"]
    assert timed_there == again["counts"]["measured_ok"] == 24 > manifest["counts"]["measured_ok"]

    # The base changed after the release was made on it: refused, naming it.
    manifest_file = base / R.MANIFEST
    manifest_file.write_text(manifest_file.read_text().replace('"licence"', '"licence" ', 1))
    with pytest.raises(R.ReleaseError, match="is not the manifest it was made on"):
        run_stage("tasks", from_release(grown, tmp_path / "data2"))


def test_a_release_extends_only_one_timed_alike(released, tmp_path):
    root, over, _ = released
    rel = tmp_path / "rel"
    base, _ = base_without_a_task(root, over, rel / "ops-llvm-x-v1")
    manifest = json.loads((base / R.MANIFEST).read_text())
    manifest["timing"]["repeats"] = [5]
    (base / R.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(R.ReleaseError, match=r"made otherwise \(repeats \[2\] here, \[5\] there\)"):
        run_stage("release", [*over, f"paths.releases={rel}", f"release.extends={base.name}"])
    with pytest.raises(R.ReleaseError, match="nothing to release"):
        run_stage("release", [*over, f"paths.releases={rel}", f"release.extends={released[2]}"])
    assert sorted(p.name for p in rel.iterdir()) == [base.name]


def damaged(folder: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "damaged" / folder.name
    shutil.copytree(folder, copy)
    table = copy / R.TABLES_DIR / "measurements.parquet"
    manifest = json.loads((copy / R.MANIFEST).read_text())
    if how == "flipped byte":
        data = bytearray(table.read_bytes())
        data[len(data) // 2] ^= 0xFF
        table.write_bytes(bytes(data))
    elif how == "truncated":
        table.write_bytes(table.read_bytes()[:100])
    elif how == "missing table":
        table.unlink()
    elif how == "schema version":
        manifest["schema_version"] = "0"
    elif how == "no candidates table":
        del manifest["tables"]["candidates"]
    (copy / R.MANIFEST).write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize("how, says", [
    ("flipped byte", "measurements.parquet does not match its checksum"),
    ("truncated", "measurements.parquet does not match its checksum"),
    ("missing table", "measurements.parquet is missing from release"),
    ("schema version", "schema version 0"),
    ("no candidates table", "has no candidates table"),
])
def test_a_damaged_release_is_refused_before_anything_is_written(released, tmp_path, how, says):
    root, over, folder = released
    bad = damaged(folder, tmp_path, how)
    with pytest.raises(R.ReleaseError, match=says):
        run_stage("tasks", from_release(bad, tmp_path / "data"))
    assert not (tmp_path / "data" / bad.name / "tasks.parquet").exists()
    assert not [p for p in (tmp_path / "data").rglob("*") if p.is_file() and ".locks" not in p.parts]


def plain_database_release(folder: Path, dest: Path) -> Path:
    """`folder` as releases were packed before their database was gzipped: the plain files,
    listed so in the manifest."""
    copy = dest / folder.name
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / R.MANIFEST).read_text())
    for name in R.DATABASE_FILES:
        (copy / name).write_bytes(D.read_bytes(copy / f"{name}.gz"))
        (copy / f"{name}.gz").unlink()
        del manifest["files"][f"{name}.gz"]
        manifest["files"][name] = {"bytes": (copy / name).stat().st_size, "sha256": R.sha256(copy / name)}
    (copy / R.MANIFEST).write_text(json.dumps(manifest))
    return copy


def test_compact_gzips_an_old_releases_database_and_leaves_its_manifest(released, tmp_path):
    """release.compact: the plain database files are gzipped in place, the manifest keeps its
    bytes (a release that extends this one pins its sha256), the release verifies and unpacks
    to the same database; a gzipped file that does not unpack to the listed bytes is refused."""
    root, over, folder = released
    old = plain_database_release(folder, tmp_path / "rel")
    pinned = R.sha256(old / R.MANIFEST)
    plain = {name: (old / name).read_bytes() for name in R.DATABASE_FILES}
    out = run_stage("release", [f"paths.releases={old.parent}", f"release.compact=[{old.name}]"])
    assert out["releases"] == out["compacted"] == 1 and out["files"] == 2 and 0 < out["bytes_after"] < out["bytes_before"]
    assert R.sha256(old / R.MANIFEST) == pinned
    assert all((old / f"{name}.gz").is_file() and not (old / name).exists() for name in R.DATABASE_FILES)
    assert R.verify(old, kind="dataset")["name"] == folder.name
    ws_db = D.unpack_database(old, tmp_path / "db")
    assert {p.name: p.read_bytes() for p in ws_db} == plain
    # compact again (all under the folder): nothing left to do
    again = run_stage("release", [f"paths.releases={old.parent}", "release.compact=all"])
    assert again["releases"] == 1 and again["compacted"] == again["files"] == 0
    # a workspace made from the compacted release holds every record
    run_stage("tasks", from_release(old, tmp_path / "data"))
    assert len(workspace_of(compose(from_release(old, tmp_path / "data"))).read("tasks")) == 3
    # the gzipped file changed (a record dropped): refused, naming it
    name = R.DATABASE_FILES[1]
    D.write_gzipped(old / f"{name}.gz", b"".join(plain[name].splitlines(keepends=True)[1:]))
    with pytest.raises(R.ReleaseError, match=f"{name}.gz does not match its checksum"):
        R.verify(old)
    with pytest.raises(R.ReleaseError, match="release.compact=nope: give a list"):
        run_stage("release", [f"paths.releases={old.parent}", "release.compact=nope"])


def test_a_release_of_another_target_kind_is_refused_with_exit_code_2(released, tmp_path):
    root, over, folder = released
    cmd = [sys.executable, "-m", "pipeline", "stage=train", *from_release(folder, tmp_path / "data"), "target=h100"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in (out.stdout + out.stderr).splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "holds llvm programs" in errors[0] and "target=llvm" in errors[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "data" / folder.name / "tasks.parquet").exists()


def test_unknown_release_names_the_known_ones(released, tmp_path):
    root, over, folder = released
    with pytest.raises(R.ReleaseError, match=f"no release 'nope' in .*{folder.name}"):
        run_stage("tasks", ["dataset=release", "dataset.release=nope", f"paths.releases={folder.parent}",
                            f"paths.data={tmp_path}"])


def test_a_workspace_rebuilt_for_another_selection_releases_only_its_own_tasks(collected_workspace, tmp_path):
    """stage=tasks force=true with fewer operators keeps the earlier selection's records in
    the workspace; training tables and the release hold only the tasks of its task table."""
    from conftest import copy_workspace

    root, over = copy_workspace(*collected_workspace, tmp_path / "data")
    over = [o for o in over if not o.startswith("dataset.ops=")]
    before = set(Workspace(root).read("candidates")["task_id"])
    run_stage("tasks", [*over, "dataset.ops=[GMM,SFM]", "force=true"])
    kept = set(Workspace(root).read("tasks")["task_id"])
    assert kept < before and set(Workspace(root).read("candidates")["task_id"]) == before
    assert set(build_table(Workspace(root), "static").frame["task_id"]) == kept  # what models train on
    out = run_stage("release", [*over, "dataset.ops=[GMM,SFM]", f"paths.releases={tmp_path / 'rel'}"])
    folder = tmp_path / "rel" / out["release"]
    manifest = R.verify(folder)
    for name in ("tasks", "candidates", "kernels", "measurements"):
        assert set(pq.read_table(folder / R.TABLES_DIR / f"{name}.parquet")["task_id"].to_pylist()) == kept, name
    assert manifest["counts"]["tasks"] == len(kept)
    released = pq.read_table(folder / R.TABLES_DIR / "candidates.parquet")["record_id"].to_pylist()
    assert manifest["counts"]["records"] == len(set(released)) > 0


def test_a_release_is_written_whole_or_not_at_all(collected_workspace, tmp_path, monkeypatch):
    root, over = collected_workspace
    calls = []
    real = pq.write_table

    def failing(table, where, **kw):
        calls.append(where)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(table, where, **kw)

    monkeypatch.setattr(R.pq, "write_table", failing)
    with pytest.raises(OSError):
        run_stage("release", [*over, f"paths.releases={tmp_path}"])
    assert list(tmp_path.iterdir()) == []  # no release, no staging folder left


def test_a_trained_model_is_released_with_its_card_and_loads_by_name(collected_workspace, tmp_path):
    """stage=release release.models: the run's MLflow model, its split's held-out tasks, its
    own metrics and MetaSchedule's XGBModel on the same parts in the card; loaded by name
    (verified against its manifest), it excludes its held-out tasks from online refits, and
    its MLflow model scores as the run's does."""
    import mlflow

    from pipeline.tuning.cost_model import PipelineCostModel

    root, over = collected_workspace
    over = [*over, f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "split=by_task",
            "train.topk_min_records=2", f"paths.releases={tmp_path / 'rel'}"]
    run_stage("train", [*over, "model=all", "train.models=[lgbm,ms_xgb]", "features=static"])
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.model = 'lgbm'")
    run_id = runs["run_id"].iloc[0]
    out = run_stage("release", [*over, "release.dataset=false", f"release.models=[runs:/{run_id}/model]"])
    assert out["models"] == 1
    folder = tmp_path / "rel" / out["model_releases"]
    manifest = R.verify(folder, kind="model")
    assert manifest["model"] == "lgbm" and manifest["run_id"] == run_id and manifest["split"] == "by_task"
    assert manifest["test_tasks"] and not set(manifest["test_tasks"]) & set(manifest["trained_tasks"])
    assert manifest["metrics"]["test_top1_score"] == pytest.approx(runs["metrics.test_top1_score"].iloc[0])
    card = (folder / "MODEL.md").read_text()
    assert "| `lgbm` (1 seed) |" in card and "| `ms_xgb` (1 seed) |" in card and "| random pick" in card
    model = PipelineCostModel.from_pretrained(out["model_releases"], search=[tmp_path / "rel"])
    assert list(model.exclude_tasks) == manifest["test_tasks"]  # an online refit never learns them
    from models.pyfunc import stored_names

    table = build_table(Workspace(root), "static")
    frame = table.frame.rename(columns=stored_names(table))  # the columns as the stored tables name them
    logged = mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(frame)
    assert len(logged) == len(frame)
    released = mlflow.pyfunc.load_model(str(folder / "model")).predict(frame)
    assert released["score"].tolist() == pytest.approx(logged["score"].tolist())


def test_hardware_slug():
    assert R.hardware_slug({"cpu_model": "AMD EPYC", "cpu_count": 2}) == "epyc2"
    assert R.hardware_slug({"cpu_model": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu_count": 8}) == "xeon8"
    assert R.hardware_slug({"gpu_name": "NVIDIA H100 80GB HBM3", "cpu_count": 16}) == "h100"


# ---------------------------------------------------------------------- the committed releases


def committed(kind: str) -> list[Path]:
    return R.releases(COMMITTED, kind=kind)


@pytest.mark.parametrize("folder", committed("dataset") + committed("model"), ids=lambda p: p.name)
def test_committed_release_verifies(folder):
    manifest = R.verify(folder)
    assert manifest["name"] == folder.name


def test_committed_releases_stay_compact():
    """A clone stays quick to fetch as releases grow (20-35 MB each): no file near GitHub's
    50 MB warning, no kernel library, all of them together under 300 MB."""
    files = [f for f in COMMITTED.rglob("*") if f.is_file()] if COMMITTED.is_dir() else []
    assert [f for f in files if f.stat().st_size >= 50e6] == []
    assert [f for f in files if f.suffix in (".so", ".o", ".dll", ".dylib")] == []
    assert sum(f.stat().st_size for f in files) < 300e6


GPU_RELEASE = COMMITTED / "zoo_ops-h200-h200-v2"


@pytest.mark.skipif(not GPU_RELEASE.is_dir(), reason=f"{GPU_RELEASE} is not committed")
def test_the_gpu_release_trains_on_real_counters_without_a_gpu(tmp_path):
    """The committed H200 release: a workspace made from it here (no GPU, nothing built or
    timed), its Nsight Compute table the profiler features, models trained on static,
    profiler and both, every one on the same records."""
    over = from_release(GPU_RELEASE, tmp_path / "data", "target=h200", "model=all", "features=each",
                        "train.features=[static,profiler,all]", "train.models=[lgbm]", "split=by_task",
                        "train.topk_min_records=2", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}")
    out = run_stage("train", over)
    ws = workspace_of(compose(over))
    ncu = build_table(ws, "profiler", exclude=list(compose(over).features.profiler.exclude)).frame
    assert len(ncu) == 265 and {"profiler.sm__throughput.avg.pct_of_peak_sustained_elapsed",
                                "profiler.dram__bytes_read.sum"} <= set(ncu.columns)
    assert not [c for c in ncu.columns if "time_duration" in c]  # the label's own measure is left out
    assert len(build_table(ws, "static").frame) == 278  # every timed record
    assert out["runs"] == 3 and out["skipped_feature_sets"] == 0
    # train.same_records: the 13 timed records without counters leave every set
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.tags["features"] for r in runs) == ["all", "profiler", "static"]
    assert {r.data.params["split.sizes"] for r in runs} == {runs[0].data.params["split.sizes"]}
    assert sum(json.loads(runs[0].data.params["split.sizes"]).values()) == 265


@pytest.mark.slow
@pytest.mark.skipif(not committed("model"), reason="no committed model release")
def test_pretrained_model_loads_from_any_folder_and_tunes(tmp_path):
    """From a folder that is not the project: the model the README names, inside ms.tune_tir
    with the project's builder, every candidate it picks built and timed; it refuses CUDA
    candidates."""
    names = re.findall(r'from_pretrained\("([^"]+)"\)', (ROOT / "README.md").read_text())
    assert names, "README.md shows no PipelineCostModel.from_pretrained(...) call"
    name = names[0]
    assert (COMMITTED / name).is_dir(), f"README.md names {name!r}, which is not in {COMMITTED}"
    script = f"""
import tempfile, tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing.te_workload import create_te_workload
from pipeline.compute.builder import PersistentBuilder
from pipeline.tuning.cost_model import PipelineCostModel, TargetKindError
cm = PipelineCostModel.from_pretrained({name!r})
mod = tvm.IRModule({{"main": create_te_workload("GMM", 0)}})
with tempfile.TemporaryDirectory() as d:
    db = ms.tune_tir(mod, tvm.target.Target({{"kind": "llvm", "num-cores": 1}}), d, max_trials_global=8,
                     num_trials_per_iter=8, cost_model=cm, builder=PersistentBuilder(max_workers=1))
    run_secs = [float(s) for r in db.get_all_tuning_records() for s in r.run_secs]
    assert len(run_secs) == 8 and max(run_secs) < 1e9, run_secs  # 1e10: the build or run failed
try:
    cm.check_target(tvm.target.Target({{"kind": "cuda", "arch": "sm_90a"}}))
    raise SystemExit("a CPU model scored CUDA candidates")
except TargetKindError:
    pass
print("OK", cm.source, len(cm.exclude_tasks))
"""
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_RELEASES"}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"OK pretrained:{name}" in out.stdout
