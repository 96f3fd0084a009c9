"""Real networks (pipeline.workloads.networks) split into MetaSchedule tasks.

torch.export -> Relax -> the inference passes below -> `extract_tasks`: each fused
operator that MetaSchedule would tune in this network becomes one Workload, with its
weight = how many times the network calls it.
"""

from __future__ import annotations

import logging
import time
import warnings

from pipeline.workloads import ops
from pipeline.workloads.base import Workload

log = logging.getLogger(__name__)


def network_options(dataset, name: str) -> dict:
    """Per-network constructor options taken from the dataset config."""
    if name == "bert_encoder":
        layers = int(dataset.get("bert_layers", 12) or 12)
        if layers < 1:
            raise ValueError(f"dataset.bert_layers must be >= 1, got {layers}")
        return {"layers": layers}
    return {}


def export(name: str, batch: int = 1, seed: int = 0, **options):
    """The network as a Relax IRModule with its weights bound as constants."""
    from pipeline.workloads import networks as nets  # torch: seconds to import, only for networks

    model, example = nets.build(name, batch, seed, **options)
    return from_torch(model, example)


def from_torch(model, example: tuple):
    """A torch.nn.Module and its example inputs as a Relax IRModule, weights bound as constants
    (torch.export, then TVM's importer): the path of every network, the zoo's and a user's."""
    # torch takes seconds to import and only networks need it.
    import torch
    from torch.fx.experimental import optimization
    from tvm.relax.frontend.torch import from_exported_program

    model = model.eval()
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        # Inference form: BatchNorm folded into the convolution before export, as deployed
        # models are. Folding it later in Relax gives the same tasks but costs seconds of
        # constant folding per network.
        try:
            model = optimization.fuse(model)
        except Exception:  # noqa: BLE001 - a model torch.fx cannot trace keeps its BatchNorm (Relax decomposes it)
            log.info("BatchNorm left unfolded: torch.fx cannot trace %s", type(model).__name__)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # torch-internal pytree notices
        with torch.no_grad():
            program = torch.export.export(model, tuple(example))
        try:
            return from_exported_program(program, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                         custom_convert_map=_reductions_relax_lacks())
        except AssertionError as e:  # the importer's own check: it lists every op it cannot translate
            if "Unsupported function types" not in str(e):
                raise
            raise NotImplementedError(f"{type(model).__name__}: TVM's Relax importer has no translation for "
                                      f"{str(e).partition('types ')[2]}; write them with torch ops it translates") from None


def _reductions_relax_lacks() -> dict:
    """Converters for torch reductions that have a Relax op but no entry in TVM's importer
    (`amax`, `amin`: a max that keeps no indices, where `max(dim)` goes through topk)."""
    from tvm import relax

    def reduction(op):
        def convert(node, importer):
            x = importer.env[node.args[0]]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
            keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
            axis = [dim] if isinstance(dim, int) else (list(dim) or None)
            return importer.block_builder.emit(op(x, axis, keepdim))
        return convert

    return {"amax.default": reduction(relax.op.max), "amin.default": reduction(relax.op.min)}


