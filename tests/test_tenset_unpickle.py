"""TenSet's task pickles are untrusted input: they load only through an allowlist, within
limits that keep a small file small, and a damaged or hostile file is one line naming it."""

from __future__ import annotations

import copy
import io
import json
import pickle
import pickletools
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from conftest import ROOT

from pipeline.core.errors import PipelineError
from pipeline.tenset import __main__ as tenset_tool
from pipeline.tenset import dataset as DS
from pipeline.tenset import tasks as T
from pipeline.tenset import unpickle as U


def _network_info(shared_fixtures):
    return sorted((shared_fixtures / "tenset" / "network_info").glob("*.task.pkl"))


def test_fixture_pickles_load_into_stand_ins(shared_fixtures):
    counts = {}
    for p in _network_info(shared_fixtures):
        tasks, weights = U.load(p)
        counts[p.name] = len(tasks)
        assert len(weights) == len(tasks)
        for t in tasks:
            assert isinstance(t, U.SearchTask)
            assert isinstance(t.compute_dag, U.ComputeDAG) and t.compute_dag.graph()["nodes"]
            assert isinstance(t.workload_key, str) and t.workload_key.startswith('["')
            assert t.target.kind() == p.name.rsplit(",", 1)[1].split(")")[0]
            assert isinstance(t.hardware_params.params(), dict)
    assert counts["((resnext_50,[(1,3,224,224)]),cuda).task.pkl"] == 0  # empty, as in TenSet
    assert counts["((resnet_18,[(1,3,224,224)]),llvm).task.pkl"] == 18
    # The globals these real pickles name are exactly the allowlist's.
    named = set()
    for p in _network_info(shared_fixtures):
        ops = list(pickletools.genops(p.read_bytes()))
        strings = [arg for op, arg, _ in ops if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE")]
        named.update(s for s in strings if s.startswith("tvm."))
    assert named <= {m for m, _ in U.ALLOWED}


class _System:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


class _Popen:
    def __reduce__(self):
        import subprocess

        return (subprocess.Popen, (["echo", "pwned"],))


def _global_pickle(module: str, name: str, arg: str = "x") -> bytes:
    """A protocol-0 pickle calling module.name(arg), written by hand so that building it
    imports nothing."""
    return f"c{module}\n{name}\n(V{arg}\ntR.".encode()


def _stack_global_pickle(module: str, name: str) -> bytes:
    """The same with protocol 4's STACK_GLOBAL (the opcode TenSet's pickles use)."""
    def s(x):
        b = x.encode()
        return b"\x8c" + bytes([len(b)]) + b
    return b"\x80\x04" + s(module) + s(name) + b"\x93" + s("x") + b"\x85R."


@pytest.mark.parametrize("payload", [
    pickle.dumps(_System()), pickle.dumps(_System(), protocol=0), pickle.dumps(_Popen()),
    _global_pickle("builtins", "eval", "1+1"), _stack_global_pickle("os", "system"),
    _stack_global_pickle("tvm.auto_scheduler.search_task", "os"),
    # An allowed module with a name outside the allowlist.
    _stack_global_pickle("tvm.runtime.object", "__builtins__"),
])
def test_globals_outside_the_allowlist_are_refused(payload):
    with pytest.raises(U.UnsafePickleError, match="refusing"):
        U.loads(payload)


def test_a_refused_pickle_imports_nothing():
    # Real, importable modules that nothing in this process has a reason to import.
    candidates = [("ftplib", "FTP"), ("xmlrpc.server", "SimpleXMLRPCServer"), ("smtplib", "SMTP"),
                  ("imaplib", "IMAP4"), ("poplib", "POP3"), ("mailbox", "Maildir")]
    fresh = [(m, n) for m, n in candidates if m not in sys.modules]
    assert fresh, "every candidate module was already imported"
    for mod, name in fresh:
        for payload in (_global_pickle(mod, name), _stack_global_pickle(mod, name)):
            with pytest.raises(U.UnsafePickleError):
                U.loads(payload)
        assert mod not in sys.modules
    # The allowlisted names map to stand-ins: TVM 0.8's modules are never imported either.
    assert "tvm.auto_scheduler" not in sys.modules


def test_new_object_only_builds_tvm_stand_ins():
    # `_new_object` is allowed, but applying it to anything but a TVM stand-in is refused.
    def s(x):
        b = x.encode()
        return b"\x8c" + bytes([len(b)]) + b
    payload = (b"\x80\x04" + s("tvm.runtime.object") + s("_new_object") + b"\x93"
               + s("tvm.runtime.container") + s("String") + b"\x93" + b"\x85R.")
    with pytest.raises(U.UnsafePickleError, match="not an allowed TVM class"):
        U.loads(payload)
    # Nor may a pickle set attributes on it (BUILD on the function itself).
    build = b"\x80\x04" + s("tvm.runtime.object") + s("_new_object") + b"\x93" + b"}" + s("x") + b"Nsb."
    with pytest.raises(U.UnsafePickleError, match="BUILD at byte .* applied to the value of STACK_GLOBAL"):
        U.loads(build)
    assert not U._new_object.__dict__


def test_plain_data_still_loads():
    assert U.loads(pickle.dumps(([], []))) == ([], [])
    assert U.loads(pickle.dumps({"a": [1, 2.5, "x", (None, True)]})) == {"a": [1, 2.5, "x", (None, True)]}


# -- hostile and damaged files ---------------------------------------------------------
# TenSet-format pickles are written here as TVM 0.8 wrote them: each object as
# `(tvm.runtime.object._new_object, (cls,), state)`, with the TVM module names (protocol 3,
# whose GLOBAL opcodes name module and class as text, so the stand-ins' names are swapped
# for TVM's without importing anything).
_TVM_NAMES = {f"c{v.__module__}\n{v.__qualname__}\n".encode(): f"c{m}\n{n}\n".encode()
              for (m, n), v in U.ALLOWED.items()}


class _TenSetPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, U.TVMObject):
            return U._new_object, (type(obj),), dict(obj.__dict__)
        return NotImplemented


