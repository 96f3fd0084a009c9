"""dataset=tenset: TenSet's task pickles become PrimFuncs that build and compute right."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from omegaconf import OmegaConf

from pipeline.tenset import dataset as DS
from pipeline.tenset import graph as G
from pipeline.tenset import npeval
from pipeline.tenset import tasks as T
from pipeline.workloads import tenset as source

CUDA = {"kind": "cuda", "arch": "sm_90a", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}
# Tasks per pickle in the fixtures (TenSet's own counts).
EXPECTED = {("bert_tiny", "cuda"): 10, ("bert_tiny", "llvm"): 10, ("dcgan", "cuda"): 5, ("dcgan", "llvm"): 5,
            ("mobilenet_v2", "cuda"): 32, ("resnet_18", "cuda"): 18, ("resnet_18", "llvm"): 18,
            ("resnext_50", "cuda"): 0}


def _cfg(tmp_path, path, networks=None):
    """The `dataset` group's config of a TenSet dataset (the data folder: `tmp_path`)."""
    return OmegaConf.create({"name": "tenset", "source": "tenset", "path": str(path), "networks": networks})


def _target(kind):
    import tvm

    return tvm.target.Target(CUDA if kind == "cuda" else {"kind": "llvm", "num-cores": 1})


@pytest.fixture(scope="module")
def imported(shared_fixtures):
    files = DS.task_files(shared_fixtures / "tenset")
    return {(f.network, f.target): T.read_task_file(f) for f in files}


def test_every_fixture_task_rebuilds(imported):
    from tvm import tirx

    assert {k: len(v) for k, v in imported.items()} == EXPECTED
    for tasks in imported.values():
        for t in tasks:
            assert t.error is None, f"{t.source_file} {t.workload_key}: {t.error}"
            func = t.mod()["main"]
            assert isinstance(func, tirx.PrimFunc)
            # Parameters: the DAG's tensors, inputs first, shapes as in the workload key.
            assert len(func.params) == len(t.dag.tensors)
            assert t.weight >= 1


def test_stage_order_starts_with_inputs_and_ends_with_the_output(imported):
    for tasks in imported.values():
        for t in tasks:
            ops = t.dag.ops
            assert type(ops[0]).__name__ == "PlaceholderOp"
            assert ops[-1].same_as(t.dag.tensors[-1].op)
            seen = set()
            for op in ops:  # post-order: every input is listed before its consumer
                for inp in op.input_tensors:
                    assert inp.op in seen
                seen.add(op)


def test_source_loads_only_the_target_kind(shared_fixtures, tmp_path):
    llvm = source.load(_cfg(tmp_path, shared_fixtures / "tenset"), _target("llvm"))
    assert {w.network for w in llvm} == {"bert_tiny", "dcgan", "resnet_18"}
    assert len(llvm) == 33 and {w.source for w in llvm} == {"tenset"}
    assert sum(w.weight for w in llvm if w.network == "resnet_18") == 23
    assert all(w.name.startswith('["') for w in llvm)  # the workload key, as Ansor records name it
    cuda = source.load(_cfg(tmp_path, shared_fixtures / "tenset", ["dcgan", "resnet_18"]), _target("cuda"))
    assert {w.network for w in cuda} == {"dcgan", "resnet_18"} and len(cuda) == 23


