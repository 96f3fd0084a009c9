"""Reference results: the unscheduled workload, built for the host CPU, on fixed inputs.

Saved per task as `references/<task_id>.npz`: the seed of the inputs (the kernel
harness draws the same arrays) and, for each argument after the call, its values at up to `sample`
fixed positions (`idx<i>`, `out<i>`). A runner on any device can check a kernel without
TVM's compiler, and a reference stays a few KB however large the tensors are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.device.harness import seeded_inputs


def sample_positions(size: int, sample: int, rng) -> np.ndarray:
    return np.arange(size) if size <= sample else np.sort(rng.choice(size, sample, replace=False))


def make_reference(mod, args: list, path: Path, seed: int = 0, sample: int = 4096) -> Path:
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    lib = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    host = seeded_inputs(args, seed)  # what the harness draws for a job with this reference
    dev = tvm.cpu(0)
    arrs = [tvm.runtime.tensor(a, dev) for a in host]
    lib["main"](*arrs)
    pick = np.random.default_rng(seed + 1)
    data = {"seed": np.int64(seed)}
    for i, a in enumerate(arrs):
        flat = a.numpy().ravel()
        idx = sample_positions(flat.size, sample, pick)
        data[f"idx{i}"], data[f"out{i}"] = idx, flat[idx]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **data)
    tmp.replace(path)
    return path
