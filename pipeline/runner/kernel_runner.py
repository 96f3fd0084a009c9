#!/usr/bin/env python3
"""Run and time exported kernels; needs only the TVM runtime and NumPy.

This file is self-contained (no project imports) so that a GPU host with a runtime-only
TVM (`TVM_USE_RUNTIME_LIB=1`) can run it on shipped artifacts:

    python kernel_runner.py --jobs jobs.jsonl --out results.jsonl --device cuda

jobs.jsonl: one JSON object a line: record_id, artifact (path, relative to --root),
args ([[dtype, shape], ...]), reference (npz path relative to --root, or null).
results.jsonl: one `done` line per job (with `error` for a kernel that failed, crashed
the process, or ran past --timeout-s). Kernels run in a child process (`--worker`) that
writes a `start` line before each kernel, so the parent knows which one crashed or hung,
records it, and starts a new child for the rest. Jobs that already have a `done` line
in --out are skipped, so an interrupted run resumes.
Timing follows MetaSchedule's runner: `number` calls per repeat, `repeat` repeats, each
repeat at least `min_repeat_ms` long; results are seconds per call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).resolve()


def choose_cuda_compiler() -> None:
    """Exported CUDA kernels hold CUDA source that TVM compiles when the module is loaded;
    its default compiler (NVRTC) needs the `cuda-bindings` package. Without it, use nvcc
    where it is installed."""
    try:
        import tvm.support.nvcc  # noqa: F401 - registers the compile callback
    except ImportError:
        pass
    if os.environ.get("TVM_CUDA_COMPILE_MODE"):
        return
    try:
        import cuda.bindings  # noqa: F401
    except ImportError:
        if shutil.which("nvcc"):
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def random_array(np, dtype: str, shape: list, rng):
    if dtype.startswith("float") or dtype.startswith("bfloat"):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 8, size=shape).astype(dtype)


def check_outputs(np, got: list, ref, rtol: float, atol: float) -> dict:
    """Compare every argument after the call with the reference at its sampled positions."""
    errs, correct = [], True
    for i, arr in enumerate(got):
        vals = arr.ravel()[ref[f"idx{i}"]]
        want = ref[f"out{i}"]
        if vals.dtype.kind in "fc":
            ok = bool(np.allclose(vals, want, rtol=rtol, atol=atol, equal_nan=True))
            diff = np.abs(vals.astype("float64") - want.astype("float64"))
        else:
            ok = bool(np.array_equal(vals, want))
            diff = np.abs(vals.astype("int64") - want.astype("int64"))
        errs.append(float(np.nanmax(diff)) if diff.size else 0.0)
        correct = correct and ok
    return {"checked": True, "correct": correct, "max_abs_err": max(errs) if errs else 0.0}


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
    ref = np.load(os.path.join(root, job["reference"])) if job.get("reference") else None
    rng = np.random.default_rng(int(ref["seed"]) if ref is not None else 0)
    host = [random_array(np, d, s, rng) for d, s in job["args"]]
    args = [tvm.runtime.tensor(a, dev) for a in host]
    if ref is not None:
        func(*args)
        dev.sync()
        out.update(check_outputs(np, [a.numpy() for a in args], ref, opts.rtol, opts.atol))
    timer = mod.time_evaluator("main", dev, number=opts.number, repeat=opts.repeat, min_repeat_ms=opts.min_repeat_ms)
    results = [float(x) for x in timer(*args).results]
    out.update(
        run_secs=results, mean_s=statistics.fmean(results), median_s=statistics.median(results),
        std_s=statistics.pstdev(results) if len(results) > 1 else 0.0, min_s=min(results),
        repeats=len(results), number=opts.number,
    )
    return out


# Seconds a fresh runner may take to import TVM before its first kernel starts.
STARTUP_S = 180.0


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def run_jobs(jobs: list[dict], out_file: Path, root: Path, device: str, opts: dict, timeout_s: float,
             python: str = sys.executable, env: dict | None = None) -> list[dict]:
    """Run `jobs` in child runners (resuming `out_file`), isolating crashes and hangs; one `done` result per job."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    jobs_file = out_file.with_name(out_file.name + ".jobs")
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    results: dict[str, dict] = {}
    cmd = [python, str(RUNNER), "--worker", "--jobs", str(jobs_file), "--out", str(out_file), "--root", str(root),
           "--device", device] + [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    wanted = {j["record_id"] for j in jobs}
    while True:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        start_size = out_file.stat().st_size if out_file.exists() else 0
        last_size, last_change, verdict = start_size, time.monotonic(), None
        while True:
            rc = proc.poll()
            size = out_file.stat().st_size if out_file.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            if rc is not None:
                verdict = None if rc == 0 else f"crashed: runner exited with {_describe(rc)}"
                break
            limit = STARTUP_S if size == start_size else timeout_s
            if time.monotonic() - last_change > limit:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                verdict = (f"timeout: no result within {timeout_s:g} s" if size != start_size
                           else f"timeout: the runner did not start within {STARTUP_S:g} s")
                break
            time.sleep(0.05)
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        events = _events(out_file)
        for ev in events:
            if ev.get("event") == "done":
                results[ev["record_id"]] = ev
        started = [ev["record_id"] for ev in events if ev.get("event") == "start" and ev["record_id"] not in results]
        if verdict is None:
            if rc == 0:
                break
        if rc == 3 or (verdict and not started):
            # The runner could not start at all (no device, broken install): every job fails the same way.
            msg = verdict or "runner failed"
            tail = output.strip().splitlines()[-1:] if output.strip() else []
            for rid in wanted - set(results):
                results[rid] = {"record_id": rid, "error": f"{msg}{': ' + tail[0] if tail else ''}"}
            break
        for rid in started:
            results[rid] = {"record_id": rid, "error": verdict, "event": "done"}
            with out_file.open("a") as f:
                f.write(json.dumps(results[rid]) + "\n")
        if wanted <= set(results):
            break
    return [results[j["record_id"]] for j in jobs if j["record_id"] in results]


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


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
    p.add_argument("--timeout-s", type=float, default=30.0, help="seconds one kernel may take")
    p.add_argument("--worker", action="store_true", help="run the jobs in this process (no isolation)")
    opts = p.parse_args(argv)
    if not opts.worker:
        with open(opts.jobs) as f:
            jobs = [json.loads(line) for line in f if line.strip()]
        timing = dict(number=opts.number, repeat=opts.repeat, min_repeat_ms=opts.min_repeat_ms,
                      rtol=opts.rtol, atol=opts.atol)
        res = run_jobs(jobs, Path(opts.out), Path(opts.root), opts.device, timing, opts.timeout_s)
        failed = sum(1 for r in res if r.get("error"))
        print(f"kernel_runner: {len(res) - failed} measured, {failed} failed; results in {opts.out}")
        return 0

    import numpy as np
    import tvm

    if opts.device == "cuda":
        choose_cuda_compiler()
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
