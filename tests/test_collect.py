"""stage=collect on real workspaces: static features, CPU counters, CUDA build resources."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from features import cpu_counters, cuda_resources, static
from pipeline.core import schema as S
from pipeline.shims.tvm_compat import preload_tensor_intrin
from pipeline.config import compose, run_stage
from pipeline.core.workspace import read_table
from pipeline.options import workspace_of

# Short counted loops: the test checks the mechanics, not the numbers.
FAST = ["collect.perf.min_time_s=0.01", "collect.perf.max_calls=50", "collect.profiler=perf"]


@pytest.fixture(scope="session", autouse=True)
def _fast_tensor_intrin():
    preload_tensor_intrin()


def test_per_store_feature_names_match_metaschedule():
    from tvm.s_tir import meta_schedule as ms

    names = S.PER_STORE_FEATURE_NAMES
    assert ms.feature_extractor.PerStoreFeature().feature_vector_length == len(names) == 164
    assert len(set(names)) == len(names)
    assert names[:2] == ("float_mad", "float_addsub") and names[-1] == "auto_unroll_max_step"


def _perf_invariants(cpu: pd.DataFrame) -> None:
    """Every perf counter has a value or a reason, never both, never neither."""
    for col in S.PERF_EVENTS:
        value, reason = cpu[f"perf.{col}"], cpu[f"perf.{col}.reason"]
        assert (value.isna() == reason.notna()).all(), col


def test_collect_cpu_workspace_sharded_resumable(measured_workspace, tmp_path):
    root, over = measured_workspace
    # A private copy: other tests read the shared workspace's features.
    shutil.copytree(root, tmp_path / root.name, ignore=shutil.ignore_patterns("features", "runner"))
    over = [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={tmp_path}"]
    ws = workspace_of(compose(over))
    assert ws.root == tmp_path / root.name
    over = [*over, *FAST, "shard.count=2"]
    cands = read_table(ws.candidates, S.CANDIDATES)
    shard0, shard1 = set(cands.iloc[0::2]["record_id"]), set(cands.iloc[1::2]["record_id"])

    out = run_stage("collect", [*over, "shard.index=0"])
    assert out["static"] == len(shard0) and out["static_errors"] == 0
    assert out["cpu"] == len(shard0) and out["cpu_errors"] == 0

    program = read_table(ws.features / "static", S.STATIC)
    stores = read_table(ws.features / "static_stores", S.STATIC_STORES)
    assert set(program["record_id"]) == shard0 and program["error"].isna().all()
    n = stores.groupby("record_id").size()
    assert (program.set_index("record_id")["n_stores"] == n.reindex(program["record_id"]).values).all()
    sums = stores.groupby("record_id")[list(S.PER_STORE_FEATURE_NAMES)].sum()
    got = program.set_index("record_id").loc[sums.index]
    for f in ("float_mad", "b0_bytes", "outer_prod"):
        np.testing.assert_allclose(got[f"sum.{f}"], sums[f], rtol=1e-5)
    assert program["cuda.kernels"].isna().all()  # llvm target

    folder = ws.features / "cpu" / "device=cpu"
    cpu = read_table(folder, S.CPU_COUNTERS)
    assert set(cpu["record_id"]) == shard0 and cpu["error"].isna().all()
    assert (cpu["calls"] >= 1).all() and (cpu["wall_s"] > 0).all()
    assert cpu["rusage.user_s"].notna().all() and cpu["rusage.minor_faults"].notna().all()
    _perf_invariants(cpu)
    if shutil.which("perf") is None:
        assert cpu["perf.cycles.reason"].str.contains("perf not installed").all()
    # The device lives in the Hive partition path, as pandas/pyarrow read it.
    assert set(pd.read_parquet(ws.features / "cpu")["device"].astype(str)) == {"cpu"}

    again = run_stage("collect", [*over, "shard.index=0"])
    assert again["static"] == 0 and again["cpu"] == 0

    # The other shard, on a machine without perf: nulls with the reason, rusage still there.
    out1 = run_stage("collect", [*over, "shard.index=1", "collect.perf.executable=/nonexistent/perf"])
    assert out1["static"] == len(shard1) and out1["cpu"] == len(shard1)
    cpu = read_table(folder, S.CPU_COUNTERS)
    assert set(cpu["record_id"]) == shard0 | shard1 and len(cpu) == len(shard0 | shard1)
    mine = cpu[cpu["record_id"].isin(shard1)]
    for col in S.PERF_EVENTS:
        assert mine[f"perf.{col}"].isna().all()
        assert mine[f"perf.{col}.reason"].str.startswith("perf not installed").all()
    assert mine["wall_s"].notna().all() and mine["rusage.user_s"].notna().all()
    _perf_invariants(cpu)

    # force=true redoes this shard only, without duplicates.
    forced = run_stage("collect", [*over, "shard.index=1", "force=true", "collect.profiler=none"])
    assert forced["static"] == len(shard1)
    program = read_table(ws.features / "static", S.STATIC)
    assert len(program) == len(cands) and program["record_id"].is_unique

    prog, st = static.load(ws)
    assert len(prog) == len(cands) and "error" not in prog.columns
    counters, reasons = cpu_counters.load(ws, "cpu")
    assert len(counters) == len(cands) and not any(c.endswith(".reason") for c in counters.columns)
    assert all(f"perf.{c}" in reasons for c in S.PERF_EVENTS if counters[f"perf.{c}"].isna().all())


def test_perf_csv_from_this_machine():
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed on this machine")
    proc = subprocess.run([perf, "stat", "-x", ",", "-e", "task-clock,cycles", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    parsed = cpu_counters.parse_perf_csv(proc.stderr)
    value, reason = parsed["task-clock"]
    assert reason is None and 0 < value < 5  # seconds
    value, reason = parsed["cycles"]
    assert (value is None) != (reason is None)


def test_probe_perf_without_perf_and_with_unknown_event():
    path, usable, reasons = cpu_counters.probe_perf("/nonexistent/perf", ["cycles", "task-clock"])
    assert path is None and usable == []
    assert set(reasons) == {"cycles", "task-clock"} and all(r.startswith("perf not installed") for r in reasons.values())
    with pytest.raises(ValueError, match="unknown event"):
        cpu_counters.probe_perf("perf", ["bogus-event"])


# `ptxas -v` output of two TVM kernels for sm_90a built on this machine (nvcc 13.0, the flags
# of cuda_resources.nvcc_command), one of them spilling; concatenated.
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'
ptxas info    : Function properties for main_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 24576 bytes smem
ptxas info    : Compile time = 107.925 ms
ptxas warning : Local memory used for function 'main_kernel_1', size of stack frame: 1712 bytes
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel_1' for 'sm_90a'
ptxas info    : Function properties for main_kernel_1
    1712 bytes stack frame, 4404 bytes spill stores, 4436 bytes spill loads
ptxas info    : Used 48 registers, used 1 barriers, 1712 bytes cumulative stack size, 26112 bytes smem
ptxas info    : Compile time = 618.237 ms
"""


