"""Rebuild a TenSet ComputeDAG (TVM 0.8 JSON graph) as TE tensors and a PrimFunc.

TVM 0.27 refuses the 0.8 JSON format (`tvm.ir.load_json`: "Legacy json graph format"),
so the graph is decoded node by node into today's TE: placeholders, compute ops and
the TIR expressions of their bodies. `te.create_prim_func` then gives the PrimFunc that
MetaSchedule tunes. The stage order of Ansor's ComputeDAG (which Ansor's transform steps
index) is reproduced by `ansor_stage_order`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Float constants Ansor printed for the dtype's lowest / highest value (e.g. the identity
# of a max reduction): -3.402823466385289e+38 is not representable once rounded to
# float32 and TVM 0.27 rejects it, so they map back to min_value / max_value.
_F32_MAX = 3.4028234663852886e38

# Nodes of one expression once its shared subexpressions are written out, as TVM does
# when it lowers a compute (te.create_prim_func takes seconds at 2^18 and never ends at
# 2^40). TenSet's largest body (a Winograd transform) has about 500.
MAX_EXPR_NODES = 100_000


class GraphError(ValueError):
    """The JSON graph holds something this decoder cannot rebuild."""


_BINARY = {
    "tir.Add": lambda a, b: a + b,
    "tir.Sub": lambda a, b: a - b,
    "tir.Mul": lambda a, b: a * b,
}


@dataclass
class DAG:
    """A rebuilt ComputeDAG: its tensors (inputs then outputs, as Ansor stored them)."""

    tensors: list  # te.Tensor, in the order of the pickled ComputeDAG
    ops: list  # te.Operation, in Ansor's stage order

    def prim_func(self):
        from tvm import te

        return te.create_prim_func(self.tensors).with_attr("global_symbol", "main")

    def mod(self):
        import tvm

        return tvm.IRModule({"main": self.prim_func()})


class _Decoder:
    def __init__(self, graph: dict):
        self.nodes = graph["nodes"]
        self.memo: dict[int, object] = {}
        self.op_names: dict[str, int] = {}
        self.expr_memo: dict[tuple, tuple] = {}  # (ref, id(env)) -> (env, expr, expanded size)
        self.sizes: list[int] = []  # expanded sizes of the expressions being decoded

    # -- helpers ---------------------------------------------------------------------
    def node(self, ref) -> dict:
        return self.nodes[int(ref)]

    def attr(self, n: dict, key: str):
        return n.get("attrs", {}).get(key)

    def string(self, ref) -> str:
        n = self.node(ref)
        if n.get("type_key") not in ("runtime.String", "String", ""):
            raise GraphError(f"expected a String node, got {n.get('type_key')}")
        return n.get("repr_str", "")

    def array(self, ref) -> list[int]:
        n = self.node(ref)
        if n.get("type_key") != "Array":
            raise GraphError(f"expected an Array node, got {n.get('type_key')}")
        return [int(x) for x in n.get("data", [])]

    def unique_name(self, name: str) -> str:
        k = self.op_names.get(name, 0)
        self.op_names[name] = k + 1
        return name if k == 0 else f"{name}_{k}"

    # -- tensors and ops -------------------------------------------------------------
    def tensor(self, ref):
        ref = int(ref)
        if ref in self.memo:
            return self.memo[ref]
        n = self.node(ref)
        if n["type_key"] != "Tensor":
            raise GraphError(f"expected a Tensor node at {ref}, got {n['type_key']}")
        op = self.op(self.attr(n, "op"))
        t = op.output(int(self.attr(n, "value_index")))
        self.memo[ref] = t
        return t

    def op(self, ref):
        from tvm import te, tirx

        ref = int(ref)
        if ref in self.memo:
            return self.memo[ref]
        n = self.node(ref)
        kind = n["type_key"]
        name = self.unique_name(self.attr(n, "name") or "T")
        if kind == "PlaceholderOp":
            shape = [self.const_int(x) for x in self.array(self.attr(n, "shape"))]
            op = te.placeholder(shape, dtype=self.attr(n, "dtype"), name=name).op
        elif kind == "ComputeOp":
            env: dict[int, object] = {}
            axis = []
            outer, self.sizes = self.sizes, []  # a producer's expressions are not part of its consumer's
            for r in self.array(self.attr(n, "axis")):
                iv = self.itervar(r, env)
                axis.append(iv)
            for r in self.array(self.attr(n, "reduce_axis")):
                self.itervar(r, env)
            body = [self.expr(r, env) for r in self.array(self.attr(n, "body"))]
            self.sizes = outer
            from tvm.te import _ffi_api

            op = _ffi_api.ComputeOp(name, self.attr(n, "tag") or "", None, axis, body)
        else:
            raise GraphError(f"unsupported operation node {kind!r} (only PlaceholderOp, ComputeOp)")
        self.memo[ref] = op
        return op

    def itervar(self, ref, env):
        from tvm import ir, tirx

        ref = int(ref)
        n = self.node(ref)
        if n["type_key"] != "tir.IterVar":
            raise GraphError(f"expected an IterVar at {ref}, got {n['type_key']}")
        dom = self.node(self.attr(n, "dom"))
        lo = self.index(dom["attrs"]["min"], env)
        ext = self.index(dom["attrs"]["extent"], env)
        vref = int(self.attr(n, "var"))
        vn = self.node(vref)
        var = tirx.Var(self.string(vn["attrs"]["name"]) or "v", vn["attrs"]["dtype"])
        iv = tirx.IterVar(ir.Range.from_min_extent(lo, ext), var, int(self.attr(n, "iter_type")))
        env[vref] = var
        env[ref] = iv
        return iv

    def const_int(self, ref) -> int:
        n = self.node(ref)
        if n["type_key"] != "IntImm":
            raise GraphError(f"expected a constant IntImm (static shape), got {n['type_key']}")
        return int(n["attrs"]["value"])

    def index(self, ref, env) -> int:
        """An iteration bound: a constant, or an expression that folds to one
        (adaptive pooling writes `end - start` of constants)."""
        n = self.node(ref)
        if n["type_key"] == "IntImm":
            return int(n["attrs"]["value"])
        from tvm import tirx
        from tvm.sym.analyzer import Analyzer

        e = Analyzer().simplify(self.expr(ref, env))
        if not isinstance(e, tirx.IntImm):
            raise GraphError(f"iteration bound {e} is not a constant (data-dependent loop bounds are not supported)")
        return int(e.value)

    # -- expressions -----------------------------------------------------------------
    def expr(self, ref, env):
        """A TIR expression; a node the JSON graph shares is shared here too (TE built
        these bodies as DAGs, e.g. fast_erf's clamped input feeds 40 products). The size
        it has once written out as a tree is counted and bounded by MAX_EXPR_NODES."""
        ref = int(ref)
        key = (ref, id(env))
        hit = self.expr_memo.get(key)
        if hit is None or hit[0] is not env:  # the env is kept alive, so its id is not reused
            self.sizes.append(1)
            value = self._expr(ref, env)
            hit = self.expr_memo[key] = (env, value, self.sizes.pop())
        if self.sizes:
            self.sizes[-1] += hit[2]
        if hit[2] > MAX_EXPR_NODES or (self.sizes and self.sizes[-1] > MAX_EXPR_NODES):
            raise GraphError(f"an expression of more than {MAX_EXPR_NODES:,} nodes once its shared parts are "
                             f"written out (TenSet's largest has about 500)")
        return hit[1]

    def _expr(self, ref, env):
        import tvm
        from tvm import tirx

        n = self.node(ref)
        kind = n["type_key"]
        a = n.get("attrs", {})
        dtype = a.get("dtype")
        if kind == "IntImm":
            return tirx.IntImm(dtype, int(a["value"]))
        if kind == "FloatImm":
            v = float(a["value"])
            if math.isfinite(v) and abs(v) >= _F32_MAX * (1 - 1e-6) and dtype in ("float32", "float16"):
                return tirx.max_value(dtype) if v > 0 else tirx.min_value(dtype)
            return tirx.FloatImm(dtype, v)
        if kind == "tir.Var":
            if ref not in env:
                raise GraphError(f"free variable {self.string(a['name'])!r} (symbolic shapes are not supported)")
            return env[ref]
        if kind == "tir.ProducerLoad":
            t = self.tensor(a["producer"])
            idx = [self.expr(i, env) for i in self.array(a["indices"])]
            return t(*idx)
        if kind in _BINARY:
            return _BINARY[kind](self.expr(a["a"], env), self.expr(a["b"], env))
        binary = {
            "tir.Div": tirx.Div, "tir.Mod": tirx.Mod, "tir.FloorDiv": tirx.FloorDiv,
            "tir.FloorMod": tirx.FloorMod, "tir.Min": tirx.Min, "tir.Max": tirx.Max,
            "tir.EQ": tirx.EQ, "tir.NE": tirx.NE, "tir.LT": tirx.LT, "tir.LE": tirx.LE,
            "tir.GT": tirx.GT, "tir.GE": tirx.GE, "tir.And": tirx.And, "tir.Or": tirx.Or,
        }
        if kind in binary:
            return binary[kind](self.expr(a["a"], env), self.expr(a["b"], env))
        if kind == "tir.Not":
            return tirx.Not(self.expr(a["a"], env))
        if kind == "tir.Select":
            return tirx.Select(self.expr(a["condition"], env), self.expr(a["true_value"], env),
                               self.expr(a["false_value"], env))
        if kind == "tir.Cast":
            return tirx.Cast(dtype, self.expr(a["value"], env))
        if kind == "tir.Call":
            op = self.node(a["op"])
            if op["type_key"] != "Op":
                raise GraphError(f"tir.Call of a {op['type_key']} (only built-in Ops are supported)")
            args = [self.expr(x, env) for x in self.array(a["args"])]
            return tirx.call_intrin(dtype, _op(op["repr_str"]), *args)
        if kind == "tir.Reduce":
            return self.reduce(n, env)
        raise GraphError(f"unsupported expression node {kind!r}")

    def reduce(self, n, env):
        from tvm import tirx

        a = n["attrs"]
        c = self.node(a["combiner"])["attrs"]
        cenv = dict(env)
        lhs = [self._fresh_var(r, cenv) for r in self.array(c["lhs"])]
        rhs = [self._fresh_var(r, cenv) for r in self.array(c["rhs"])]
        result = [self.expr(r, cenv) for r in self.array(c["result"])]
        identity = [self.expr(r, cenv) for r in self.array(c["identity_element"])]
        combiner = tirx.CommReducer(lhs, rhs, result, identity)
        axis = []
        for r in self.array(a["axis"]):
            if int(r) not in env:
                raise GraphError("reduction over an axis the compute op does not declare")
            axis.append(env[int(r)])
        src = [self.expr(r, env) for r in self.array(a["source"])]
        cond = self.expr(a["condition"], env) if int(a["condition"]) else tirx.const(True, "bool")
        init = [self.expr(r, env) for r in self.array(a["init"])] if int(a.get("init", 0)) else []
        return tirx.Reduce(combiner, src, axis, cond, int(a["value_index"]), init or None)

    def _fresh_var(self, ref, env):
        from tvm import tirx

        n = self.node(ref)
        v = tirx.Var(self.string(n["attrs"]["name"]) or "x", n["attrs"]["dtype"])
        env[int(ref)] = v
        return v


def _op(name: str):
    """A TVM 0.8 intrinsic by today's name (`tir.exp` is `tirx.exp`, `tir.if_then_else`
    is `prim.if_then_else`)."""
    import tvm

    base = name.split(".", 1)[1] if name.startswith("tir.") else name
    for cand in (name, f"tirx.{base}", f"prim.{base}"):
        try:
            return tvm.ir.Op.get(cand)
        except Exception:  # noqa: BLE001 - not registered under this name
            continue
    raise GraphError(f"intrinsic {name!r} has no counterpart in this TVM")


def rebuild(graph: dict) -> DAG:
    """TE tensors of a ComputeDAG's JSON graph (`{"root": .., "nodes": [..]}`)."""
    dec = _Decoder(graph)
    root = dec.node(graph["root"])
    if root.get("type_key") != "Array":
        raise GraphError(f"the graph root is a {root.get('type_key')}, expected the Array of tensors")
    try:
        tensors = [dec.tensor(r) for r in root.get("data", [])]
        return DAG(tensors=tensors, ops=ansor_stage_order(tensors))
    except RecursionError:
        raise GraphError("the graph nests deeper than Python's recursion limit (or refers to itself)") from None


def ansor_stage_order(tensors) -> list:
    """Operations in the order of Ansor's ComputeDAG stages (te.create_schedule's order).

    Ansor indexes stages by this order: a post-order DFS from the output ops, visiting each
    op's input tensors in the order `ComputeOpNode::InputTensors` lists them.
    """
    ops = [t.op for t in tensors]
    consumed = set()
    for op in ops:
        for t in op.input_tensors:
            consumed.add(t.op)
    # Ansor's AccessAnalyzer lists the outputs in the inputs-first order of every op
    outputs = [op for op in _post_order(ops) if op not in consumed and op in ops and not _is_placeholder(op)]
    return _post_order(outputs)


def _is_placeholder(op) -> bool:
    return type(op).__name__ == "PlaceholderOp"


def _post_order(ops) -> list:
    """Ops reachable from `ops`, each after its inputs: a post-order DFS that starts from
    `ops` in turn and visits an op's input tensors in the order it lists them."""
    order, seen = [], set()

    def visit(op):
        if op in seen:
            return
        seen.add(op)
        for t in op.input_tensors:
            visit(t.op)
        order.append(op)

    for op in ops:
        visit(op)
    return order
