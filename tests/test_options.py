"""The config turned into typed options (pipeline/options.py): known answers from
composed configs, and the defaults of the typed options equal to those of conf/."""

from __future__ import annotations

import dataclasses
import os

import pytest

from features import profilers
from features.cpu_counters import CpuCounters
from features.ncu.profile import NcuProfiler
from models.tracking import DEFAULT_BEST_METRIC, SelectionError
from pipeline.config import compose
from pipeline.core.workspace import WorkspaceError
from pipeline.runner.modes import MeasureSettings
from pipeline import options


def test_workspace_shard_executor_and_target(tmp_path):
    cfg = compose([f"paths.data={tmp_path}", "shard.index=1", "shard.count=3", "executor.workers=1"])
    assert options.workspace_of(cfg).root == tmp_path.resolve() / "ops-llvm"
    shard = options.shard_of(cfg)
    assert (shard.index, shard.count) == (1, 3)
    ex = options.executor_of(cfg)
    assert type(ex).__name__ == "LocalExecutor" and ex.runs_here and ex.workers == 1
    assert options.target_of(cfg) == {"kind": "llvm", "num-cores": os.cpu_count()}
    assert options.target_of(compose(["target=h100"]))["kind"] == "cuda"


def test_an_llvm_target_for_a_named_cpu_needs_its_own_name_and_builds_wider_vectors():
    """The generic llvm target builds 128-bit SSE code on any x86-64 machine; `mcpu` builds
    for a CPU's vector width, and only under a target name of its own; `host` is this CPU."""
    import re

    import tvm
    from tvm import s_tir, te

    with pytest.raises(ValueError, match="target.name=llvm-haswell"):
        options.target_of(compose(["target.tvm.mcpu=haswell"]))
    haswell = options.target_of(compose(["target.tvm.mcpu=haswell", "target.name=llvm-haswell"]))
    assert haswell == {"kind": "llvm", "num-cores": os.cpu_count(), "mcpu": "haswell"}
    host = options.target_of(compose(["target.tvm.mcpu=host", "target.name=llvm-host"]))["mcpu"]
    assert host and host != "host"

    a = te.placeholder((1024,), name="a")
    b = te.compute((1024,), lambda i: a[i] * a[i] + 2.0, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (loop,) = sch.get_loops(sch.get_sblock("b"))
    sch.vectorize(sch.split(loop, [None, 16])[1])

    def registers(target: dict) -> set[str]:
        lib = tvm.compile(sch.mod, target=tvm.target.Target(target))
        return set(re.findall(r"%([xyz]mm)\d+", lib.mod.inspect_source("asm")))

    assert registers(options.target_of(compose([]))) == {"xmm"}
    assert "ymm" in registers(haswell)


def test_a_workspace_of_another_selection_is_refused_unless_unchecked(tmp_path):
    over = [f"paths.data={tmp_path}", "dataset.ops=[GMM]", "dataset.configs=[0]", "budget=smoke"]
    from pipeline.config import run_stage

    run_stage("tasks", over)
    other = compose([*over[:1], "dataset.ops=[C1D]", "dataset.configs=[0]", "budget=smoke"])
    with pytest.raises(WorkspaceError, match="another dataset selection"):
        options.workspace_of(other)
    assert options.workspace_of(other, check=False).root == options.workspace_of(compose(over)).root


def test_tracking_store_names_and_the_selection_metric(tmp_path):
    cfg = compose([f"paths.data={tmp_path}", f"mlflow.tracking_uri=sqlite:///{tmp_path / 'm.db'}"])
    store = options.tracking_store(cfg)
    assert (store.uri, store.experiment, store.registered_model, store.best_metric) == (
        f"sqlite:///{tmp_path / 'm.db'}", "ops-llvm", "ops-llvm-cost-model", DEFAULT_BEST_METRIC)
    assert (store.dataset, store.target, store.device) == ("ops", "llvm", "cpu")
    assert store.config["measure"]["repeat"] == cfg.measure.repeat  # the run's params, resolved
    named = options.tracking_store(compose([f"paths.data={tmp_path}", "mlflow.experiment=e",
                                            "mlflow.registered_model=r", "mlflow.best_metric=val_pair_acc"]))
    assert (named.experiment, named.registered_model, named.best_metric) == ("e", "r", "val_pair_acc")
    with pytest.raises(SelectionError, match="test_top1_score.* is not a validation metric"):
        options.tracking_store(compose([f"paths.data={tmp_path}", "mlflow.best_metric=test_top1_score"]))
    assert not (tmp_path / "m.db").exists()  # nothing is opened until a run is logged


def test_measure_settings_and_their_defaults(monkeypatch):
    monkeypatch.delenv("PIPELINE_MEASURE_SETTLE_S")  # the suite's own (tests/conftest.py): the file's default
    default = options.measure_settings(compose([]))
    assert default == MeasureSettings(results=[], shard_index=0, shard_count=1), (
        "MeasureSettings' defaults differ from conf/measure/default.yaml")
    s = options.measure_settings(compose(["target=h100", "measure.rounds=3", "measure.results=[a.jsonl,b]",
                                          "measure.cache_flush=false", "force=true"]))
    assert (s.device, s.rounds, s.results, s.force) == ("cuda", 3, ["a.jsonl", "b"], True)
    assert s.timer_options()["cache_flush"] == 0 and s.harness_options()["rounds"] == 3
    assert options.measure_settings(compose(["measure.results=one.jsonl"])).results == ["one.jsonl"]
    monkeypatch.setenv("PIPELINE_MEASURE_SETTLE_S", "7")
    assert options.measure_settings(compose([])).settle_s == 7.0
    row = options.measure_settings(compose(["measure.check_per_task=5", "target=h100"]))
    assert (row.device_name, row.check_per_task, row.force, row.results_option) == ("h100", 5, False,
                                                                                     "measure.results")
    collect = options.measure_settings(compose(["collect.results=[p.tar.gz]", "bundle.part_mib=8",
                                                "bundle.wheel_cache=/w"]), results_of="collect")
    assert (collect.results, collect.results_option) == (["p.tar.gz"], "collect.results")
    assert (collect.bundle.part_mib, collect.bundle.wheel_cache) == (8.0, "/w")


def test_profiler_settings_pick_the_profiler_of_the_target(tmp_path):
    cfg = compose([f"paths.ncu_profiles={tmp_path}", "collect=ncu", "target=h100", "shard.index=2", "shard.count=4"])
    s = options.profiler_settings(cfg)
    assert s.ncu.metrics and s.ncu_set is None  # the curated list, resolved
    assert s.report_dir == tmp_path.resolve() / cfg.workspace / "device=h100" and s.tag == "shard2"
    ncu = profilers.create("auto", s)
    assert isinstance(ncu, NcuProfiler) and ncu.report_dir == s.report_dir and ncu.target_name == "h100"
    full = options.profiler_settings(compose(["collect=ncu_full", "target=h100"]))
    assert (full.ncu_set, full.ncu.metrics) == ("full", None)
    perf = profilers.create("auto", options.profiler_settings(compose(["collect=cpu"])))
    assert isinstance(perf, CpuCounters) and perf.batch_size == compose(["collect=cpu"]).collect.perf.batch_size
    with pytest.raises(Exception, match="collect.profiler='vtune'; valid: perf, ncu, none, auto"):
        profilers.create("vtune", s)
    with pytest.raises(ValueError, match="collect.profiler=ncu needs collect.ncu.*choose collect=ncu"):
        profilers.create("ncu", options.profiler_settings(compose(["collect=cpu"])))


def test_tuning_options_and_their_defaults():
    from pipeline.tuning.kinds import OursOptions

    ours = options.ours_options(compose([]))
    mine = {k: v for k, v in dataclasses.asdict(ours).items() if k not in ("releases", "threads")}
    want = {k: v for k, v in dataclasses.asdict(OursOptions()).items() if k not in ("releases", "threads")}
    assert mine == want, "OursOptions' defaults differ from conf/tune/default.yaml"
    pre = options.ours_options(compose(["tune.model_uri=pretrained:x", "jobs=3"]))
    assert (pre.model_uri, pre.threads) == ("pretrained:x", 3)
    choice = options.task_choice(compose(["tune.tasks=bert_encoder", "tune.max_tasks=2", "seed=7"]))
    assert (choice.tasks, choice.max_tasks, choice.seed, choice.target["kind"]) == ("bert_encoder", 2, 7, "llvm")
    suite = compose([]).tune.suite
    assert (choice.ops, choice.configs) == (list(suite.ops), list(suite.configs))
    assert options.task_choice(compose(["tune.ops=[GMM]"])).ops == ["GMM"]


def test_tenset_copy_only_for_a_tenset_dataset(shared_fixtures, tmp_path):
    assert options.tenset_copy(compose([])) is None
    assert options.tenset_copy(compose(["dataset=tenset", f"paths.data={tmp_path}"])) is None  # none downloaded
    found = options.tenset_copy(compose(["dataset=tenset", f"dataset.path={shared_fixtures / 'tenset'}"]))
    assert found == (shared_fixtures / "tenset").resolve()