def tenset_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _TenSetPickler(buf, protocol=3).dump(obj)
    data = buf.getvalue()
    for ours, tvm in _TVM_NAMES.items():
        data = data.replace(ours, tvm)
    assert b"pipeline" not in data
    return data


def _real_task(shared_fixtures):
    """A real SearchTask (dcgan, llvm), as the Unpickler returns it."""
    tasks, _ = U.load(shared_fixtures / "tenset" / "network_info" / "((dcgan,[(1,3,64,64)]),llvm).task.pkl")
    return copy.copy(tasks[0])


def _shared_nest(levels=40, width=10):
    x = ["k"]
    for _ in range(levels):
        x = [x] * width
    return x


def _expanded(x, memo=None) -> int:
    """Items of `x` written out as a tree (what str() or json.dumps would produce)."""
    memo = {} if memo is None else memo
    if not isinstance(x, list):
        return 1
    if id(x) not in memo:
        memo[id(x)] = 1 + sum(_expanded(y, memo) for y in x)
    return memo[id(x)]


def _bounded(fn):
    """(what fn returned, the exception it raised, peak bytes allocated). Memory, not time:
    a refusal is checked by what it says and what it let be allocated, which no load on
    the machine changes."""
    tracemalloc.start()
    got = err = None
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        err = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return got, err, peak


def _task_file(path: Path) -> DS.TaskFile:
    m = DS._TASK_FILE.match(path.name)
    return DS.TaskFile(path, m["net"], m["shapes"], m["target"])


