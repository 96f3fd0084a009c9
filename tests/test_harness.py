"""The kernel harness on real kernels: instruments, crash and hang isolation, resume, chatty children."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from pipeline.device import harness

from conftest import gpu_available

ADD_ARGS = [["float32", [4]], ["float32", [4]]]
TIMER = dict(number=1, repeat=2, min_repeat_ms=1)


def _export(func, path):
    import tvm

    tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"})).export_library(str(path))
    return str(path)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    from tvm.script import tirx as T

    @T.prim_func
    def hang(A: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "main"})
        while A[0] < T.float32(10.0):
            A[1] = A[1] + T.float32(1.0)

    @T.prim_func
    def crash(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "int64")):
        T.func_attr({"global_symbol": "main"})
        A[B[0] * T.int64(1099511627776)] = T.float32(1.0)

    @T.prim_func
    def add_one(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        T.func_attr({"global_symbol": "main"})
        for i in range(4):
            B[i] = A[i] + T.float32(1.0)

    d = tmp_path_factory.mktemp("kernels")
    return {name: _export(f, d / f"{name}.so") for name, f in
            [("hang", hang), ("crash", crash), ("add_one", add_one)]} | {"dir": d}


def _starts(path) -> list[str]:
    return [e["record_id"] for e in harness.read_events(path) if e.get("event") == "start"]


def test_hang_crash_and_wrong_results_become_rows_and_runs_resume(kernels, tmp_path):
    ok_ref, wrong_ref = tmp_path / "ok.npz", tmp_path / "wrong.npz"
    a, _ = harness.seeded_inputs(ADD_ARGS, 7)
    idx = np.arange(4)
    np.savez(ok_ref, seed=7, idx0=idx, idx1=idx, out0=a, out1=a + 1)
    np.savez(wrong_ref, seed=7, idx0=idx, idx1=idx, out0=a, out1=a + 2)
    jobs = [
        dict(record_id="good1", artifact=kernels["add_one"], args=ADD_ARGS),
        dict(record_id="hang", artifact=kernels["hang"], args=[["float32", [4]]]),
        dict(record_id="crash", artifact=kernels["crash"], args=[["float32", [4]], ["int64", [4]]]),
        dict(record_id="missing", artifact=str(tmp_path / "absent.so"), args=[["float32", [4]]]),
        dict(record_id="ok", artifact=kernels["add_one"], args=ADD_ARGS, reference="ok.npz"),
        dict(record_id="wrong", artifact=kernels["add_one"], args=ADD_ARGS, reference="wrong.npz"),
    ]
    out, streamed = tmp_path / "events.jsonl", []
    res = {r["record_id"]: r for r in harness.supervise(jobs, out, root=tmp_path, options=TIMER, timeout_s=3,
                                                        on_done=streamed.append)}
    assert list(res) == [j["record_id"] for j in jobs]
    assert sorted(e["record_id"] for e in streamed) == sorted(res)
    assert res["hang"]["error"] == "timeout: no result within 3 s"
    assert res["crash"]["error"] == "crashed: runner exited with signal SIGSEGV"
    assert res["missing"]["error"].startswith("run: ") and "absent.so" in res["missing"]["error"]
    good = res["good1"]
    assert "error" not in good and good["repeats"] == 2 and good["mean_s"] > 0 and "checked" not in good
    assert good["median_s"] >= good["min_s"] and len(good["run_secs"]) == 2
    assert res["crash"]["hardware"] == good["hardware"]  # written by the supervisor, for a child that died
    assert res["ok"]["checked"] and res["ok"]["correct"] and res["ok"]["max_abs_err"] == 0.0
    assert res["wrong"]["checked"] and res["wrong"]["correct"] is False
    assert abs(res["wrong"]["max_abs_err"] - 1.0) < 1e-6

    # The children after the hang and the crash resumed from the events file; so does a new
    # run: every job has its done event, nothing runs again (no child is started).
    again = harness.supervise(jobs, out, root=tmp_path, options=TIMER, python="/nonexistent/python")
    assert again == list(res.values())
    assert sorted(_starts(out)) == sorted(res)


def test_rounds_keep_each_kernels_best_round_and_a_failing_round_fails_the_kernel(kernels, tmp_path):
    ok_ref = tmp_path / "ok.npz"
    a, _ = harness.seeded_inputs(ADD_ARGS, 7)
    np.savez(ok_ref, seed=7, idx0=np.arange(4), idx1=np.arange(4), out0=a, out1=a + 1)
    flaky = tmp_path / "flaky.so"
    flaky.write_bytes(open(kernels["add_one"], "rb").read())
    jobs = [dict(record_id=f"good{i}", artifact=kernels["add_one"], args=ADD_ARGS) for i in range(4)]
    jobs += [dict(record_id="ok", artifact=kernels["add_one"], args=ADD_ARGS, reference="ok.npz"),
             dict(record_id="crash", artifact=kernels["crash"], args=[["float32", [4]], ["int64", [4]]]),
             dict(record_id="flaky", artifact=str(flaky), args=ADD_ARGS)]

    def lose_flaky_after_its_first_round(ev):
        if ev["record_id"] == "flaky":
            flaky.unlink(missing_ok=True)

    out = tmp_path / "events.jsonl"
    res = {r["record_id"]: r for r in harness.supervise_rounds(jobs, out, rounds=3, root=tmp_path, options=TIMER,
                                                               on_done=lose_flaky_after_its_first_round)}
    assert list(res) == [j["record_id"] for j in jobs]
    for rid in ("good0", "good3", "ok"):
        r = res[rid]
        assert "error" not in r and r["rounds"] == 3 and len(r["round_means_s"]) == 3
        assert r["mean_s"] == min(r["round_means_s"]) == pytest.approx(np.mean(r["run_secs"]))
        assert r["repeats"] == 2 and r["load_avg"] is not None
    assert res["ok"]["checked"] and res["ok"]["correct"]
    assert res["crash"]["error"].startswith("crashed: ") and res["crash"]["rounds"] == 1  # not timed again
    assert res["flaky"]["error"].startswith("round 1: run: ") and res["flaky"]["rounds"] == 2
    # Every round timed every kernel still standing, each round in its own order.
    rounds = [_starts(harness.round_events(out, r)) for r in range(3)]
    assert rounds[0] == [j["record_id"] for j in jobs]
    assert sorted(rounds[1]) == sorted(rounds[0][:5] + ["flaky"]) and sorted(rounds[2]) == sorted(rounds[0][:5])
    assert rounds[1] != [rid for rid in rounds[0] if rid in rounds[1]]  # shuffled
    # --out holds the best rounds: a new run reads them and times nothing.
    assert harness.done_events(out) == res
    again = harness.supervise_rounds(jobs, out, rounds=3, root=tmp_path, options=TIMER, python="/nonexistent/python")
    assert again == list(res.values())
    with pytest.raises(ValueError, match="only the timer"):
        harness.supervise_rounds(jobs, tmp_path / "perf.jsonl", rounds=2, root=tmp_path, instrument="perf")


def test_the_timer_flushes_the_cpu_cache_unless_told_not_to_and_says_where_it_ran(kernels, tmp_path):
    jobs = [dict(record_id="a", artifact=kernels["add_one"], args=ADD_ARGS)]
    on = harness.supervise(jobs, tmp_path / "on.jsonl", root=tmp_path, options=TIMER)[0]
    off = harness.supervise(jobs, tmp_path / "off.jsonl", root=tmp_path, options=dict(TIMER, cache_flush=0))[0]
    assert "error" not in on and "error" not in off
    assert on["cache_flush"] is True and off["cache_flush"] is False
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    if model:
        assert on["cpu_model"] == model
    assert on["cpu_count"] == os.cpu_count() and on["gpu_name"] is None and on["gpu_driver"] is None
    assert on["hardware"] == f"{on['cpu_model']}, {os.cpu_count()} CPUs" == harness.host_identity("cpu")["hardware"]


def test_settle_waits_for_a_quiet_host_at_most_its_limit():
    load, waited = harness.settle(below=1e9, limit_s=60)
    assert load is not None and load >= 0 and waited < 1  # quiet enough: no wait
    load, waited = harness.settle(below=-1, limit_s=0.5, poll_s=0.2)  # never quiet: the limit
    assert load > -1 and 0.5 <= waited < 5


def test_the_gpu_that_cuda_calls_device_0_is_the_one_named():
    gpus = [dict(index="0", uuid="GPU-aaaa", name="NVIDIA A", driver_version="550.1"),
            dict(index="1", uuid="GPU-bbbb", name="NVIDIA B", driver_version="550.1")]
    for visible, name in [("", "NVIDIA A"), ("1", "NVIDIA B"), ("GPU-bbbb,0", "NVIDIA B"), ("7", "NVIDIA A")]:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        try:
            assert harness.visible_gpu(gpus)["name"] == name
        finally:
            del os.environ["CUDA_VISIBLE_DEVICES"]
    assert harness.visible_gpu([]) is None


@pytest.mark.gpu
def test_a_gpu_host_names_its_gpu_and_driver():
    import tvm

    ident = harness.device_identity("cuda", tvm.cuda(0))
    assert ident["gpu_name"] == tvm.cuda(0).device_name == ident["hardware"] and ident["gpu_driver"]


@pytest.mark.skipif(gpu_available(), reason="checks a host without a CUDA device")
def test_a_chatty_child_without_a_device_fails_every_job_with_the_reason(kernels, tmp_path):
    """The child prints far more than a pipe holds (64 KiB) before it finds no device: its
    output goes to a file, so it cannot block, and its last line is every job's reason."""
    out = tmp_path / "events.jsonl"
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")  # a line per import: ~150 KB on stderr
    jobs = [dict(record_id=r, artifact=kernels["add_one"], args=ADD_ARGS) for r in ("a", "b")]
    res = harness.supervise(jobs, out, root=tmp_path, device="cuda", options=TIMER, startup_s=120, env=env)
    assert out.with_suffix(".log").stat().st_size > 2 * 65536
    assert [r["record_id"] for r in res] == ["a", "b"]
    reason = "crashed: runner exited with exit code 3: harness: no cuda device on this host"
    assert [r["error"] for r in res] == [reason, reason]


