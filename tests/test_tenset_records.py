"""Ansor measure records: parsed into rows with TenSet's labels, and replayed on s_tir."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.tenset import dataset as DS
from pipeline.tenset import join
from pipeline.tenset import records as R
from pipeline.tenset import replay as RP

CUDA = {"kind": "cuda", "arch": "sm_90a", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}
# Records per fixture file (comment lines excluded).
EXPECTED = {"conv2d.json": 1, "matmul.json": 1, "resnet-18-NHWC-B1-cuda.json": 24,
            "resnet-50-NHWC-B1-llvm.json": 26, "sparse_dense.json": 1, "tenset_k80_one_record.json": 1}


@pytest.fixture(scope="module")
def records(shared_fixtures):
    files = sorted((shared_fixtures / "ansor_records").glob("*.json"))
    recs, errors = R.read_records(files)
    assert errors == []
    return recs


@pytest.fixture(scope="module")
def dags(shared_fixtures):
    """{workload key: DAG} of the fixture task pickles, both target kinds."""
    out = {}
    for kind in ("cuda", "llvm"):
        out.update(join.imported_dags(shared_fixtures / "tenset", kind))
    return out


def test_every_record_parses(records):
    counts = {}
    for r in records:
        counts[r.source] = counts.get(r.source, 0) + 1
        assert r.steps and r.costs and r.error_no == 0
        assert r.target_kind in ("cuda", "llvm")
        R.workload_args(r.workload_key)
    assert counts == EXPECTED
    assert {r.version for r in records} == {"v0.2", "v0.3", "v0.5", "v0.6"}
    k80 = next(r for r in records if r.source == "tenset_k80_one_record.json")
    assert k80.hardware_params == [-1, 16, 64, 49152, 2147483647, 1024, 8, 32]
    assert k80.costs == [0.176353, 0.176359] and k80.task_input_names == []
    sparse = next(r for r in records if r.source == "sparse_dense.json")
    assert len(sparse.task_input_names) == 3


def test_rows_carry_tenset_labels(records):
    rows = R.rows(records, {records[0].workload_key: "abc"})
    assert len(rows) == len(records) and len({r["record_id"] for r in rows}) == len(rows)
    assert rows[0]["task_id"] == "abc"
    by_task = {}
    for r in rows:
        assert 0 < r["label"] <= 1
        assert r["mean_s"] == pytest.approx(float(np.mean(r["costs_s"])))
        by_task.setdefault((r["workload_key"], r["target"]), []).append(r["label"])
    assert all(max(v) == 1.0 for v in by_task.values())


def test_bad_lines_become_error_rows(tmp_path):
    p = tmp_path / "log.json"
    p.write_text('# comment\n\n{"i": 1}\n{"i": [["[\\"x\\"]", "llvm"], [[], [["XX", 1]]]], "r": [[1], 0, 1, 1], "v": "v0.6"}\n')
    recs, errors = R.read_records([p])
    assert recs == [] and [e["line"] for e in errors] == [3, 4]
    assert "unknown transform step" in errors[1]["error"]


def _run_llvm(mod, arrays):
    import tvm

    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm", "num-cores": 1}))
    args = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*args)
    return [a.numpy() for a in args]


def _inputs(dag, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=[int(x) for x in t.shape]).astype(str(t.dtype)) if
            type(t.op).__name__ == "PlaceholderOp" else np.zeros([int(x) for x in t.shape], str(t.dtype))
            for t in dag.tensors]


def _check_replay(record, dag, reference=None):
    """Replays a record: builds it for its own target; runs it (threads unbound for a CUDA
    record) on llvm and compares with the unscheduled PrimFunc or `reference`."""
    import tvm

    func = dag.prim_func()
    sch = RP.replay(func, dag.ops, record.steps, record.target_kind)
    if record.target_kind == "cuda":
        lib = tvm.compile(sch.mod, target=tvm.target.Target(CUDA))
        assert "__global__" in lib.mod.imports[0].inspect_source()
        sch = RP.replay(func, dag.ops, record.steps, record.target_kind, bind_threads=False)
    arrays = _inputs(dag)
    got = _run_llvm(sch.mod, arrays)[-1]
    want = reference(arrays) if reference else _run_llvm(tvm.IRModule({"main": func}), arrays)[-1]
    scale = float(np.abs(want).max()) + 1.0
    assert float(np.abs(got - want).max()) / scale < 1e-5
    return sch


def test_tutorial_matmul_replays_to_the_right_result(records):
    rec = next(r for r in records if r.source == "matmul.json")
    dag = join.dag_for_key(rec.workload_key)
    sch = _check_replay(rec, dag, reference=lambda a: a[0] @ a[1] + a[2])
    script = sch.mod.script()
    assert "T.parallel" in script and "T.vectorized" in script and "pragma_auto_unroll_max_step" in script


def test_tutorial_conv2d_replays_to_a_cuda_kernel(records):
    rec = next(r for r in records if r.source == "conv2d.json")
    dag = join.dag_for_key(rec.workload_key)
    sch = _check_replay(rec, dag)
    # The schedule Ansor found: 28 blocks of 64 threads, shared-memory caches of both inputs.
    bound = RP.replay(dag.prim_func(), dag.ops, rec.steps, "cuda").mod.script()
    assert 'T.thread_binding(28, thread="blockIdx.x")' in bound
    assert 'T.thread_binding(64, thread="threadIdx.x")' in bound
    assert bound.count('scope="shared"') == 2 and 'scope="local"' in bound


def test_records_of_fixture_tasks_replay(records, dags):
    """Every record whose workload key names a fixture task (ResNet-18 on CUDA, ResNet-50 on
    a CPU: direct convolutions, winograd, dense, pooling) replays and computes right."""
    matched = [r for r in records if r.workload_key in dags]
    assert len(matched) == 13
    for rec in matched:
        try:
            _check_replay(rec, dags[rec.workload_key])
        except RP.ReplayError as e:
            pytest.fail(f"{rec.source}:{rec.line}: {e}")


def test_step_kinds_replayed(records, dags):
    replayable = [r for r in records if r.workload_key in dags or join.dag_for_key(r.workload_key)]
    kinds = {s[0] for r in replayable for s in r.steps}
    assert kinds == {"SP", "FSP", "FFSP", "RE", "FU", "AN", "CA", "CI", "CHR", "CHW", "PR", "CR"}


def test_unrebuildable_keys_and_unsupported_steps_are_named(records, dags):
    sparse = next(r for r in records if r.source == "sparse_dense.json")
    assert join.dag_for_key(sparse.workload_key) is None  # needs the tutorial's sparse inputs
    rec = next(r for r in records if r.source == "matmul.json")
    dag = join.dag_for_key(rec.workload_key)
    with pytest.raises(RP.ReplayError, match=r"step 0 \['XX'.*not supported"):
        RP.replay(dag.prim_func(), dag.ops, [["XX", 2]], "llvm")
    with pytest.raises(RP.ReplayError, match=r"step 0 .*stage 9 does not exist"):
        RP.replay(dag.prim_func(), dag.ops, [["SP", 9, 0, 1024, [4], 1]], "llvm")


def test_join_uses_task_ids_of_stage_tasks(records, shared_fixtures):
    from pipeline.core import identity

    keys = {r.workload_key for r in records}
    ids = join.task_ids_for_keys(shared_fixtures / "tenset", "llvm", keys)
    rec = next(r for r in records if r.source == "matmul.json")
    assert ids[rec.workload_key] == identity.task_id(join.dag_for_key(rec.workload_key).mod())
    # resnet-50's llvm records share 3 workload keys with the fixtures' llvm tasks; the
    # resnet-18 cuda records' keys are looked up among the llvm tasks too (same DAG hash
    # and shapes = the same compute).
    assert len(ids) >= 4
    assert all(len(v) == 16 for v in ids.values())
    assert DS.record_files(shared_fixtures, "llvm") == []  # the fixtures hold no measure_records/


def test_cpu_rfactor_record_replays_on_a_softmax(shared_fixtures):
    """ResNet-50's softmax record (RF, CR, CA of write-back stages) on TOPI's softmax,
    the op behind that workload key (same four stages, same order)."""
    import tvm
    from tvm import te, topi

    from pipeline.tenset.graph import DAG, ansor_stage_order

    recs, _ = R.read_records([shared_fixtures / "ansor_records" / "resnet-50-NHWC-B1-llvm.json"])
    rec = next(r for r in recs if any(s[0] == "RF" for s in r.steps))
    assert R.workload_args(rec.workload_key)[1] == [1, 1000, 1, 1000]
    x = te.placeholder((1, 1000), name="x")
    y = topi.nn.softmax(x)
    dag = DAG([x, y], ansor_stage_order([x, y]))
    assert [op.name for op in dag.ops] == ["x", "T_softmax_maxelem", "T_softmax_exp", "T_softmax_expsum",
                                           "T_softmax_norm"]
    sch = RP.replay(dag.prim_func(), dag.ops, rec.steps, "llvm")
    script = sch.mod.script()
    assert script.count("T.sblock_alloc_buffer((1, 20))") == 1 and script.count("T.sblock_alloc_buffer((1, 50))") == 1
    a = np.random.default_rng(0).uniform(-3, 3, (1, 1000)).astype("float32")
    got = _run_llvm(sch.mod, [a, np.zeros_like(a)])[-1]
    e = np.exp(a - a.max())
    np.testing.assert_allclose(got, e / e.sum(), rtol=1e-5, atol=1e-7)


def test_replay_command_reports_each_record(shared_fixtures, capsys):
    from pipeline.tenset.__main__ import main

    files = [str(shared_fixtures / "ansor_records" / f) for f in ("matmul.json", "sparse_dense.json")]
    assert main(["replay", *files, "--no-numerics"]) == 0
    out = capsys.readouterr().out
    assert "matmul.json:2" in out and "built" in out
    assert "2 records: 1 built, 1 compute not rebuildable" in out


def test_every_ansor_step_kind_has_a_replay():
    assert set(RP.SUPPORTED_STEPS) == set(R.STEP_KINDS)
    assert all(hasattr(RP.Replayer, f"_step_{k}") for k in RP.SUPPORTED_STEPS)


def test_storage_align_pads_the_stage_buffer():
    """SA (no fixture record uses it): the cache stage's buffer rows are padded."""
    from pipeline.tenset import registered

    dag = registered.dag_for("matmul_add", [64, 64, 64, "float32"])
    steps = [["CHR", 0, "global", [2]], ["SA", 1, 0, 32, 8]]  # cache A for matmul, align its rows
    sch = RP.replay(dag.prim_func(), dag.ops, steps, "llvm")
    assert '"buffer_dim_align": [[0, 0, 32, 8]]' in sch.mod.script()
    arrays = _inputs(dag)
    got = _run_llvm(sch.mod, arrays)[-1]
    np.testing.assert_allclose(got, arrays[0] @ arrays[1] + arrays[2], rtol=1e-5, atol=1e-5)


