"""The kernel runner isolates kernels that hang or crash and keeps every other result."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.runner.kernel_runner import run_jobs


def _export(func, path):
    import tvm

    tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"})).export_library(str(path))
    return str(path)


@pytest.fixture(scope="module")
def bad_kernels(tmp_path_factory):
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


def test_hang_and_crash_become_rows_and_the_rest_runs(bad_kernels, tmp_path):
    jobs = [
        dict(record_id="good1", artifact=bad_kernels["add_one"], args=[["float32", [4]], ["float32", [4]]]),
        dict(record_id="hang", artifact=bad_kernels["hang"], args=[["float32", [4]]]),
        dict(record_id="crash", artifact=bad_kernels["crash"], args=[["float32", [4]], ["int64", [4]]]),
        dict(record_id="missing", artifact=str(tmp_path / "absent.so"), args=[["float32", [4]]]),
        dict(record_id="good2", artifact=bad_kernels["add_one"], args=[["float32", [4]], ["float32", [4]]]),
    ]
    res = {r["record_id"]: r for r in run_jobs(jobs, tmp_path / "results.jsonl", tmp_path, "cpu",
                                               dict(number=1, repeat=2, min_repeat_ms=1), timeout_s=3)}
    assert list(res) == ["good1", "hang", "crash", "missing", "good2"]
    assert res["hang"]["error"].startswith("timeout")
    assert res["crash"]["error"] == "crashed: runner exited with signal SIGSEGV"
    assert res["missing"]["error"].startswith("run: ") and "absent.so" in res["missing"]["error"]
    for g in ("good1", "good2"):
        assert "error" not in res[g] and res[g]["repeats"] == 2 and res[g]["mean_s"] > 0


def test_reference_check_catches_a_wrong_result(bad_kernels, tmp_path):
    from pipeline.runner.kernel_runner import random_array

    ok_ref, wrong_ref = tmp_path / "ok.npz", tmp_path / "wrong.npz"
    rng = np.random.default_rng(7)
    a, _ = random_array(np, "float32", [4], rng), random_array(np, "float32", [4], rng)
    idx = np.arange(4)
    np.savez(ok_ref, seed=7, idx0=idx, idx1=idx, out0=a, out1=a + 1)
    np.savez(wrong_ref, seed=7, idx0=idx, idx1=idx, out0=a, out1=a + 2)
    args = [["float32", [4]], ["float32", [4]]]
    jobs = [dict(record_id=n, artifact=bad_kernels["add_one"], args=args, reference=str(p))
            for n, p in (("ok", ok_ref), ("wrong", wrong_ref))]
    res = {r["record_id"]: r for r in run_jobs(jobs, tmp_path / "results.jsonl", tmp_path, "cpu",
                                               dict(number=1, repeat=1, min_repeat_ms=1), timeout_s=30)}
    assert res["ok"]["checked"] and res["ok"]["correct"] and res["ok"]["max_abs_err"] == 0.0
    assert res["wrong"]["checked"] and res["wrong"]["correct"] is False
    assert abs(res["wrong"]["max_abs_err"] - 1.0) < 1e-6
