"""TenSet's task pickles load only through an allowlist; anything else is refused."""

from __future__ import annotations

import pickle
import pickletools
import sys

import pytest

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


def test_plain_data_still_loads():
    assert U.loads(pickle.dumps(([], []))) == ([], [])
    assert U.loads(pickle.dumps({"a": [1, 2.5, "x", (None, True)]})) == {"a": [1, 2.5, "x", (None, True)]}
