"""Evaluate a TenSet ComputeDAG's JSON graph with NumPy, without TVM.

An independent reference for the TE rebuild in `graph`: both read the same JSON nodes,
but this one computes the tensors directly (vectorised over each op's index space), so
a mistake in the rebuild (an operator's semantics, an index, a reduction) shows up as a
numerical difference. Meant for small tasks: the work is the full iteration space.
"""

from __future__ import annotations

import math

import numpy as np

_F32_MAX = 3.4028234663852886e38


class EvalError(ValueError):
    pass


def _np_dtype(d: str):
    if d == "bool":
        return np.bool_
    return np.dtype(d)


def _truncdiv(a, b):
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
    return q + fix


class _Eval:
    def __init__(self, graph: dict, max_elems: int):
        self.nodes = graph["nodes"]
        self.values: dict[int, np.ndarray] = {}  # op node -> outputs
        self.max_elems = max_elems

    def node(self, ref):
        return self.nodes[int(ref)]

    def arr(self, ref):
        return [int(x) for x in self.node(ref).get("data", [])]

    def const(self, ref) -> int:
        n = self.node(ref)
        if n["type_key"] != "IntImm":
            v = self.expr(ref, {})
            return int(np.asarray(v).item())
        return int(n["attrs"]["value"])

    # -- tensors ---------------------------------------------------------------------
    def tensor(self, ref):
        n = self.node(ref)
        op_ref = int(n["attrs"]["op"])
        if op_ref not in self.values:
            saved = getattr(self, "full", None)  # a producer is evaluated inside a consumer
            self.values[op_ref] = self.op(op_ref)
            self.full = saved
        return self.values[op_ref][int(n["attrs"]["value_index"])]

    def op(self, ref):
        n = self.node(ref)
        if n["type_key"] == "PlaceholderOp":
            raise EvalError("placeholder without an input value")
        if n["type_key"] != "ComputeOp":
            raise EvalError(f"unsupported op {n['type_key']}")
        a = n["attrs"]
        ext, var_of = [], []
        for r in self.arr(a["axis"]):
            iv = self.node(r)["attrs"]
            dom = self.node(iv["dom"])["attrs"]
            ext.append((self.const(dom["min"]), self.const(dom["extent"])))
            var_of.append(int(iv["var"]))
        shape, nd = [e for _, e in ext], len(ext)
        # Reduce bounds may be written in the spatial vars (adaptive pooling) while being
        # constant: evaluate them over the whole space and require one value.
        senv = {v: np.arange(lo, lo + e).reshape([1] * d + [-1] + [1] * (nd - d - 1))
                for d, ((lo, e), v) in enumerate(zip(ext, var_of))}
        rext, rvar = [], []
        for r in self.arr(a["reduce_axis"]):
            iv = self.node(r)["attrs"]
            dom = self.node(iv["dom"])["attrs"]
            bounds = []
            for key in ("min", "extent"):
                vals = np.unique(np.asarray(self.expr(dom[key], senv)))
                if vals.size != 1:
                    raise EvalError("a reduction bound varies with the output index")
                bounds.append(int(vals[0]))
            rext.append(tuple(bounds))
            rvar.append(int(iv["var"]))
        nr = len(rext)
        bodies = self.arr(a["body"])
        results = [np.empty(shape, dtype=_np_dtype(self.node(b)["attrs"]["dtype"])) for b in bodies]
        # Chunk the largest spatial axis so that one chunk's iteration space stays small.
        rsize = int(np.prod([e for _, e in rext])) if rext else 1
        total = int(np.prod(shape)) if shape else 1
        cdim = int(np.argmax(shape)) if shape else None
        step = shape[cdim] if shape else 1
        while shape and step > 1 and (total // shape[cdim]) * step * rsize > self.max_elems:
            step = max(1, step // 2)
        for s in (range(0, shape[cdim], step) if shape else [0]):
            env, sub = {}, list(shape)
            for d, ((lo, e), v) in enumerate(zip(ext, var_of)):
                rng = np.arange(lo + s, lo + min(s + step, e)) if d == cdim else np.arange(lo, lo + e)
                sub[d] = len(rng)
                env[v] = rng.reshape([1] * d + [-1] + [1] * (nd - d - 1) + [1] * nr)
            for j, ((lo, e), v) in enumerate(zip(rext, rvar)):
                env[v] = np.arange(lo, lo + e).reshape([1] * nd + [1] * j + [-1] + [1] * (nr - j - 1))
            self.full = tuple(sub) + tuple(e for _, e in rext)
            idx = tuple(slice(s, s + sub[d]) if d == cdim else slice(None) for d in range(nd))
            for k, b in enumerate(bodies):
                val = self.expr(b, env, nd=nd, nr=nr)
                results[k][idx] = np.broadcast_to(val, sub).astype(results[k].dtype, copy=False)
        return results

    # -- expressions -----------------------------------------------------------------
    def expr(self, ref, env, nd=0, nr=0):
        n = self.node(ref)
        k = n["type_key"]
        a = n.get("attrs", {})
        dt = a.get("dtype")
        E = lambda r: self.expr(r, env, nd, nr)  # noqa: E731
        if k == "IntImm":
            return np.array(int(a["value"]), dtype=_np_dtype(dt))
        if k == "FloatImm":
            v = float(a["value"])
            if math.isfinite(v) and abs(v) >= _F32_MAX * (1 - 1e-6):
                fi = np.finfo(_np_dtype(dt))
                v = fi.max if v > 0 else fi.min
            return np.array(v, dtype=_np_dtype(dt))
        if k == "tir.Var":
            if int(ref) not in env:
                raise EvalError("free variable")
            return env[int(ref)]
        if k == "tir.ProducerLoad":
            t = self.tensor(a["producer"])
            idx = [np.asarray(E(i)).astype(np.int64) for i in self.arr(a["indices"])]
            idx = [np.clip(i, 0, t.shape[d] - 1) for d, i in enumerate(idx)]
            return t[tuple(idx)] if idx else t[()]
        bin_ops = {
            "tir.Add": np.add, "tir.Sub": np.subtract, "tir.Mul": np.multiply,
            "tir.Min": np.minimum, "tir.Max": np.maximum, "tir.EQ": np.equal, "tir.NE": np.not_equal,
            "tir.LT": np.less, "tir.LE": np.less_equal, "tir.GT": np.greater, "tir.GE": np.greater_equal,
            "tir.And": np.logical_and, "tir.Or": np.logical_or,
        }
        if k in bin_ops:
            return bin_ops[k](E(a["a"]), E(a["b"]))
        if k in ("tir.Div", "tir.Mod", "tir.FloorDiv", "tir.FloorMod"):
            x, y = E(a["a"]), E(a["b"])
            isf = np.issubdtype(np.result_type(x, y), np.floating)
            if k == "tir.Div":
                return np.divide(x, y) if isf else _truncdiv(x, y)
            if k == "tir.Mod":
                return np.fmod(x, y) if isf else x - y * _truncdiv(x, y)
            if k == "tir.FloorDiv":
                return np.floor(np.divide(x, y)) if isf else np.floor_divide(x, y)
            return x - np.floor(np.divide(x, y)) * y if isf else np.remainder(x, y)
        if k == "tir.Not":
            return np.logical_not(E(a["a"]))
        if k == "tir.Select":
            return np.where(E(a["condition"]), E(a["true_value"]), E(a["false_value"]))
        if k == "tir.Cast":
            return np.asarray(E(a["value"])).astype(_np_dtype(dt))
        if k == "tir.Call":
            name = self.node(a["op"]).get("repr_str", "")
            args = [E(x) for x in self.arr(a["args"])]
            return self.call(name, args, dt)
        if k == "tir.Reduce":
            return self.reduce(n, env, nd, nr)
        raise EvalError(f"unsupported node {k}")

    def call(self, name, args, dt):
        base = name.split(".")[-1]
        if base == "if_then_else":
            return np.where(args[0], args[1], args[2])
        unary = {"exp": np.exp, "tanh": np.tanh, "sqrt": np.sqrt, "log": np.log, "fabs": np.abs,
                 "floor": np.floor, "ceil": np.ceil, "round": np.round, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
                 "rsqrt": lambda x: 1 / np.sqrt(x)}
        if base in unary:
            return unary[base](args[0]).astype(_np_dtype(dt))
        if base == "erf":
            from scipy.special import erf

            return erf(args[0]).astype(_np_dtype(dt))
        if base == "pow":
            return np.power(args[0], args[1]).astype(_np_dtype(dt))
        raise EvalError(f"unsupported intrinsic {name}")

    def reduce(self, n, env, nd, nr):
        a = n["attrs"]
        comb = self.node(a["combiner"])["attrs"]
        results = self.arr(comb["result"])
        if len(results) != 1:
            raise EvalError("multi-value reductions are not supported")
        kind = self.node(results[0])["type_key"]
        src = np.asarray(self.expr(self.arr(a["source"])[0], env))
        ident = np.asarray(self.expr(self.arr(comb["identity_element"])[0], {}))
        if int(a["condition"]):
            src = np.where(self.expr(a["condition"], env), src, ident)
        src = np.broadcast_to(src, self.full)  # every reduce point counts, even if unused
        fn = {"tir.Add": np.sum, "tir.Max": np.max, "tir.Min": np.min, "tir.Mul": np.prod}.get(kind)
        if fn is None:
            raise EvalError(f"unsupported combiner {kind}")
        axes = tuple(range(nd, nd + nr))
        return (fn(src, axis=axes) if axes else src).astype(src.dtype)


def evaluate(graph: dict, inputs: list[np.ndarray], max_elems: int = 1 << 22) -> list[np.ndarray]:
    """Outputs of the DAG (tensors of the root Array that are not placeholders), given the
    placeholders' values in root order."""
    ev = _Eval(graph, max_elems)
    root = ev.arr(graph["root"])
    it = iter(inputs)
    outs = []
    for r in root:
        tn = ev.node(r)
        op_ref = int(tn["attrs"]["op"])
        if ev.node(op_ref)["type_key"] == "PlaceholderOp":
            ev.values[op_ref] = [np.asarray(next(it))]
    for r in root:
        tn = ev.node(r)
        if ev.node(int(tn["attrs"]["op"]))["type_key"] != "PlaceholderOp":
            outs.append(ev.tensor(r))
    return outs