@pytest.mark.parametrize("field", ["workload_key", "task_input_names", "layout_rewrite_option"])
def test_a_nest_of_shared_references_is_refused_in_bounded_memory(shared_fixtures, tmp_path, field):
    task = _real_task(shared_fixtures)
    task.__dict__[field] = _shared_nest()
    data = tenset_pickle(([task], [1]))
    path = tmp_path / "((dcgan,[(1,3,64,64)]),llvm).task.pkl"
    path.write_bytes(data)
    # Every global it names is allowed: without the checks it loads, into a value that
    # prints as ~10^40 items.
    raw, _ = U.TenSetUnpickler(io.BytesIO(data)).load()
    assert _expanded(raw[0].__dict__[field]) > 10**40
    for read in (lambda: U.load(path), lambda: T.read_task_file(_task_file(path))):
        _, err, peak = _bounded(read)
        assert isinstance(err, U.UnsafePickleError) and isinstance(err, PipelineError)
        msg = str(err)
        assert msg.startswith(str(path)) and "\n" not in msg
        assert "refused: a second reference" in msg and "restore it from the TenSet archive" in msg
        assert peak < 10 * len(data) + (8 << 20), peak


def test_a_1kb_search_task_of_shared_references_is_refused(tmp_path):
    # A SearchTask whose workload_key is 40 levels of 10 references to one list, and
    # nothing else: about 1 KB.
    task = U.SearchTask()
    task.__setstate__({"compute_dag": None, "workload_key": _shared_nest(), "target": None})
    data = tenset_pickle(([task], [1]))
    assert len(data) < 1200
    path = tmp_path / "bomb.task.pkl"
    path.write_bytes(data)
    _, err, peak = _bounded(lambda: U.load(path))
    assert isinstance(err, U.UnsafePickleError) and str(err).startswith(f"{path}: refused")
    assert peak < 8 << 20


def test_shared_strings_are_bounded_by_the_printed_size(tmp_path):
    # Sharing strings is how TenSet writes its dict keys, so it is allowed; a thousand
    # references to one 100 KB string are 100 MB printed and are refused.
    s = "x" * 100_000
    path = tmp_path / "strings.task.pkl"
    path.write_bytes(pickle.dumps(([s] * 1000, [1]), protocol=4))
    _, err, peak = _bounded(lambda: U.load(path))
    assert isinstance(err, U.UnsafePickleError), err
    assert "characters once printed" in str(err) and str(err).startswith(str(path))
    assert peak < 20 << 20
    assert U.loads(pickle.dumps(([s] * 3, [1]), protocol=4)) == ([s] * 3, [1])  # a few are fine


def test_copies_of_a_shared_string_count_in_the_printed_size():
    # String(s) copies s: 2000 Strings of one 10 KB string are 20 MB from a 22 KB file.
    def s(x):
        return b"\x8c" + bytes([len(x)]) + x.encode()
    text = "x" * 10_000
    def payload(copies):  # [String(text), String(text), ...], the class and text in memo 0 and 1
        return (b"\x80\x04](" + s("tvm.runtime.container") + s("String") + b"\x93\x94"
                + b"X" + len(text).to_bytes(4, "little") + text.encode() + b"\x94\x85\x81"
                + b"h\x00h\x01\x85\x81" * (copies - 1) + b"e.")
    _, err, peak = _bounded(lambda: U.loads(payload(2000), "strings.pkl"))
    assert isinstance(err, U.UnsafePickleError) and "characters once printed" in str(err)
    assert peak < 4 << 20
    few = U.loads(payload(3))
    assert few == [text] * 3 and all(isinstance(x, U.String) for x in few)


def test_deep_nesting_and_too_many_opcodes_are_refused(monkeypatch):
    deep = []
    for _ in range(200):  # no sharing at all, only depth
        deep = [deep]
    with pytest.raises(U.UnsafePickleError, match="nested deeper than 32 levels"):
        U.loads(pickle.dumps(deep, protocol=4), "deep.pkl")
    # A dict keyed by a tuple nested a million deep: hashing it overflows the C stack.
    crash = b"\x80\x04}" + b")" + b"\x85" * 1_000_000 + b"Ns."
    _, err, _ = _bounded(lambda: U.loads(crash, "crash.pkl"))
    assert isinstance(err, U.UnsafePickleError) and "nested deeper" in str(err)
    monkeypatch.setattr(U, "MAX_OPCODES", 50)
    with pytest.raises(U.UnsafePickleError, match="more than 50 pickle opcodes"):
        U.loads(pickle.dumps(list(range(100)), protocol=4), "wide.pkl")


