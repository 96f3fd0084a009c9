"""A restricted Unpickler for TenSet's task pickles.

TenSet pickled TVM 0.8 objects: each is stored as `(_new_object, (cls,), state)` where
`state` holds TVM's JSON graph of the object. Pickles from outside are untrusted, so
this Unpickler resolves only the handful of TVM names TenSet uses, and maps each to a
small stand-in class defined here: the named modules are never imported (TVM 0.27 has
no `tvm.auto_scheduler` anyway). Any other global is refused.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

from pipeline.core.errors import PipelineError


class UnsafePickleError(pickle.UnpicklingError, PipelineError):
    """The pickle names a global outside the allowlist."""


class TVMObject:
    """Stand-in for a pickled TVM object: keeps its state (TVM JSON graphs as text)."""

    type_name = "Object"

    def __setstate__(self, state):
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"{self.type_name}: expected a dict state, got {type(state).__name__}")
        self.__dict__.update(state)

    def __repr__(self):
        keys = ", ".join(sorted(self.__dict__))
        return f"<{self.type_name} ({keys})>"

    def json_graph(self) -> dict | None:
        """The TVM JSON graph stored under `handle` (Target, HardwareParams, Array...)."""
        h = self.__dict__.get("handle")
        return json.loads(h) if isinstance(h, str) else None


class SearchTask(TVMObject):
    type_name = "auto_scheduler.SearchTask"


class ComputeDAG(TVMObject):
    type_name = "auto_scheduler.ComputeDAG"

    def graph(self) -> dict:
        t = self.__dict__.get("tensors")
        if not isinstance(t, str):
            raise pickle.UnpicklingError("ComputeDAG without a 'tensors' JSON graph")
        return json.loads(t)


class HardwareParams(TVMObject):
    type_name = "auto_scheduler.HardwareParams"

    def params(self) -> dict:
        g = self.json_graph() or {}
        nodes = g.get("nodes", [])
        root = nodes[g.get("root", 0)] if nodes else {}
        return {k: _num(v) for k, v in root.get("attrs", {}).items()}


class Target(TVMObject):
    type_name = "Target"

    def kind(self) -> str:
        """The target kind name ("cuda", "llvm"), read from the JSON graph."""
        g = self.json_graph()
        if not g:
            raise pickle.UnpicklingError("Target without a JSON graph")
        nodes = g["nodes"]
        root = nodes[g["root"]]
        kind = nodes[int(root["attrs"]["kind"])]
        name = kind.get("attrs", {}).get("name")
        return str(_leaf(nodes, name)) if name is not None else kind.get("repr_str", "")

    def attrs(self) -> dict:
        """Target attributes (`-arch`, `-mcpu`, ...) as plain values."""
        g = self.json_graph()
        nodes = g["nodes"]
        root = nodes[g["root"]]
        amap = nodes[int(root["attrs"]["attrs"])]
        keys, out = amap.get("keys", []), {}
        data = amap.get("data", [])
        if keys:  # string-keyed Map: "keys" names, "data" values
            pairs = zip(keys, data)
        else:
            pairs = ((_leaf(nodes, data[i]), data[i + 1]) for i in range(0, len(data), 2))
        for k, v in pairs:
            out[str(k)] = _leaf(nodes, v)
        return out


class Array(TVMObject):
    type_name = "Array"


class Object(TVMObject):
    type_name = "Object"


class String(str):
    """Stand-in for tvm.runtime.container.String (a str subclass in TVM 0.8)."""

    def __setstate__(self, state):
        # NEWOBJ built the str value; the TVM handle in the state adds nothing.
        pass


def _new_object(cls):
    """TVM 0.8's `tvm.runtime.object._new_object`: an empty instance to BUILD into."""
    if not (isinstance(cls, type) and issubclass(cls, TVMObject)):
        raise UnsafePickleError(f"_new_object called with {cls!r}, which is not an allowed TVM class")
    return cls.__new__(cls)


# (module, name) -> stand-in. Nothing else may be named by a TenSet pickle.
ALLOWED = {
    ("tvm.runtime.object", "_new_object"): _new_object,
    ("tvm.runtime.object", "Object"): Object,
    ("tvm.auto_scheduler.search_task", "SearchTask"): SearchTask,
    ("tvm.auto_scheduler.search_task", "HardwareParams"): HardwareParams,
    ("tvm.auto_scheduler.compute_dag", "ComputeDAG"): ComputeDAG,
    ("tvm.target.target", "Target"): Target,
    ("tvm.ir.container", "Array"): Array,
    ("tvm.runtime.container", "String"): String,
}


class TenSetUnpickler(pickle.Unpickler):
    """Resolves only ALLOWED names, to the stand-ins above; imports nothing."""

    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load global {module}.{name}: TenSet task pickles only name "
                f"{', '.join(sorted(m + '.' + n for m, n in ALLOWED))}"
            ) from None

    def persistent_load(self, pid):
        raise UnsafePickleError(f"refusing persistent id {pid!r}")


def loads(data: bytes):
    return TenSetUnpickler(io.BytesIO(data)).load()


def load(path: str | Path):
    """Load one TenSet pickle (a task pickle or all_tasks.pkl) with the restricted Unpickler."""
    with open(path, "rb") as f:
        return TenSetUnpickler(f).load()


def _num(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v


def _leaf(nodes, ref):
    n = nodes[int(ref)]
    tk = n.get("type_key")
    if tk in ("runtime.String", "String"):
        return n.get("repr_str", "")
    if tk == "IntImm":
        return int(n["attrs"]["value"])
    if tk == "FloatImm":
        return float(n["attrs"]["value"])
    if tk == "Array":
        return [_leaf(nodes, x) for x in n.get("data", [])]
    return n