def fuse(mod, fold_in_numpy: bool = True):
    """Lower to fused TIR PrimFuncs: the form `extract_tasks` splits into tasks.
    `fold_in_numpy=False` leaves every constant to FoldConstant (the same tasks, slower:
    benchmarks/network_tasks.py)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm
    from tvm import relax

    T = relax.transform
    passes = [
        T.DecomposeOpsForInference(),
        # Drop the tuples torch ops leave behind (max_pool2d's indices, ...): a tuple
        # between two ops would stop FuseOps from fusing them.
        T.CanonicalizeBindings(),
        T.DeadCodeElimination(),
        *([fold_constants_in_numpy()] if fold_in_numpy else []),
        T.LegalizeOps(),
        T.AnnotateTIROpPattern(),
        T.FoldConstant(),
        T.FuseOps(),
        T.FuseTIR(),
    ]
    return tvm.transform.Sequential(passes)(mod)


def fold_constants_in_numpy():
    """A Relax pass that computes in NumPy the calls whose inputs are all constants: BatchNorm's
    arithmetic on its statistics where no convolution precedes it, bias reshapes, index tables.
    FoldConstant would compile each of them with LLVM after legalization (18 s of DenseNet-121's
    22); the module it leaves has the same tasks. FoldConstant still folds anything else."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.ir.expr import Constant

    elementwise = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
                   "relax.divide": np.divide, "relax.sqrt": np.sqrt, "relax.negative": np.negative}

    def expand_dims(a, attrs):
        for axis in sorted(int(x) for x in attrs.axis):
            a = np.expand_dims(a, axis)
        return a

    layout = {
        "relax.expand_dims": expand_dims,
        "relax.permute_dims": lambda a, attrs: np.transpose(a, None if attrs.axes is None else
                                                            [int(x) for x in attrs.axes]),
        "relax.take": lambda a, i, attrs: np.take(a, i, axis=None if attrs.axis is None else int(attrs.axis)),
    }

    @relax.expr_functor.mutator
    class Folder(relax.PyExprMutator):
        def constant(self, expr):
            if isinstance(expr, relax.Var):
                expr = self.lookup_binding(expr)
            return expr.value.numpy() if isinstance(expr, Constant) else None

        def visit_call_(self, call):
            call = super().visit_call_(call)
            name = getattr(call.op, "name", None)
            if name == "relax.arange":
                value = np.arange(*(getattr(a.value, "value", a.value) for a in call.args))
            elif name == "relax.reshape":
                data = self.constant(call.args[0])
                value = None if data is None else data.reshape([int(d) for d in call.ty.shape])
            elif name in elementwise or name in layout:
                args = [self.constant(a) for a in call.args]
                if any(a is None for a in args):
                    return call
                value = elementwise[name](*args) if name in elementwise else layout[name](*args, call.attrs)
            else:
                return call
            if value is None:
                return call
            dtype = str(call.ty.dtype)
            return relax.const(np.ascontiguousarray(value).astype(dtype), dtype)

    @tvm.transform.module_pass(opt_level=0, name="FoldConstantsInNumPy")
    def fold(mod, _ctx):
        folder = Folder()
        functions = {gv: folder.visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
        return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)

    return fold


def as_main(mod):
    """The task's module with its one PrimFunc named `main`, as MetaSchedule expects."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm
    from tvm import tirx

    if "main" in mod and isinstance(mod["main"], tirx.PrimFunc):
        return mod
    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        names = ", ".join(gv.name_hint for gv, _ in funcs)
        raise ValueError(f"a task module must hold exactly one PrimFunc, got [{names}]")
    return tvm.IRModule({"main": funcs[0][1].with_attr("global_symbol", "main")})


def network_workloads(name: str, target, batch: int = 1, seed: int = 0, **options) -> list[Workload]:
    """One Workload per task of one network."""
    return relax_workloads(export(name, batch, seed, **options), target, name, "zoo", {"batch": batch, **options})


def relax_workloads(mod, target, network: str, source: str, extra: dict | None = None) -> list[Workload]:
    """One Workload per task MetaSchedule extracts from a Relax network (weight = its calls)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(fuse(mod), target)
    return [
        Workload(name=str(t.task_name), mod=as_main(t.dispatched[0]), network=network, weight=int(t.weight),
                 source=source, extra=dict(extra or {}))
        for t in tasks
    ]


def load(dataset, target, *, seed: int = 0, **_) -> list[Workload]:
    """The tasks of `dataset.networks` (all when empty) at `dataset.batch`, weights drawn with
    `seed`, and the suite's `dataset.ops` when given."""
    from pipeline.workloads import networks as nets  # torch: seconds to import, only for dataset=zoo

    names = list(dataset.get("networks") or nets.NETWORKS)
    unknown = [n for n in names if n not in nets.NETWORKS]
    if unknown:
        raise ValueError(f"dataset.networks: unknown network(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(nets.NETWORKS)}")
    batch = int(dataset.get("batch", 1))
    if batch < 1:
        raise ValueError(f"dataset.batch must be >= 1, got {batch}")
    out = []
    for name in names:
        t0 = time.time()
        found = network_workloads(name, target, batch, seed, **network_options(dataset, name))
        log.info("zoo: %s (batch %d): %d tasks, %d calls in %.1f s", name, batch, len(found),
                 sum(w.weight for w in found), time.time() - t0)
        out.extend(found)
    if dataset.get("ops"):
        out.extend(ops.load(dataset, target))
    return out