def test_memo_tricks_are_refused_before_anything_is_built():
    # A 9-byte pickle: LONG_BINPUT at slot 2^31-1 makes the unpickler allocate a 32 GB memo
    # (slot 2^26 takes 1 GB).
    _, err, peak = _bounded(lambda: U.loads(b"\x80\x04N" + b"r\xff\xff\xff\x7f" + b".", "memo.pkl"))
    assert isinstance(err, U.DamagedPickleError) and "memo slot 2147483647" in str(err)
    assert peak < 1 << 20
    # A get of a slot never written; DUP (a second reference without the memo).
    for payload in (b"\x80\x04h\x05.", b"\x80\x04]2\x86."):
        with pytest.raises(U.DamagedPickleError, match="memo.pkl: damaged or not a TenSet task file"):
            U.loads(payload, "memo.pkl")
    # A list that contains itself.
    with pytest.raises(U.UnsafePickleError, match="second reference"):
        U.loads(b"\x80\x04]\x94h\x00a.", "cycle.pkl")


def test_fixture_pickles_load_exactly_as_without_the_checks(shared_fixtures):
    for p in _network_info(shared_fixtures):
        checked = U.load(p)
        raw = U.TenSetUnpickler(io.BytesIO(p.read_bytes())).load()
        assert pickle.dumps(checked) == pickle.dumps(raw), p.name