def test_the_harness_is_standalone():
    """It runs from a bundle on a host without the project: its modules import one another
    (relative imports), the standard library, NumPy, TVM (with its FFI package) and nvtx only."""
    names = set()
    for f in sorted(harness.HARNESS.glob("*.py")):
        tree = ast.parse(f.read_text())
        names |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert names - set(sys.stdlib_module_names) <= {"numpy", "tvm", "tvm_ffi", "nvtx", "cuda"}


def test_a_copy_of_the_harness_runs_as_its_own_package(kernels, tmp_path):
    """A bundle ships the folder as `harness/` and runs `python -m harness`: the supervisor's
    children find that copy (not the project's) wherever they start."""
    shutil.copytree(harness.HARNESS, tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(dict(record_id="a", artifact="add_one.so", args=ADD_ARGS)) + "\n")
    out = tmp_path / "events.jsonl"
    run = subprocess.run([sys.executable, "-m", "harness", "--jobs", str(jobs), "--out", str(out), "--root",
                          str(kernels["dir"]), "--number", "1",
                          "--repeat", "1", "--min-repeat-ms", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (done,) = [e for e in harness.read_events(out) if e["event"] == "done"]
    assert done["record_id"] == "a" and not done.get("error") and done["run_secs"]
    assert "harness: 1 ran, 0 failed" in run.stdout


def test_exported_cuda_source_compiles_for_the_kernels_arch(monkeypatch):
    """A CUDA kernel exported here holds CUDA source that the GPU host compiles when it loads
    it; the harness's compile callback needs no TVM compiler (a bundle has the runtime only)
    and compiles for the architecture the kernels were built for."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed: CUDA kernels cannot be built here")
    import tvm
    import tvm.s_tir as st
    import tvm_ffi
    from tvm import te
    from tvm.support import nvcc as tvm_nvcc

    a = te.placeholder((1024,), name="A")
    b = te.compute((1024,), lambda i: a[i] * 2, name="B")
    sch = st.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("B"))
    bx, tx = sch.split(i, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    source = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})).mod.imports[0]
    source = source.inspect_source()
    assert "__global__" in source

    class H100:
        compute_version = "9.0"

    monkeypatch.delenv(harness.CUDA_ARCH_ENV, raising=False)
    assert harness.instruments.cuda_arch(H100()) == "sm_90"  # the device's own without the bundle's
    monkeypatch.setenv(harness.CUDA_ARCH_ENV, "sm_90a")
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    try:
        assert harness.use_cuda_compiler(H100()) == "nvcc sm_90a"
        cubin = bytes(tvm_ffi.get_global_func("tvm_callback_cuda_compile")(source))
    finally:
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", tvm_nvcc.tvm_callback_cuda_compile, override=True)
    assert cubin[:4] == b"\x7fELF"
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "clang")
    with pytest.raises(ValueError, match="TVM_CUDA_COMPILE_MODE='clang'"):
        harness.use_cuda_compiler(H100())
    with pytest.raises(RuntimeError, match="nvcc failed for sm_90a"):
        harness.nvcc_cubin("this is not CUDA", "sm_90a")