def test_hostile_record_lines_are_one_error_each_and_the_good_ones_go_on(shared_fixtures, tmp_path, capsys):
    """Non-UTF-8 bytes, deep nesting, wrong workload arguments, an unknown dtype: one line
    each, with file:line, and the later good record still runs; a record past the memory
    bound fails alone."""
    from pipeline.tenset.__main__ import main

    good = [line for line in (shared_fixtures / "ansor_records" / "matmul.json").read_text().splitlines()
            if line.startswith("{")][0]
    huge = good.replace("1024, 1024, 1024", "16384, 16384, 16384")
    lines = [good.encode(), b"\x80\x81\xfe not utf-8", b"[" * 200000 + b"]" * 200000,
             good.replace("1024, 1024, 1024", '\\"a\\", 1024, 1024').encode(),
             good.replace("float32", "float33").encode(), huge.encode(), good.encode()]
    path = tmp_path / "hostile.json"
    path.write_bytes(b"\n".join(lines) + b"\n")
    code = main(["replay", str(path), "--timeout-s", "120", "--max-memory-gib", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "hostile.json:2: unreadable: not UTF-8 text" in out
    assert "hostile.json:3: unreadable" in out
    for n in (4, 5):
        assert f"hostile.json:{n}" in out and ("FAILED" in out.split(f"hostile.json:{n}")[1].splitlines()[0]
                                              or "not rebuildable" in out)
    assert "FAILED" in out.split("hostile.json:6")[1].splitlines()[0]  # past 1 GiB: this record alone
    assert "hostile.json:1 " in out and "hostile.json:7 " in out
    assert out.split("hostile.json:7")[1].splitlines()[0].rstrip().endswith("correct")
