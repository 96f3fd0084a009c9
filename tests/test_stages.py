"""tasks -> sample -> replay -> measure on a tiny real workspace (ops suite, llvm)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time

import pytest

from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.config import ConfigError, compose, run_stage
from pipeline.core.workspace import Workspace, read_table
from pipeline.options import workspace_of


def test_tasks_table(measured_workspace):
    root, _ = measured_workspace
    tasks = read_table(root / "tasks.parquet")
    assert list(tasks["name"]) == ["GMM-0", "C1D-0", "SFM-0"]
    assert tasks["task_id"].is_unique and (tasks["flops"] > 0).all()
    assert json.loads(tasks["target"][0])["kind"] == "llvm"
    assert json.loads(tasks["args_json"][0])[0] == ["float32", [1, 128, 128]]


def test_candidates_are_distinct_records_of_the_database(measured_workspace):
    root, _ = measured_workspace
    cands = read_table(root / "candidates", S.CANDIDATES)
    ok = cands[cands["error"].isna()]
    assert ok.groupby("task_id").size().max() <= 8
    assert ok["record_id"].is_unique and ok["trace_json"].is_unique
    lines, bad = D.read_record_lines([root / "database_tuning_record.json"])
    assert not bad and len(lines) == len(ok)


def test_every_candidate_is_built_and_measured(measured_workspace):
    root, _ = measured_workspace
    kernels = read_table(root / "kernels", S.KERNELS)
    meas = read_table(root / "measurements", S.MEASUREMENTS)
    cands = read_table(root / "candidates", S.CANDIDATES).dropna(subset=["trace_json"])
    assert set(kernels["record_id"]) == set(cands["record_id"]) == set(meas["record_id"])
    built = kernels[kernels["error"].isna()]
    assert len(built) >= 0.8 * len(kernels)
    assert all((root / a).exists() for a in built["artifact"])
    ok = meas[meas["error"].isna()]
    assert (ok["mean_s"] > 0).all() and (ok["repeats"] == 2).all()
    assert (ok["median_s"] >= ok["min_s"]).all()
    checked = ok[ok["checked"]]
    assert len(checked) >= 3 and checked["correct"].all()


def test_database_loads_in_metaschedule_with_run_times(measured_workspace):
    from tvm.s_tir import meta_schedule as ms

    root, _ = measured_workspace
    db = ms.database.JSONDatabase(str(root / "database_workload.json"), str(root / "database_tuning_record.json"))
    recs = db.get_all_tuning_records()
    meas = read_table(root / "measurements", S.MEASUREMENTS)
    ok = meas[meas["error"].isna()]
    secs = sorted(float(r.run_secs[0]) for r in recs if float(r.run_secs[0]) < D.FAILED_RUN_SECS)
    assert len(secs) == len(ok)
    assert abs(sum(secs) - float(ok["run_secs"].map(lambda x: x[0]).sum())) < 1e-6
    # The best record of a task is queryable the way a MetaSchedule user does it.
    wl = db.commit_workload(db.get_all_tuning_records()[0].workload.mod)
    assert db.get_top_k(wl, 1)


def test_second_runs_do_nothing_new(measured_workspace):
    _, overrides = measured_workspace
    assert run_stage("sample", overrides)["new"] == 0
    assert run_stage("replay", overrides)["new"] == 0
    assert run_stage("measure", overrides)["measured"] == 0


def test_corrupted_database_line_is_reported_and_the_rest_kept(measured_workspace, tmp_path, caplog):
    root, _ = measured_workspace
    src = (root / "database_tuning_record.json").read_text().splitlines()
    bad = tmp_path / "database_tuning_record.json"
    bad.write_text("\n".join([src[0], '[0, [[["GetSBlock"', *src[1:]]) + "\n")
    lines, errors = D.read_record_lines([bad])
    assert len(lines) == len(src) and len(errors) == 1
    assert f"{bad}:2: corrupted tuning record" in str(errors[0])
    assert "corrupted tuning record" in caplog.text


def test_failing_build_becomes_an_error_row(measured_workspace):
    from pipeline.compute.builder import build_record

    root, overrides = measured_workspace
    ws = Workspace(root)
    wl = D.read_workload_lines(ws)[0]
    cands = read_table(root / "candidates", S.CANDIDATES)
    trace = json.loads(cands["trace_json"].dropna().iloc[0])
    trace[0][0] = ["GetSBlock", [], ["no_such_block", "main"], ["b0"]]  # names a block that does not exist
    row = build_record(dict(record_id="r", task_id="t", trace=trace, workload=wl, target={"kind": "llvm"},
                            artifact="lib/r.so"), str(root))
    assert row["error"].startswith("build: ") and row.get("artifact") is None


def test_build_past_the_timeout_becomes_an_error_row(measured_workspace, tmp_path):
    from pipeline.compute.builder import build_record
    from pipeline.compute.executor import LocalExecutor
    from pipeline.stages.replay import failed_build

    root, _ = measured_workspace
    ws = Workspace(root)
    wl = D.read_workload_lines(ws)[0]
    traces = read_table(root / "candidates", S.CANDIDATES)["trace_json"].dropna().iloc[:1]
    jobs = [dict(record_id=f"r{i}", task_id="t", trace=json.loads(t), workload=wl, target={"kind": "llvm"},
                 artifact=f"lib/r{i}.so") for i, t in enumerate(traces)]
    (tmp_path / "lib").mkdir()
    with LocalExecutor(workers=1) as executor:
        rows = [r for batch in executor.map(build_record, jobs, root=tmp_path, failed=failed_build, timeout_s=0.0)
                for r in batch]
    assert rows == [dict(record_id="r0", task_id="t", error="build: timeout: not finished within 0 s")]
    assert not (tmp_path / "lib" / "r0.so").exists()


@pytest.mark.slow
def test_both_strategies_draw_distinct_records(tmp_path):
    over = [f"paths.data={tmp_path}", "dataset.ops=[GMM]", "dataset.configs=[0]", "budget=smoke",
            "budget.candidates_per_task=6", "sample.strategies=[replay-trace,evolutionary]"]
    run_stage("tasks", over)
    out = run_stage("sample", over)
    ws = workspace_of(compose(over))
    cands = read_table(ws.candidates, S.CANDIDATES)
    assert set(cands["strategy"]) == {"replay-trace", "evolutionary"}
    assert cands["record_id"].is_unique and cands["error"].isna().all()
    lines, bad = D.read_record_lines([ws.db_tuning_record])
    assert not bad and len(lines) == len(cands) == out["new"]
    assert {r.record_id(cands["task_id"].iloc[0]) for r in lines} == set(cands["record_id"])
    assert run_stage("sample", over)["new"] == 0


def test_export_bundle_runs_on_its_own_and_imports_back(measured_workspace, tmp_path):
    """measure.mode=export, the bundle's RUN.txt run from the unpacked bundle alone, then mode=import."""
    root, overrides = measured_workspace
    data = tmp_path / "data"
    shutil.copytree(root, data / root.name, ignore=shutil.ignore_patterns("measurements", "runner", "features"))
    over = [o for o in overrides if not o.startswith("paths.data=")] + [f"paths.data={data}",
                                                                          "measure.bundle_runtime=false"]
    out = run_stage("measure", [*over, "measure.mode=export", "measure.rounds=2"])
    built = read_table(data / root.name / "kernels", S.KERNELS).dropna(subset=["artifact"])
    assert out["exported"] == len(built)
    with tarfile.open(out["bundle"]) as tar:
        tar.extractall(tmp_path / "host", filter="data")
    bundle = tmp_path / "host" / "bundle-0"
    assert sorted(p.name for p in bundle.iterdir()) == ["RUN.txt", "harness", "jobs.jsonl", "lib", "references"]
    cmd = (bundle / "RUN.txt").read_text().replace("python3", sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the project on the path
    run = subprocess.run(["sh", "-c", cmd], cwd=bundle, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    back = run_stage("measure", [*over, "measure.mode=import", f"measure.results={bundle / 'results.jsonl'}"])
    assert back["measured"] == len(built) and back["checked"] >= 3 and back["incorrect"] == 0
    meas = read_table(data / root.name / "measurements", S.MEASUREMENTS)
    assert "--rounds 2" in cmd and (meas["rounds"] == 2).all()
    assert (meas["mean_s"] == meas["round_means_s"].map(min)).all()
    assert set(meas["record_id"]) == set(read_table(data / root.name / "kernels", S.KERNELS)["record_id"])


@pytest.mark.slow
def test_a_task_that_failed_to_sample_is_tried_again(tmp_path):
    """A failed task is not done: the next run samples it without force, and its failure row goes."""
    from pipeline.stages.sample import failed_row_id

    over = [f"paths.data={tmp_path}", "dataset.ops=[GMM]", "dataset.configs=[0]", "budget=smoke",
            "budget.candidates_per_task=4"]
    run_stage("tasks", over)
    ws = workspace_of(compose(over))
    task = ws.read("tasks").iloc[0]
    # The row that sample writes for a task whose design space gave nothing (e.g. under a bad setting).
    with ws.writer("candidates") as out:
        out.add([dict(record_id=failed_row_id(task.task_id, "replay-trace"), task_id=task.task_id,
                      strategy="replay-trace", error="the design space produced no candidate")])
    out = run_stage("sample", over)
    assert out["retried_tasks"] == 1 and out["new"] == 4 and out["failed_tasks"] == 0
    cands = ws.read("candidates")
    assert len(cands) == 4 and cands["error"].isna().all()
    assert out["records"] == 4 and run_stage("sample", over)["new"] == 0


@pytest.mark.slow
def test_a_draw_past_the_timeout_is_an_error_row_tried_again(tmp_path):
    """A task and strategy still drawing at `sample.timeout_s` becomes an error row, not a hang;
    the next run draws it again."""
    over = [f"paths.data={tmp_path}", "dataset.ops=[GMM]", "dataset.configs=[0]", "budget=smoke",
            "budget.candidates_per_task=4"]
    run_stage("tasks", over)
    with pytest.raises(ConfigError, match=r"sample.timeout_s=0 is not valid: a number > 0, or null \(no limit\)"):
        run_stage("sample", [*over, "sample.timeout_s=0"])
    out = run_stage("sample", [*over, "sample.timeout_s=0.01"])
    assert out["failed_tasks"] == 1 and out["new"] == 0
    cands = workspace_of(compose(over)).read("candidates")
    assert cands["error"].tolist() == ["timeout: not finished within 0.01 s"]
    out = run_stage("sample", over)
    assert out["retried_tasks"] == 1 and out["new"] == 4 and out["failed_tasks"] == 0
    assert workspace_of(compose(over)).read("candidates")["error"].isna().all()


def test_a_space_without_decisions_is_replayed_not_evolved():
    """An elementwise function's one design space has no sampling decision: the evolutionary
    strategy replays it (its one schedule), a matrix product's spaces are evolved."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms
    from pipeline.shims.targets import make_target
    from pipeline.stages.sample import draw_candidates, strategy_for

    def spaces_of(mod):
        return ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                              task_name="t", num_threads=1).generate_design_space()

    target = make_target({"kind": "llvm", "num-cores": 2})
    a = te.placeholder((64, 64), name="A")
    elementwise = tvm.IRModule({"main": te.create_prim_func([a, te.compute((64, 64), lambda i, j: te.sigmoid(a[i, j]))])})
    k = te.reduce_axis((0, 64), name="k")
    product = tvm.IRModule({"main": te.create_prim_func(
        [a, te.compute((64, 64), lambda i, j: te.sum(a[i, k] * a[k, j], axis=k))])})
    assert strategy_for(spaces_of(elementwise), "evolutionary") == "replay-trace"
    assert strategy_for(spaces_of(product), "evolutionary") == "evolutionary"
    assert strategy_for(spaces_of(product), "replay-trace") == "replay-trace"
    evolved = draw_candidates(elementwise, target, 4, "evolutionary", seed=0, num_threads=1)
    replayed = draw_candidates(elementwise, target, 4, "replay-trace", seed=0, num_threads=1)
    assert len(evolved) == 1 and [str(s.trace) for s in evolved] == [str(s.trace) for s in replayed]


def test_a_lost_library_is_built_again_not_labelled_failed(measured_workspace, tmp_path):
    from conftest import copy_workspace

    root, over = copy_workspace(*measured_workspace, tmp_path, "measurements", "runner")
    ws = Workspace(root)
    built = ws.read("kernels").dropna(subset=["artifact"])
    lost = set(built["record_id"].iloc[:2])
    for rid in lost:
        (root / "lib" / f"{rid}.so").unlink()
    out = run_stage("measure", over)
    assert out["missing_library"] == 2 and out["measured"] + out["failed"] == len(ws.read("kernels")) - 2
    assert not lost & set(ws.read("measurements")["record_id"])
    task_of = dict(zip(ws.read("tasks")["workload_index"], ws.read("tasks")["task_id"]))
    secs = {r.record_id(task_of[r.workload_index]): r.run_secs for r in D.read_record_lines([ws.db_tuning_record])[0]}
    assert all(secs[rid] is None for rid in lost)  # not measured, and not 1e10
    out = run_stage("replay", over)
    assert out["rebuilt_lost"] == 2 and out["new"] == 2 and out["built"] == 2
    kernels = ws.read("kernels")
    assert kernels["record_id"].is_unique and all((root / "lib" / f"{rid}.so").exists() for rid in lost)
    assert run_stage("measure", over)["measured"] == 2
    meas = ws.read("measurements").set_index("record_id")
    assert meas.index.is_unique and meas.loc[sorted(lost), "error"].isna().all()


def test_measure_in_rounds_labels_each_kernel_with_its_best_round(measured_workspace, tmp_path):
    from conftest import copy_workspace

    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    ws = Workspace(root)
    out = run_stage("measure", [*over, "force=true", "measure.rounds=3", "measure.batch_size=8"])
    built = ws.read("kernels").dropna(subset=["artifact"])
    assert out["measured"] == len(built) and out["incorrect"] == 0 and out["checked"] >= 3
    meas = ws.read("measurements").drop_duplicates("record_id", keep="last").set_index("record_id")
    ok = meas.loc[built["record_id"]]
    assert (ok["rounds"] == 3).all() and (ok["round_means_s"].map(len) == 3).all()
    assert (ok["mean_s"] == ok["round_means_s"].map(min)).all()
    # The database's run times are the best round's, so MetaSchedule reads the same label.
    task_of = dict(zip(ws.read("tasks")["workload_index"], ws.read("tasks")["task_id"]))
    secs = {r.record_id(task_of[r.workload_index]): r.run_secs for r in D.read_record_lines([ws.db_tuning_record])[0]}
    assert all(secs[rid] == list(ok.loc[rid, "run_secs"]) for rid in ok.index)
    assert not list((root / "runner").glob("results*.jsonl")), "the rounds' events outlived their rows"


def test_measure_waits_for_a_quiet_host_then_times_with_a_warning(measured_workspace, tmp_path, caplog):
    from conftest import copy_workspace

    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="pipeline.runner.modes"):  # never quiet: the limit, then timed
        out = run_stage("measure", [*over, "force=true", "measure.settle_s=1", "measure.settle_load=-1"])
    assert out["measured"] == len(Workspace(root).read("kernels").dropna(subset=["artifact"]))
    assert time.monotonic() - start >= 1
    assert "before timing, at most 1 s (measure.settle_s)" in caplog.text
    assert "after 1 s: other processes share the cores" in caplog.text
    caplog.clear()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="pipeline.runner.modes"):  # nothing left to time: no wait
        assert run_stage("measure", [*over, "measure.settle_s=600", "measure.settle_load=-1"])["measured"] == 0
    assert "measure.settle_s" not in caplog.text and time.monotonic() - start < 300