def test_empty_pickle_gives_no_task_and_a_log_line(shared_fixtures, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        got = source.load(_cfg(tmp_path, shared_fixtures / "tenset", ["resnext_50"]), _target("cuda"))
    assert got == []
    assert any("resnext_50" in r.getMessage() and "no tasks" in r.getMessage() for r in caplog.records)


def test_unknown_network_is_a_clear_error(shared_fixtures, tmp_path):
    with pytest.raises(ValueError, match="dataset.networks.*vgg_16.*available"):
        source.load(_cfg(tmp_path, shared_fixtures / "tenset", ["vgg_16"]), _target("llvm"))


def test_missing_copy_says_what_to_do(tmp_path):
    with pytest.raises(DS.DatasetError, match="stage=download"):
        DS.resolve(None, tmp_path)
    with pytest.raises(DS.DatasetError, match="does not exist"):
        DS.resolve(str(tmp_path / "nope.zip"), tmp_path)


def _one_module(tasks, prefix):
    import tvm

    funcs = {}
    for t in tasks:
        name = f"{prefix}{len(funcs)}"
        funcs[name] = t.dag.prim_func().with_attr("global_symbol", name)
    return tvm.IRModule(funcs)


def test_all_llvm_tasks_build(imported):
    """One library holds every llvm task's function, and each function that is cheap to run
    unscheduled (most of them) writes every element of its outputs, which start as NaN."""
    import tvm

    tasks = [t for (_, kind), ts in imported.items() if kind == "llvm" for t in ts]
    lib = tvm.compile(_one_module(tasks, "t"), target=_target("llvm"))
    funcs = [lib[f"t{i}"] for i in range(len(tasks))]  # a name the library lacks raises
    with pytest.raises(AttributeError, match="no function"):
        lib[f"t{len(tasks)}"]
    rng = np.random.default_rng(0)
    ran = 0
    for t, func in zip(tasks, funcs):
        if _work(t.dag) > 100_000_000:
            continue
        placeholders = [type(x.op).__name__ == "PlaceholderOp" for x in t.dag.tensors]
        shapes = [([int(n) for n in x.shape], str(x.dtype)) for x in t.dag.tensors]
        args = [tvm.runtime.tensor(rng.uniform(-1, 1, size=shape).astype(dtype) if p
                                   else np.full(shape, np.nan, dtype)) for (shape, dtype), p in zip(shapes, placeholders)]
        func(*args)
        outs = [a.numpy() for a, p in zip(args, placeholders) if not p]
        assert outs and all(np.isfinite(o).all() for o in outs), t.workload_key
        ran += 1
    assert ran >= 20


def test_all_cuda_tasks_build_for_cuda(imported):
    """Every cuda task compiles to CUDA kernels (threads bound by dlight's fallback rule,
    as the unscheduled PrimFunc has none)."""
    import tvm
    from tvm.s_tir import dlight as dl

    tasks = [t for (_, kind), ts in imported.items() if kind == "cuda" for t in ts]
    target = _target("cuda")
    mod = _one_module(tasks, "t")
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
    lib = tvm.compile(mod, target=target)
    src = lib.mod.imports[0].inspect_source()
    assert src.count("__global__") >= len(tasks)


def _work(dag) -> int:
    """Iteration points of all compute ops (what a naive evaluation costs)."""
    n = 0
    for op in dag.ops:
        if type(op).__name__ == "ComputeOp":
            n += int(np.prod([int(iv.dom.extent) for iv in [*op.axis, *op.reduce_axis]]))
    return n


@pytest.fixture(scope="module")
def graphs(shared_fixtures):
    """{workload key: (JSON graph, DAG)} over every fixture pickle."""
    from pipeline.tenset import unpickle as U

    out = {}
    for f in DS.task_files(shared_fixtures / "tenset"):
        tasks, _ = U.load(f.path)
        for t in tasks:
            key = str(t.workload_key)
            if key not in out:
                g = t.compute_dag.graph()
                out[key] = (g, G.rebuild(g))
    return out


def test_numerics_match_an_independent_numpy_evaluation(graphs):
    """The rebuilt PrimFunc (built for llvm) against a NumPy evaluation of the same JSON
    graph, on the small tasks plus the smallest task using each remaining node kind."""
    import tvm

    items = sorted(graphs.items(), key=lambda kv: _work(kv[1][1]))
    chosen, covered = [], set()
    all_kinds = set().union(*({n["type_key"] for n in g["nodes"]} for g, _ in graphs.values()))
    for key, (g, dag) in items:
        kinds = {n["type_key"] for n in g["nodes"]}
        if _work(dag) <= 3_000_000 or kinds - covered:
            chosen.append((key, g, dag))
            covered |= kinds
    assert covered == all_kinds
    target = _target("llvm")
    rng = np.random.default_rng(0)
    for key, g, dag in chosen:
        ins, outs = [], []
        for t in dag.tensors:
            shape, dtype = [int(x) for x in t.shape], str(t.dtype)
            if type(t.op).__name__ == "PlaceholderOp":
                ins.append(rng.uniform(-1, 1, size=shape).astype(dtype))
            else:
                outs.append(np.zeros(shape, dtype))
        ref = npeval.evaluate(g, ins)
        lib = tvm.compile(dag.mod(), target=target)
        args = [tvm.runtime.tensor(x) for x in ins + outs]
        lib["main"](*args)
        for r, a in zip(ref, args[len(ins):]):
            got = a.numpy()
            scale = float(np.abs(r).max()) + 1.0
            assert float(np.abs(got - r).max()) / scale < 1e-5, key
    assert len(chosen) >= 15
