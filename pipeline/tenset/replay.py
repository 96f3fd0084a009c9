"""Replay Ansor transform steps on a `tvm.s_tir.Schedule`.

Ansor (TVM <= 0.15) schedules a TE ComputeDAG by a list of steps that name stages by
index (the DAG's stage order, see `graph.ansor_stage_order`, with cache/rfactor stages
inserted as the steps run) and iterators by index within a stage. Here each stage is an
s_tir block of the PrimFunc built from the same DAG, and each iterator a LoopRV (or None
for a unit loop that s_tir does not materialise), so a TenSet program becomes a schedule
that today's TVM compiles.

TE and s_tir differ in one place that matters: TE's `compute_at` keeps the producer's own
(split, reordered) loops and shrinks them; s_tir's regenerates them. Ansor's tiled
producers are attached to consumers that follow their tiling (FSP), so such a
`compute_at` is replayed as s_tir's `reverse_compute_at` of the consumer into the
producer's loop (the loops above the attach point are the same in both). An untouched
producer (a cache-read stage) takes s_tir's `compute_at`. TE's implicit storage scopes
(a stage attached under threadIdx lives in "local", under blockIdx in "shared") are set
explicitly at the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# IteratorAnnotation of auto_scheduler/transform_step.cc.
_UNROLL, _VECTORIZE, _PARALLEL = 1, 2, 3
_THREAD_TAGS = {4: "vthread.x", 5: "blockIdx.x", 6: "threadIdx.x", 7: "blockIdx.y",
                8: "threadIdx.y", 9: "blockIdx.z", 10: "threadIdx.z"}
SUPPORTED_STEPS = ("SP", "FSP", "FFSP", "RE", "FU", "AN", "PR", "CA", "CI", "CR", "CHR", "CHW", "RF", "SA")


class ReplayError(RuntimeError):
    """A step cannot be replayed; the message names the step."""


@dataclass
class _Stage:
    name: str
    block: object | None  # SBlockRV; None for a placeholder
    buffer: object | None  # the buffer the stage writes (placeholder: the parameter)
    iters: list = field(default_factory=list)  # LoopRV | None, Ansor's iterator order
    transformed: bool = False  # loop structure changed by SP/FSP/FFSP/RE/FU
    attached: bool = False
    inlined: bool = False
    scope: str | None = None  # explicit storage scope (cache stages)


class Replayer:
    """Applies Ansor steps one by one; `bind_threads=False` replays GPU programs as
    serial loops (same loop nest and caches, runnable on a CPU for a numerics check)."""

    def __init__(self, func, ops, bind_threads: bool = True):
        import tvm
        from tvm.s_tir import Schedule

        self.sch = Schedule(tvm.IRModule({"main": func}))
        self.bind_threads = bind_threads
        self.steps: list = []
        params = {str(b.name): b for b in func.params}
        self.stages: list[_Stage] = []
        for op in ops:
            name = str(op.name)
            if type(op).__name__ == "PlaceholderOp":
                if name not in params:
                    raise ReplayError(f"placeholder {name!r} is not a parameter of the PrimFunc")
                self.stages.append(_Stage(name, None, params[name]))
            else:
                block = self.sch.get_sblock(name)
                self.stages.append(_Stage(name, block, self.sch.get(block).writes[0].source,
                                          list(self.sch.get_loops(block))))

    # -- entry -------------------------------------------------------------------------
    def apply(self, steps: list) -> "Replayer":
        for i, step in enumerate(steps):
            self.steps.append(step)
            kind = step[0]
            fn = getattr(self, f"_step_{kind}", None)
            if fn is None:
                raise ReplayError(f"step {i} {step!r}: step kind {kind} is not supported")
            try:
                fn(*step[1:])
            except ReplayError as e:
                raise ReplayError(f"step {i} {step!r}: {e}") from None
            except Exception as e:  # noqa: BLE001 - s_tir schedule errors: name the step
                msg = str(e).strip().splitlines()
                raise ReplayError(f"step {i} {step!r}: {type(e).__name__}: {msg[-1] if msg else ''}") from None
        return self

    def finish(self, target_kind: str):
        """Storage scopes TE would have inferred; returns the schedule."""
        if target_kind == "cuda" and self.bind_threads:
            self._infer_scopes()
        return self.sch

    # -- helpers -----------------------------------------------------------------------
    def _stage(self, sid) -> _Stage:
        try:
            st = self.stages[int(sid)]
        except IndexError:
            raise ReplayError(f"stage {sid} does not exist ({len(self.stages)} stages)") from None
        return st

    def _compute(self, sid) -> _Stage:
        st = self._stage(sid)
        if st.block is None:
            raise ReplayError(f"stage {sid} ({st.name}) is a placeholder")
        if st.inlined:
            raise ReplayError(f"stage {sid} ({st.name}) was inlined")
        return st

    def _iter(self, st: _Stage, iid):
        try:
            return st.iters[int(iid)]
        except IndexError:
            raise ReplayError(f"stage {st.name} has {len(st.iters)} iterators, not {iid}") from None

    def _extent(self, loop) -> int | None:
        if loop is None:
            return 1
        ext = self.sch.get(loop).extent
        return int(ext.value) if hasattr(ext, "value") else None

    def _same_loop(self, a, b) -> bool:
        return self.sch.get(a).same_as(self.sch.get(b))

    def _loops_under(self, block, loop) -> list:
        loops = list(self.sch.get_loops(block))
        for j, lp in enumerate(loops):
            if self._same_loop(lp, loop):
                return loops[j + 1:]
        raise ReplayError("the attach loop is not an ancestor of the block")

    def _split(self, sid, iid, lengths, inner_to_outer):
        st = self._compute(sid)
        loop = self._iter(st, iid)
        if any(x is None for x in lengths):
            raise ReplayError("split with an unknown (null) length")
        lengths = [int(x) for x in lengths]
        if loop is None:
            new = [None] * (len(lengths) + 1)
        else:
            factors = [None, *lengths] if inner_to_outer else [*lengths, None]
            new = list(self.sch.split(loop, factors=factors, preserve_unit_iters=True))
        i = int(iid)
        st.iters[i:i + 1] = new
        st.transformed = True

    def _src_split(self, step_id) -> list:
        try:
            src = self.steps[int(step_id)]
        except IndexError:
            raise ReplayError(f"followed step {step_id} does not exist") from None
        if src[0] != "SP":
            raise ReplayError(f"followed step {step_id} is {src[0]}, not SP")
        return src[4]

    # -- steps on one stage ------------------------------------------------------------
    def _step_SP(self, sid, iid, extent, lengths, inner_to_outer):
        self._split(sid, iid, lengths, bool(inner_to_outer))

    def _step_FSP(self, sid, iid, src_step_id, n_split):
        src = self._src_split(src_step_id)
        n_split = int(n_split)
        if n_split > len(src) + 1:
            raise ReplayError(f"n_split {n_split} exceeds the followed split's {len(src) + 1} parts")
        lengths = list(src[: n_split - 1])
        rest = src[n_split - 1:]
        last = 1
        for x in rest:
            if x is None:
                last = None
                break
            last *= int(x)
        lengths.append(last)
        self._split(sid, iid, lengths, True)

    def _step_FFSP(self, sid, iid, src_step_ids, level, factor_or_nparts):
        length = 1
        for s in src_step_ids:
            v = self._src_split(s)[int(level)]
            if v is None:
                length = None
                break
            length *= int(v)
        self._split(sid, iid, [length], bool(factor_or_nparts))

    def _step_RE(self, sid, after_ids):
        st = self._compute(sid)
        if sorted(int(x) for x in after_ids) != list(range(len(st.iters))):
            raise ReplayError(f"reorder {after_ids} is not a permutation of {len(st.iters)} iterators")
        st.iters = [st.iters[int(x)] for x in after_ids]
        real = [x for x in st.iters if x is not None]
        if len(real) > 1:
            self.sch.reorder(*real)
        st.transformed = True

    def _step_FU(self, sid, fused_ids):
        st = self._compute(sid)
        ids = [int(x) for x in fused_ids]
        if not ids:
            raise ReplayError("fuse of no iterators")
        if ids != list(range(ids[0], ids[-1] + 1)):
            raise ReplayError(f"fuse of non-consecutive iterators {ids}")
        loops = [self._iter(st, i) for i in ids]
        real = [x for x in loops if x is not None]
        fused = self.sch.fuse(*real, preserve_unit_iters=True) if len(real) > 1 else (real[0] if real else None)
        st.iters[ids[0]:ids[-1] + 1] = [fused]
        st.transformed = True

    def _step_AN(self, sid, iid, ann):
        st = self._compute(sid)
        loop = self._iter(st, iid)
        ann = int(ann)
        if ann == 0:
            return
        if loop is None:
            if ann in _THREAD_TAGS and self.bind_threads:
                raise ReplayError("thread binding of a unit iterator of an attached stage")
            return  # unroll/vectorize/parallel of a unit loop: nothing to do
        if ann == _UNROLL:
            self.sch.unroll(loop)
        elif ann == _VECTORIZE:
            self.sch.vectorize(loop)
        elif ann == _PARALLEL:
            self.sch.parallel(loop)
        elif ann in _THREAD_TAGS:
            if self.bind_threads:
                self.sch.bind(loop, _THREAD_TAGS[ann])
        elif ann == 11:
            raise ReplayError("tensorize annotations are not supported")
        else:
            raise ReplayError(f"unknown annotation {ann}")

    def _step_PR(self, sid, iid, pragma):
        st = self._compute(sid)
        pragma = str(pragma)
        if pragma == "debug_skip_region":
            return
        if not pragma.startswith("auto_unroll_max_step"):
            raise ReplayError(f"pragma {pragma!r} is not supported")
        value = int(pragma.split("$", 1)[1])
        # TE puts the pragma on the stage's iterator; a unit iterator of an attached stage
        # stands for the first real loop below it.
        i = int(iid)
        if i >= len(st.iters):
            return  # as in TE: a pragma past the last iterator is dropped
        loop = next((x for x in st.iters[i:] if x is not None), None)
        if loop is None:
            return
        self.sch.annotate(loop, "pragma_auto_unroll_max_step", value)
        self.sch.annotate(loop, "pragma_unroll_explicit", 1)

    def _step_SA(self, sid, iid, factor, offset):
        st = self._compute(sid)
        self.sch.storage_align(st.block, 0, int(iid), int(factor), int(offset))

    # -- steps on several stages -------------------------------------------------------
    def _step_CI(self, sid):
        st = self._compute(sid)
        self.sch.compute_inline(st.block)
        st.inlined = True
        st.iters = []

    def _step_CR(self, sid):
        st = self._compute(sid)
        if st.attached:
            raise ReplayError("compute_root of an attached stage has no s_tir counterpart here")

    def _step_CA(self, sid, target_sid, target_iid):
        prod = self._compute(sid)
        cons = self._compute(target_sid)
        k = int(target_iid)
        if k >= len(cons.iters):
            raise ReplayError(f"target stage {cons.name} has {len(cons.iters)} iterators, not {k}")
        if prod.transformed:
            self._follow_compute_at(prod, cons, k)
        else:
            loop = cons.iters[k]
            if loop is None:
                raise ReplayError("compute_at a unit iterator of an attached stage")
            n = len(prod.iters)
            self.sch.compute_at(prod.block, loop, preserve_unit_loops=True)
            new = self._loops_under(prod.block, loop)
            if len(new) != n:
                raise ReplayError(f"compute_at gave {len(new)} loops for {prod.name}, expected {n}")
            prod.iters = self._in_ansor_order(prod.block, new)
        prod.attached = True

    def _follow_compute_at(self, prod: _Stage, cons: _Stage, k: int):
        """A tiled producer attached to a consumer that follows its tiling: the consumer
        moves under the producer's loop k (s_tir reverse_compute_at); both then share
        loops 0..k, which in TE terms are the consumer's, the producer's becoming unit."""
        if k >= len(prod.iters):
            raise ReplayError(f"producer {prod.name} has {len(prod.iters)} iterators, the attach point is {k}")
        for i in range(k + 1):
            a, b = prod.iters[i], cons.iters[i]
            if a is None or b is None or self._extent(a) != self._extent(b):
                raise ReplayError(
                    f"consumer {cons.name} does not follow the tiling of {prod.name} above iterator {k} "
                    f"(iterator {i}: extents {self._extent(a)} vs {self._extent(b)})")
        rest = [self._extent(x) for x in cons.iters[k + 1:]]
        self.sch.reverse_compute_at(cons.block, prod.iters[k], preserve_unit_loops=True)
        new = self._loops_under(cons.block, prod.iters[k])
        got = [self._extent(x) for x in new]
        if len(new) != len(rest):
            raise ReplayError(f"consumer {cons.name}: {len(new)} loops under the attach point, Ansor has {len(rest)}")
        cons.iters = prod.iters[: k + 1] + new
        prod.iters = [None] * (k + 1) + prod.iters[k + 1:]
        if got != rest:
            log.debug("consumer %s inner extents %s differ from Ansor's %s", cons.name, got, rest)

    def _step_CHR(self, sid, scope, reader_ids):
        st = self._stage(sid)
        readers = [self._compute(r) for r in reader_ids]
        if not readers:
            raise ReplayError("cache_read without readers")
        blk = readers[0].block
        reads = self.sch.get(blk).reads
        idx = next((i for i, r in enumerate(reads) if r.source.same_as(st.buffer)), None)
        if idx is None:
            raise ReplayError(f"{readers[0].name} does not read {st.name}")
        consumers = [r.block for r in readers] if len(readers) > 1 else None
        new = self.sch.cache_read(blk, idx, str(scope), consumer_blocks=consumers)
        nvars = len(self.sch.get(new).iter_vars)
        loops = list(self.sch.get_loops(new))[-nvars:] if nvars else []
        stage = _Stage(f"{st.name}.{scope}", new, self.sch.get(new).writes[0].source, loops, scope=str(scope))
        self.stages.insert(int(sid) + 1, stage)

    def _step_CHW(self, sid, scope):
        st = self._compute(sid)
        if st.transformed or st.attached:
            raise ReplayError("cache_write after the stage was transformed")
        copy = self.sch.cache_write(st.block, 0, str(scope))
        compute = _Stage(f"{st.name}.{scope}", st.block, self.sch.get(st.block).writes[0].source,
                         list(self.sch.get_loops(st.block)), scope=str(scope))
        out = _Stage(st.name, copy, self.sch.get(copy).writes[0].source, list(self.sch.get_loops(copy)))
        self.stages[int(sid)] = out
        self.stages.insert(int(sid), compute)

    def _step_RF(self, sid, iid, factor_iter_id):
        """rfactor: the new stage (inserted at sid) iterates the original spatial axes with
        the factored reduce iterator inserted at `factor_iter_id`, then the remaining
        reduce iterators; the original stage (now sid+1) writes back over the factor."""
        st = self._compute(sid)
        if st.attached:
            raise ReplayError("rfactor of an attached stage")
        loop = self._iter(st, iid)
        if loop is None:
            raise ReplayError("rfactor of a unit iterator")
        kinds = self._loop_kinds(st.block, st.iters)
        if kinds[int(iid)] != "R":
            raise ReplayError(f"iterator {iid} of {st.name} is not a reduction iterator")
        spatial = [lp for lp, k in zip(st.iters, kinds) if k == "S"]
        reduce = [lp for i, (lp, k) in enumerate(zip(st.iters, kinds)) if k == "R" and i != int(iid)]
        if len(spatial) + len(reduce) + 1 != len(st.iters):
            raise ReplayError(f"rfactor of {st.name}, whose iterators mix spatial and reduce axes")
        f = int(factor_iter_id)
        pos = {id(lp): j for j, lp in enumerate(st.iters)}
        rf = self.sch.rfactor(loop, f)
        # s_tir rebuilds the loop nest around the rfactor block with the same structure.
        new = list(self.sch.get_loops(rf))
        if len(new) != len(st.iters):
            raise ReplayError(f"rfactor gave {len(new)} loops, {st.name} had {len(st.iters)}")
        at = lambda lp: new[pos[id(lp)]]  # noqa: E731
        rf_stage = _Stage(f"{st.name}.rf", rf, self.sch.get(rf).writes[0].source,
                          [at(x) for x in spatial[:f]] + [at(loop)] + [at(x) for x in spatial[f:]]
                          + [at(x) for x in reduce])
        wb = _Stage(st.name, st.block, st.buffer,
                    self._in_ansor_order(st.block, list(self.sch.get_loops(st.block))))
        self.stages[int(sid)] = wb
        self.stages.insert(int(sid), rf_stage)

    def _in_ansor_order(self, block, loops: list) -> list:
        """Fresh loops of a block (one per block var) in the order Ansor gives a fresh
        stage's iterators: spatial axes, then reduce axes. s_tir puts an rfactor
        write-back's reduce var first; such loops are reordered to match."""
        from tvm.tirx.analysis import undefined_vars

        realize = self._realize(block)
        rank = {}
        for i, (iv, val) in enumerate(zip(self.sch.get(block).iter_vars, realize.iter_values)):
            key = (int(iv.iter_type) == 2, i)
            for v in undefined_vars(val):
                rank.setdefault(v, key)
        keys = [rank.get(self.sch.get(lp).loop_var, (False, -1)) for lp in loops]
        order = sorted(range(len(loops)), key=lambda j: (keys[j], j))
        if order != list(range(len(loops))):
            self.sch.reorder(*[loops[j] for j in order])
        return [loops[j] for j in order]

    def _loop_kinds(self, block, loops) -> list[str]:
        """'S' / 'R' / 'M' (mixed) for each loop: the kinds of the block vars it binds."""
        from tvm.tirx.analysis import undefined_vars

        realize = self._realize(block)
        ivars = self.sch.get(block).iter_vars
        used: dict = {}
        for iv, val in zip(ivars, realize.iter_values):
            kind = "R" if int(iv.iter_type) == 2 else "S"
            for v in undefined_vars(val):
                used.setdefault(v, set()).add(kind)
        out = []
        for lp in loops:
            if lp is None:
                out.append("S")
                continue
            k = used.get(self.sch.get(lp).loop_var, {"S"})
            out.append(k.pop() if len(k) == 1 else "M")
        return out

    def _realize(self, block):
        from tvm.s_tir import SBlockRealize

        loops = self.sch.get_loops(block)
        if not loops:
            raise ReplayError("a block without loops")
        target = self.sch.get(block)
        todo = [self.sch.get(loops[-1]).body]
        while todo:
            s = todo.pop()
            if isinstance(s, SBlockRealize):
                if s.block.same_as(target):
                    return s
                continue
            if hasattr(s, "seq"):
                todo.extend(s.seq)
            elif hasattr(s, "body"):
                todo.append(s.body)
        raise ReplayError("the block's realize was not found under its loop")

    # -- end ---------------------------------------------------------------------------
    def _infer_scopes(self):
        """TE's default scope for an attached intermediate stage: "local" under threadIdx
        or vthread, "shared" under blockIdx only."""
        outputs = list(self.sch.mod["main"].params)
        for st in self.stages:
            if st.block is None or st.inlined or st.scope is not None or not st.attached:
                continue
            buf = self.sch.get(st.block).writes[0].source
            if any(buf.same_as(b) for b in outputs):
                continue
            tags = []
            for lp in self.sch.get_loops(st.block):
                tb = self.sch.get(lp).thread_binding
                if tb is not None:
                    tags.append(str(tb.thread_tag))
            if any(t.startswith(("threadIdx", "vthread")) for t in tags):
                self.sch.set_scope(st.block, 0, "local")
            elif any(t.startswith("blockIdx") for t in tags):
                self.sch.set_scope(st.block, 0, "shared")


def replay(func, ops, steps, target_kind: str, bind_threads: bool = True):
    """The s_tir Schedule of `func` (built from the DAG whose stage order is `ops`) after
    Ansor's `steps`; raises ReplayError naming the first step that cannot be replayed."""
    return Replayer(func, ops, bind_threads=bind_threads).apply(steps).finish(target_kind)
