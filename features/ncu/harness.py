#!/usr/bin/env python3
"""Run many exported kernels in one process, each inside an NVTX range named by its record.

Needs only the TVM runtime, NumPy and `nvtx` (no project imports), so it can be copied to
a GPU host that receives nothing but the artifacts. Under Nsight Compute:

    ncu --nvtx --nvtx-include "regex:<domain>@.+/" ... python harness.py --manifest m.json --progress p.jsonl

profiles exactly the launches inside the ranges (not the warm-up launch, which also
JIT-compiles the kernel, and not input set-up), and every profiled kernel carries its
record id even when kernels share a name such as `main_kernel`.

manifest.json: {"domain": str, "warmup": int, "kernels": [{"record_id", "artifact", "args"}]}
with artifact paths relative to --root and args as [[dtype, shape], ...].
progress.jsonl: a `start` line before each kernel and a `done` line (with `error` when it
failed) after it, flushed at once: a caller that finds a start without a done knows
which kernel crashed or hung the process. Inputs are made as pipeline/runner/
kernel_runner.py makes them (same generator and seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

try:
    from pipeline.runner.kernel_runner import choose_cuda_compiler, random_array
except ImportError:  # shipped without the project, next to kernel_runner.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_runner import choose_cuda_compiler, random_array  # noqa: E402

# Exit code after a kernel failed on a GPU: its CUDA context may be unusable, so the
# caller starts a fresh process for the kernels that remain.
EXIT_CONTEXT_LOST = 4
# Exit code when the harness cannot run at all (no device, missing package).
EXIT_UNUSABLE = 3


def run(manifest: dict, root: str, device: str, progress_path: str) -> int:
    import numpy as np
    import tvm

    try:
        import nvtx
    except ImportError:
        print("harness: the `nvtx` package is missing (pip install nvtx)", file=sys.stderr)
        return EXIT_UNUSABLE
    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    if not dev.exist:
        print(f"harness: no {device} device on this host", file=sys.stderr)
        return EXIT_UNUSABLE
    domain = manifest["domain"]
    warmup = int(manifest.get("warmup", 1))
    done = set()
    if os.path.exists(progress_path):
        with open(progress_path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if ev.get("event") == "done":
                    done.add(ev["record_id"])
    with open(progress_path, "a") as progress:
        def emit(**ev):
            progress.write(json.dumps(ev) + "\n")
            progress.flush()
            os.fsync(progress.fileno())

        for k in manifest["kernels"]:
            rid = k["record_id"]
            if rid in done:
                continue
            emit(event="start", record_id=rid, time=time.time())
            try:
                mod = tvm.runtime.load_module(os.path.join(root, k["artifact"]))
                func = mod["main"]
                rng = np.random.default_rng(0)
                args = [tvm.runtime.tensor(random_array(np, d, s, rng), dev) for d, s in k["args"]]
                for _ in range(warmup):
                    func(*args)
                dev.sync()
                nvtx.push_range(rid, domain=domain)
                try:
                    func(*args)
                    dev.sync()
                finally:
                    nvtx.pop_range(domain=domain)
            except Exception as e:  # noqa: BLE001 - a failing kernel is a result
                msg = str(e).strip().splitlines()
                emit(event="done", record_id=rid, error=f"{type(e).__name__}: {msg[-1] if msg else ''}"[:2000])
                if device == "cuda":
                    return EXIT_CONTEXT_LOST
                continue
            emit(event="done", record_id=rid)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--progress", required=True)
    p.add_argument("--root", default=".", help="folder that artifact paths are relative to")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    opts = p.parse_args(argv)
    if opts.device == "cuda":
        choose_cuda_compiler()
    with open(opts.manifest) as f:
        manifest = json.load(f)
    return run(manifest, opts.root, opts.device, opts.progress)


if __name__ == "__main__":
    sys.exit(main())
