"""Run modes (pipeline/runner/modes.py): one family for stage=measure and stage=collect, the
kind chosen under either option, the import that names what it lacks, the events file of each
sharding, and the command a collect bundle part runs per profiler. The modes at work on real
workspaces are in test_stages.py (measure: local, export, import) and test_bundle.py
(collect: export, a part run in a fresh venv, import)."""

from __future__ import annotations

import pytest

from features import profilers
from pipeline.config import compose
from pipeline.core.errors import PipelineError
from pipeline.core.workspace import Workspace
from pipeline.runner import bundle, modes
from pipeline import options


@pytest.fixture
def local_executor():
    with options.executor_of(compose(["executor.workers=1"])) as ex:
        yield ex


def test_one_family_chosen_by_either_stage(tmp_path, local_executor):
    ws = Workspace(tmp_path / "ws")
    s = options.measure_settings(compose(["measure.results=r.jsonl"]))
    for option in ("measure.mode", "collect.mode"):
        assert isinstance(modes.create("export", s, ws, local_executor, option=option), modes.Export)
        assert isinstance(modes.create("import", s, ws, local_executor, option=option), modes.Import)
        with pytest.raises(Exception, match=f"{option}='remote'; valid: local, export, import"):
            modes.create("remote", s, ws, local_executor, option=option)
    local = modes.create("local", s, ws, local_executor)
    assert isinstance(local, modes.Local) and local.events == "runner/results.jsonl"
    sharded = modes.Local(options.measure_settings(compose(["shard.index=1", "shard.count=3"])), ws, local_executor)
    assert sharded.events == "runner/results-1-of-3.jsonl"


@pytest.mark.parametrize("stage", ["measure", "collect"])
def test_an_import_without_results_names_the_option_of_its_stage(tmp_path, local_executor, stage):
    s = options.measure_settings(compose([]), results_of=stage)
    with pytest.raises(PipelineError, match=rf"^{stage}\.mode=import needs {stage}\.results=<"):
        modes.create("import", s, Workspace(tmp_path), local_executor, option=f"{stage}.mode")


def test_a_part_runs_the_profiler_of_the_host_and_only_that(tmp_path, local_executor):
    cfg = compose(["target=h100", "collect=ncu", f"paths.ncu_profiles={tmp_path}", "bundle.ncu_chunk=4"])
    export = modes.create("export", options.measure_settings(cfg, results_of="collect"), Workspace(tmp_path),
                          local_executor, option="collect.mode")
    ncu = profilers.create("ncu", options.profiler_settings(cfg))
    spec = export.part_spec(ncu)
    assert spec["device"] == "cuda" and spec["measure"]["options"]["repeat"] == cfg.measure.repeat
    # the host compiles the kernels' CUDA source for the arch they were built for
    assert spec["cuda_arch"] == "sm_90a" == cfg.target.tvm.arch
    assert options.measure_settings(compose([])).cuda_arch is None
    assert spec["ncu"]["chunk"] == 4 and spec["ncu"]["timeout_s"] == cfg.bundle.ncu_timeout_s
    args = spec["ncu"]["args"]
    assert args[args.index("--section-folder") + 1] == bundle.SECTIONS_ARG and "{report}.ncu-rep" in args
    assert spec["ncu"]["options"]["domain"] == ncu.options.domain
    for kind in ("perf", "none"):  # counted here (or on the executor's nodes), never in a part
        other = profilers.create(kind, options.profiler_settings(compose(["collect=auto"])))
        assert not other.on_device_host and export.part_spec(other)["ncu"] is None
