#!/usr/bin/env python3
"""Run and time exported kernels; needs only the TVM runtime and NumPy.

This file is self-contained (no project imports) so that a GPU host with a runtime-only
TVM (`TVM_USE_RUNTIME_LIB=1`) can run it on shipped artifacts:

    python kernel_runner.py --jobs jobs.jsonl --out results.jsonl --device cuda

jobs.jsonl: one JSON object a line: record_id, artifact (path, relative to --root),
args ([[dtype, shape], ...]), reference (npz path relative to --root, or null).
results.jsonl: for every job a `start` line before it runs and a `done` line after, so
that a caller that sees a start without a done knows which kernel crashed or hung.
Jobs that already have a `done` line in --out are skipped (resume after a crash).
Timing follows MetaSchedule's runner: `number` calls per repeat, `repeat` repeats, each
repeat at least `min_repeat_ms` long; results are seconds per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def random_array(np, dtype: str, shape: list, rng):
    if dtype.startswith("float") or dtype.startswith("bfloat"):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 8, size=shape).astype(dtype)


def load_done(path: str) -> set:
    done = set()
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash
                if ev.get("event") == "done":
                    done.add(ev["record_id"])
    return done


def run_job(tvm, np, dev, job: dict, root: str, opts) -> dict:
    out = {"record_id": job["record_id"]}
    mod = tvm.runtime.load_module(os.path.join(root, job["artifact"]))
    func = mod["main"]
    rng = np.random.default_rng(0)
    ref = None
    if job.get("reference"):
        ref = np.load(os.path.join(root, job["reference"]))
        host = [ref[f"in{i}"] for i in range(len(job["args"]))]
    else:
        host = [random_array(np, d, s, rng) for d, s in job["args"]]
    args = [tvm.runtime.tensor(a, dev) for a in host]
    if ref is not None:
        func(*args)
        dev.sync()
        errs = []
        for i, a in enumerate(args):
            got, want = a.numpy(), ref[f"out{i}"]
            if got.dtype.kind in "fc":
                errs.append(float(np.max(np.abs(got.astype("float64") - want.astype("float64")))) if got.size else 0.0)
                ok = np.allclose(got, want, rtol=opts.rtol, atol=opts.atol, equal_nan=True)
            else:
                errs.append(float(np.max(np.abs(got.astype("int64") - want.astype("int64")))) if got.size else 0.0)
                ok = np.array_equal(got, want)
            if not ok:
                out["correct"] = False
        out.setdefault("correct", True)
        out["checked"] = True
        out["max_abs_err"] = max(errs) if errs else 0.0
    timer = mod.time_evaluator("main", dev, number=opts.number, repeat=opts.repeat, min_repeat_ms=opts.min_repeat_ms)
    results = [float(x) for x in timer(*args).results]
    out.update(
        run_secs=results, mean_s=statistics.fmean(results), median_s=statistics.median(results),
        std_s=statistics.pstdev(results) if len(results) > 1 else 0.0, min_s=min(results),
        repeats=len(results), number=opts.number,
    )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--root", default=".", help="folder that artifact/reference paths are relative to")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--number", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--min-repeat-ms", type=int, default=20)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--atol", type=float, default=1e-3)
    opts = p.parse_args(argv)

    import numpy as np
    import tvm

    dev = tvm.cuda(0) if opts.device == "cuda" else tvm.cpu(0)
    if not dev.exist:
        print(f"kernel_runner: no {opts.device} device on this host", file=sys.stderr)
        return 3
    with open(opts.jobs) as f:
        jobs = [json.loads(line) for line in f if line.strip()]
    done = load_done(opts.out)
    with open(opts.out, "a") as out:
        for job in jobs:
            if job["record_id"] in done:
                continue
            out.write(json.dumps({"event": "start", "record_id": job["record_id"], "time": time.time()}) + "\n")
            out.flush()
            try:
                res = run_job(tvm, np, dev, job, opts.root, opts)
            except Exception as e:  # noqa: BLE001 - a failing kernel is a result, not a stop
                msg = str(e).strip().splitlines()
                res = {"record_id": job["record_id"], "error": f"run: {type(e).__name__}: {msg[-1] if msg else ''}"[:2000]}
            res["event"] = "done"
            out.write(json.dumps(res) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