def _damaged_payloads(real: bytes) -> dict[str, bytes]:
    cuts = {f"cut at {n}": real[:n] for n in (0, 1, 2, 11, 100, len(real) // 2, len(real) - 1)}
    return {
        **cuts,
        "garbage": b"\x00garbage\xff" * 20,
        "a zip": b"PK\x03\x04" + bytes(60),
        "a JSON file": b'{"tasks": []}\n',
        "trailing bytes": real + b"\x00\x00",
        "protocol 0": pickle.dumps(([], []), protocol=0),
        "protocol 5 buffer": pickle.dumps(bytearray(b"abc"), protocol=5),
        "a set": pickle.dumps(({1, 2}, []), protocol=4),
        "an unknown protocol": b"\x80\x09N.",
        "a state that is not a dict": b"\x80\x03ctvm.runtime.object\n_new_object\n"
        b"ctvm.auto_scheduler.search_task\nSearchTask\n\x85RK\x01b.",
        "a state field named like a method": b"\x80\x03ctvm.runtime.object\n_new_object\n"
        b"ctvm.target.target\nTarget\n\x85R}X\x04\x00\x00\x00kindK\x01sb.",
    }


def test_damaged_files_give_one_line_naming_the_file_and_import_nothing(shared_fixtures, tmp_path):
    real = (shared_fixtures / "tenset" / "network_info" / "((dcgan,[(1,3,64,64)]),llvm).task.pkl").read_bytes()
    before = set(sys.modules)
    for what, payload in _damaged_payloads(real).items():
        path = tmp_path / "((dcgan,[(1,3,64,64)]),llvm).task.pkl"
        path.write_bytes(payload)
        with pytest.raises(U.TaskFileError) as info:
            T.read_task_file(_task_file(path))
        msg = str(info.value)
        assert isinstance(info.value, PipelineError), what
        assert msg.startswith(str(path)) and "\n" not in msg, (what, msg)
        assert ("damaged or not a TenSet task file" in msg or "refused" in msg), (what, msg)
        assert "restore it from the TenSet archive, or leave network dcgan out" in msg, (what, msg)
    assert set(sys.modules) == before
    path.unlink()
    path.mkdir()  # not a file at all
    with pytest.raises(U.TaskFileError, match=re.escape(f"{path}: cannot read it (Is a directory)")):
        T.read_task_file(_task_file(path))


@pytest.mark.parametrize("obj, expected", [
    ({"tasks": []}, "it holds a dict, not TenSet's"),
    (([], [], []), "it holds a tuple, not TenSet's"),
    (7, "it holds an int"),
    (([1], [1]), "task 0 is an int, not a SearchTask"),
])
def test_wrong_top_level_types_are_named(tmp_path, obj, expected):
    path = tmp_path / "((net,[(1,)]),llvm).task.pkl"
    path.write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(U.DamagedPickleError, match=re.escape(expected)):
        T.read_task_file(_task_file(path))


def test_wrong_task_fields_are_named(shared_fixtures, tmp_path):
    path = tmp_path / "((dcgan,[(1,3,64,64)]),llvm).task.pkl"
    cases = [
        ({"workload_key": ["a", "b"]}, [1], "task 0: workload_key is a list, not a string"),
        ({"compute_dag": None}, [1], "task 0: compute_dag is missing"),
        ({}, ["3"], "task 0: weight '3' is not a positive integer"),
        ({}, [1, 2], "1 tasks but 2 weights"),
    ]
    for fields, weights, expected in cases:
        task = _real_task(shared_fixtures)
        task.__dict__.update(fields)
        path.write_bytes(tenset_pickle(([task], weights)))
        with pytest.raises(U.DamagedPickleError, match=re.escape(expected)):
            T.read_task_file(_task_file(path))
    # A target whose JSON graph is not TVM's.
    task = _real_task(shared_fixtures)
    task.target = copy.copy(task.target)
    task.target.handle = '{"nodes": []}'
    path.write_bytes(tenset_pickle(([task], [1])))
    with pytest.raises(U.DamagedPickleError, match=r"task 0: unreadable target \(KeyError"):
        T.read_task_file(_task_file(path))
    # A target kind named by 40 levels of 10 references to one Array node.
    task = _real_task(shared_fixtures)
    task.target = copy.copy(task.target)
    g = json.loads(task.target.handle)
    nodes = g["nodes"]
    first = len(nodes)
    nodes += [{"type_key": "Array", "data": [first + k + 1] * 10} for k in range(40)]
    nodes.append({"type_key": "runtime.String", "repr_str": "llvm"})
    kind_node = nodes[int(nodes[g["root"]]["attrs"]["kind"])]
    kind_node["attrs"]["name"] = str(first)
    task.target.handle = json.dumps(g)
    path.write_bytes(tenset_pickle(([task], [1])))
    _, err, _ = _bounded(lambda: T.read_task_file(_task_file(path)))
    assert isinstance(err, U.DamagedPickleError)
    assert "task 0: unreadable target (UnpicklingError: a target attribute expands to more than" in str(err)
    # The unmodified task still reads (the cases above fail for the reason named).
    task = _real_task(shared_fixtures)
    path.write_bytes(tenset_pickle(([task], [1])))
    (got,) = T.read_task_file(_task_file(path))
    assert got.error is None and got.workload_key == task.workload_key and got.target_kind == "llvm"


def _product_tower_graph(levels: int) -> str:
    """A ComputeDAG JSON graph: B[i] = x_levels with x_0 = A[i], x_k = x_(k-1) * x_(k-1)
    (each product names one node twice: 2^levels loads once written out)."""
    nodes = [
        {"type_key": ""},
        {"type_key": "Array", "data": [2, 8]},
        {"type_key": "Tensor", "attrs": {"op": "3", "value_index": "0"}},
        {"type_key": "PlaceholderOp", "attrs": {"name": "A", "shape": "4", "dtype": "float32", "tag": ""}},
        {"type_key": "Array", "data": [5]},
        {"type_key": "IntImm", "attrs": {"dtype": "int32", "value": "4"}},
        {"type_key": "IntImm", "attrs": {"dtype": "int32", "value": "0"}},
        {"type_key": "runtime.String", "repr_str": "i"},
        {"type_key": "Tensor", "attrs": {"op": "9", "value_index": "0"}},
        {"type_key": "ComputeOp", "attrs": {"name": "B", "tag": "", "axis": "10", "reduce_axis": "11",
                                            "body": "12"}},
        {"type_key": "Array", "data": [13]},
        {"type_key": "Array", "data": []},
        {"type_key": "Array", "data": [17 + levels]},
        {"type_key": "tir.IterVar", "attrs": {"dom": "14", "var": "15", "iter_type": "0"}},
        {"type_key": "Range", "attrs": {"min": "6", "extent": "5"}},
        {"type_key": "tir.Var", "attrs": {"name": "7", "dtype": "int32"}},
        {"type_key": "Array", "data": [15]},
        {"type_key": "tir.ProducerLoad", "attrs": {"producer": "2", "indices": "16", "dtype": "float32"}},
    ]
    for k in range(levels):  # node 17 + k is x_k
        prev = 17 + k
        nodes.append({"type_key": "tir.Mul", "attrs": {"a": str(prev), "b": str(prev), "dtype": "float32"}})
    return json.dumps({"root": 1, "nodes": nodes})


def test_a_compute_dag_of_shared_subexpressions_is_refused(shared_fixtures, tmp_path):
    task = _real_task(shared_fixtures)
    path = tmp_path / "((dcgan,[(1,3,64,64)]),llvm).task.pkl"
    for levels, ok in ((3, True), (60, False)):
        task.compute_dag = copy.copy(task.compute_dag)
        task.compute_dag.tensors = _product_tower_graph(levels)
        path.write_bytes(tenset_pickle(([task], [1])))
        got, err, _ = _bounded(lambda: T.read_task_file(_task_file(path)))
        assert err is None
        (imported,) = got
        if ok:  # the same graph, shallow: rebuilt (so the refusal below is for its size)
            assert imported.error is None, imported.error
        else:
            assert imported.dag is None and "nodes once its shared parts are written out" in imported.error


def _copy_with_a_bad_file(shared_fixtures, root: Path, payload: bytes) -> Path:
    """A TenSet copy of one real task file (dcgan, llvm) and one bad one after it."""
    info = root / "network_info"
    info.mkdir(parents=True)
    good = "((dcgan,[(1,3,64,64)]),llvm).task.pkl"
    shutil.copyfile(shared_fixtures / "tenset" / "network_info" / good, info / good)
    bad = info / "((zz_net,[(1,3,64,64)]),llvm).task.pkl"
    bad.write_bytes(payload)
    return bad


def test_stage_tasks_prints_one_line_naming_the_bad_file_and_exits_2(shared_fixtures, tmp_path):
    task = _real_task(shared_fixtures)
    task.workload_key = _shared_nest()
    bad = _copy_with_a_bad_file(shared_fixtures, tmp_path / "tenset", tenset_pickle(([task], [1])))
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "stage=tasks", "dataset=tenset", f"dataset.path={tmp_path / 'tenset'}",
         f"paths.data={tmp_path / 'data'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if "ERROR" in line]
    assert len(errors) == 1, text
    assert str(bad) in errors[0] and "refused: a second reference" in errors[0]
    assert "restore it from the TenSet archive, or leave network zz_net out" in errors[0]
    assert not (tmp_path / "data" / "tenset-llvm" / "tasks.parquet").exists()  # nothing written


def test_tenset_replay_tool_prints_one_line_for_a_bad_file(shared_fixtures, tmp_path, capsys):
    bad = _copy_with_a_bad_file(shared_fixtures, tmp_path / "tenset", b"\x80\x04\x95garbage")
    records = tmp_path / "records.json"
    records.write_text("")
    assert tenset_tool.main(["replay", str(records), "--tenset", str(tmp_path / "tenset")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}: damaged or not a TenSet task file")
