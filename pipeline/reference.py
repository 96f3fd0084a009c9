"""Reference results: the unscheduled workload, built for the host CPU, on fixed inputs.

Saved per task as `references/<task_id>.npz` with `in<i>` (arguments before the call)
and `out<i>` (after), so a runner on any device can check a kernel without TVM's
compiler.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.runner.kernel_runner import random_array


def make_reference(mod, args: list, path: Path) -> Path:
    import tvm

    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    rng = np.random.default_rng(0)
    host = [random_array(np, d, s, rng) for d, s in args]
    dev = tvm.cpu(0)
    arrs = [tvm.runtime.tensor(a, dev) for a in host]
    lib["main"](*arrs)
    data = {f"in{i}": a for i, a in enumerate(host)}
    data.update({f"out{i}": a.numpy() for i, a in enumerate(arrs)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **data)
    tmp.replace(path)
    return path