def test_parse_ptxas():
    got = cuda_resources.parse_ptxas(PTXAS)
    assert got["main_kernel"] == dict(local_mem_bytes=0, spill_store_bytes=0, spill_load_bytes=0,
                                      registers_per_thread=168, barriers=1, shared_mem_bytes=24576,
                                      constant_mem_bytes=None)
    assert got["main_kernel_1"] == dict(local_mem_bytes=1712, spill_store_bytes=4404, spill_load_bytes=4436,
                                        registers_per_thread=48, barriers=1, shared_mem_bytes=26112,
                                        constant_mem_bytes=None)


@pytest.mark.slow
def test_cuda_static_features_without_gpu(tmp_path):
    """target=h100 built here: ptxas resources and launch configuration for real, ncu skipped."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed: CUDA kernels cannot be built here")
    over = [f"paths.data={tmp_path}", "target=h100", "dataset.ops=[GMM]", "dataset.configs=[0]",
            "budget=smoke", "budget.candidates_per_task=2"]
    for stage in ("tasks", "sample", "replay"):
        run_stage(stage, over)
    out = run_stage("collect", over)
    ws = workspace_of(compose(over))
    cands = read_table(ws.candidates, S.CANDIDATES)
    assert out["static"] == len(cands) == 2 and out["cuda_kernels"] >= 2
    from features.ncu.profile import gpu_present

    if not gpu_present():
        assert out["ncu_skipped_no_gpu"] == 2 and not (ws.features / "ncu").exists()
    res = read_table(ws.features / "cuda_resources", S.CUDA_RESOURCES)
    assert res["error"].isna().all() and set(res["record_id"]) == set(cands["record_id"])
    assert (res["registers_per_thread"] > 0).all() and (res["shared_mem_bytes"] >= 0).all()
    assert (res["arch"] == "sm_90a").all() and res["spill_store_bytes"].notna().all()
    assert (res["threads_per_block"] == res["block_x"] * res["block_y"] * res["block_z"]).all()
    assert (res["blocks"] == res["grid_x"] * res["grid_y"] * res["grid_z"]).all()
    program = read_table(ws.features / "static", S.STATIC).set_index("record_id")
    one = res[res["kernel_index"] == 0].set_index("record_id")
    # The launch grid agrees with the thread extents MetaSchedule's features saw.
    np.testing.assert_allclose(np.log2(1 + one["grid_x"]), program.loc[one.index, "max.blockIdx_x_len"], rtol=1e-5)
    np.testing.assert_allclose(np.log2(1 + one["block_x"]), program.loc[one.index, "max.threadIdx_x_len"], rtol=1e-5)
    assert (program.loc[one.index, "cuda.registers_per_thread_max"] == one["registers_per_thread"]).all()
