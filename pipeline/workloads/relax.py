"""A user's own network, named `<pkg.module:function>` (dataset=relax, tune.tasks=<spec>).

The function takes no argument and returns a Relax IRModule (its Relax function `main`,
weights bound), or a torch.nn.Module with its example inputs, `(module, (tensor, ...))`,
which is exported as the zoo's networks are (zoo.from_torch). Its tasks are extracted as
a zoo network's (zoo.relax_workloads): every later stage treats them alike. The network is
named after the function.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys
import time
from dataclasses import dataclass

from pipeline.core.errors import PipelineError
from pipeline.workloads import zoo
from pipeline.workloads.base import Workload

log = logging.getLogger(__name__)

FORM = "<pkg.module:function>"
RETURNS = ("a Relax IRModule, or a torch.nn.Module with its example inputs: `return module, (example, ...)`")


@dataclass
class OwnNetwork:
    """What the function gave: the network as Relax (weights bound, not yet fused) and the
    inputs that time it end to end (numpy arrays)."""

    name: str
    mod: object  # tvm.IRModule
    inputs: list


def is_spec(text: str) -> bool:
    """Whether `text` names a function (`pkg.module:function`) rather than a built-in name."""
    return ":" in str(text)


def _import(module: str):
    """`module`, found as Python finds it, or else in the working folder (as `python -m` would
    find it there), without changing sys.path."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name != top or top in sys.modules:
            raise
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is None or spec.loader is None:
            raise
        sys.modules[top] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[top])
        except BaseException:
            del sys.modules[top]
            raise
        return importlib.import_module(module)


def resolve(spec: str, key: str):
    """The function that `spec` names; `key` is the config key that gave it (for the message)."""
    module, _, attr = str(spec).partition(":")
    if not module or not attr or ":" in attr:
        raise PipelineError(f"{key}={spec!r}: give the function as {FORM}, e.g. {key}=mypkg.models:build")
    try:
        mod = _import(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise PipelineError(f"{key}={spec!r}: module {module!r} cannot be imported ({e}); run from the folder "
                                f"that holds it or add that folder to PYTHONPATH") from None
        raise PipelineError(f"{key}={spec!r}: importing {module!r} failed: {e}; install what it needs") from e
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing
        raise PipelineError(f"{key}={spec!r}: importing {module!r} failed ({type(e).__name__}: {e}); fix the "
                            f"module") from e
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            public = sorted(n for n, v in vars(mod).items() if inspect.isfunction(v) and v.__module__ == module
                            and not n.startswith("_"))
            raise PipelineError(f"{key}={spec!r}: module {module!r} ({getattr(mod, '__file__', '?')}) has no "
                                f"{attr!r}; its functions: {', '.join(public) or 'none'}")
    if not callable(fn):
        raise PipelineError(f"{key}={spec!r}: {attr!r} is a {type(fn).__name__}, not a function returning {RETURNS}")
    return fn


def _arrays(example, key: str, spec: str) -> list:
    """Example inputs as numpy arrays (torch tensors or arrays; a single one is one input)."""
    import numpy as np

    items = example if isinstance(example, (tuple, list)) else (example,)
    out = []
    for x in items:
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        if not isinstance(x, np.ndarray):
            raise PipelineError(f"{key}={spec!r}: an example input is a {type(x).__name__}; give torch tensors or "
                                f"numpy arrays: {RETURNS}")
        out.append(x)
    return out


def random_inputs(mod, seed: int, key: str, spec: str) -> list:
    """Inputs of the shapes and dtypes of `main`'s parameters, for an IRModule given without any."""
    import numpy as np
    from tvm import relax

    rng = np.random.default_rng(seed)
    out = []
    for p in mod["main"].params:
        ty = p.ty
        try:
            assert isinstance(ty, relax.TensorType)
            dims = [int(d) for d in ty.shape.values]
        except (AssertionError, AttributeError, TypeError):
            raise PipelineError(f"{key}={spec!r}: `main`'s parameter {p.name} is not a tensor of static shape "
                                f"({ty}); return the module with example inputs: `return mod, (array, ...)`") from None
        out.append(rng.standard_normal(dims).astype(str(ty.dtype)))
    return out


def load_network(spec: str, key: str, seed: int = 0, inputs: bool = True) -> OwnNetwork:
    """Call the function `spec` names and check what it returned; `inputs=False`: an IRModule
    given without example inputs gets none (only timing the network end to end needs them)."""
    import tvm
    from tvm import relax

    fn = resolve(spec, key)
    name = str(spec).partition(":")[2].split(".")[-1]
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - the user's function failed
        raise PipelineError(f"{key}={spec!r}: calling {name}() failed ({type(e).__name__}: {e}); it must take no "
                            f"argument and return {RETURNS}") from e
    mod, example = (got[0], got[1]) if isinstance(got, (tuple, list)) and len(got) == 2 else (got, None)
    if not isinstance(mod, tvm.IRModule):
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(mod, torch.nn.Module):
            raise PipelineError(f"{key}={spec!r}: {name}() returned a {type(got).__name__}; return {RETURNS}")
        if example is None:
            raise PipelineError(f"{key}={spec!r}: {name}() returned a torch.nn.Module without example inputs; "
                                f"return `module, (example, ...)`")
        inputs = _arrays(example, key, spec)
        try:
            mod = zoo.from_torch(mod, tuple(torch.as_tensor(x) for x in inputs))
        except Exception as e:  # noqa: BLE001 - torch.export or the importer refused the model
            raise PipelineError(f"{key}={spec!r}: torch.export / Relax import of {name}()'s module failed "
                                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); export it "
                                f"yourself and return the Relax IRModule") from e
        return OwnNetwork(name, mod, inputs)
    if "main" not in mod or not isinstance(mod["main"], relax.Function):
        raise PipelineError(f"{key}={spec!r}: {name}()'s IRModule has no Relax function `main`; return {RETURNS}")
    if example is not None:
        return OwnNetwork(name, mod, _arrays(example, key, spec))
    return OwnNetwork(name, mod, random_inputs(mod, seed, key, spec) if inputs else [])


def load(dataset, target, **_) -> list[Workload]:
    """The tasks of the network that `dataset.module` (pkg.module:function) returns."""
    spec = dataset.get("module")
    if not spec:
        raise PipelineError(f"dataset=relax needs dataset.module={FORM}: a function returning {RETURNS}")
    t0 = time.time()
    net = load_network(str(spec), "dataset.module", inputs=False)
    found = zoo.relax_workloads(net.mod, target, net.name, "relax", {"module": str(spec)})
    if not found:
        raise PipelineError(f"dataset.module={spec!r}: MetaSchedule finds no task to tune in {net.name}()'s network")
    log.info("relax: %s: %d tasks, %d calls in %.1f s", spec, len(found), sum(w.weight for w in found),
             time.time() - t0)
    return found
