"""Kernels profiled per minute: curated metrics, one ncu per batch vs `--set full`, one per kernel.

    python benchmarks/collect_throughput.py [--kernels 32] [--workspace PATH]
                                            [--target h100] [--ops GMM,C1D,C2D,SFM] [--candidates 8]
    python benchmarks/collect_throughput.py --part PART_DIR [--kernels 10] [--reports DIR] [--full-seconds S]

Needs an NVIDIA GPU, its driver and Nsight Compute (ncu); exits with a message otherwise.
Without --workspace or --part it builds a CUDA workspace first (stages tasks, sample, replay,
in a temporary folder). With --part it runs on a GPU host that has only Python and NumPy:
the kernels, the harness, the runtime-only TVM and the ncu command line of an unpacked part
of a collect bundle (`stage=collect collect.mode=export`), run as the part's own runner
runs them (pipeline/runner/part.py); a kernel counts as profiled when the harness finished
it under ncu without an error, and --reports keeps the reports to read back with
`python -m features.ncu.report`. Then, in one run, on the same kernels:

  batched   the pipeline's way: the curated metric list (features/ncu/metrics.py), all
            kernels in one harness process under one ncu invocation
  per-kernel the way published tools do it: `ncu --set full`, one process (harness + ncu)
            per kernel

and prints kernels profiled per minute for both and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def fail(msg: str) -> None:
    print(f"collect_throughput: {msg}", file=sys.stderr)
    sys.exit(2)


def check_gpu(ncu: str) -> str:
    from features.ncu import profile

    if not profile.gpu_present():
        fail("no NVIDIA GPU on this machine (no /dev/nvidiactl, nvidia-smi finds none); run this on a GPU host.")
    try:
        path = profile.find_ncu(ncu)
    except profile.NcuError as e:
        fail(str(e))
    import tvm

    if not tvm.cuda(0).exist:
        fail("TVM sees no CUDA device (driver not loaded, or CUDA_VISIBLE_DEVICES hides it).")
    return path


def kernel_jobs(ws_root: Path, n: int) -> list[dict]:
    from pipeline.core import schema as S
    from pipeline.core.workspace import Workspace, read_table

    ws = Workspace(ws_root)
    kernels = read_table(ws.require(ws.kernels, "replay"), S.KERNELS)
    kernels = kernels[kernels["error"].isna()].drop_duplicates("record_id").head(n)
    tasks = read_table(ws.tasks).set_index("task_id")
    return [dict(record_id=r.record_id, task_id=r.task_id, artifact=r.artifact,
                 args=json.loads(tasks.loc[r.task_id, "args_json"])) for r in kernels.itertuples()]


def workspace_rates(args, tmp: Path) -> dict[str, tuple[int, float, int]]:
    """(kernels profiled, seconds, ncu invocations) per way, through the pipeline's profiler."""
    ncu = check_gpu(args.ncu)
    from features.ncu import metrics, profile

    root = args.workspace.resolve() if args.workspace else build_workspace(tmp / "data", args.target, args.ops,
                                                                            args.candidates)
    jobs = kernel_jobs(root, args.kernels)
    if not jobs:
        fail(f"{root} has no built kernel")
    print(f"{len(jobs)} kernels from {root}")
    results = {}
    batched = profile.Options(ncu=ncu, metrics=list(metrics.DEFAULT_METRICS), batch_size=len(jobs))
    t0 = time.perf_counter()
    out = profile.profile(jobs, root, tmp / "batched", batched, tag="bench")
    results["batched"] = (len({r["record_id"] for r in out.kernels}), time.perf_counter() - t0, out.invocations)
    full = profile.Options(ncu=ncu, section_set="full", batch_size=1)
    t0 = time.perf_counter()
    out = profile.profile(jobs, root, tmp / "full", full, tag="bench")
    results["per-kernel full"] = (len({r["record_id"] for r in out.kernels}), time.perf_counter() - t0,
                                  out.invocations)
    return results


def build_workspace(tmp: Path, target: str, ops: str, candidates: int) -> Path:
    from pipeline.config import run_stage

    over = [f"paths.data={tmp}", f"target={target}", f"dataset.ops=[{ops}]", "dataset.configs=[0]",
            "budget.max_tasks=null", f"budget.candidates_per_task={candidates}"]
    for stage in ("tasks", "sample", "replay"):
        run_stage(stage, over)
    return next(p for p in tmp.iterdir() if p.is_dir())


def part_rates(part: Path, n: int, ncu: str, keep: Path, full_seconds: float | None = None
               ) -> dict[str, tuple[int, float, int]]:
    """(kernels profiled, seconds, ncu invocations) per way, on the first `n` kernels of an
    unpacked part, through its runner (install, environment, harness under ncu). The
    per-kernel way is the part's ncu command with `--set full` instead of its sections; with
    `full_seconds` it starts no further kernel after that long (its rate is over those it ran)."""
    sys.path.insert(0, str(part))
    import run_part  # the part's own runner (pipeline/runner/part.py)

    spec = json.loads((part / "part.json").read_text())
    if not spec.get("ncu"):
        fail(f"{part} is a part without an ncu step; export it with collect=ncu")
    run_part.install(spec, part / "site")
    env = run_part.environment(part / "site", spec)
    jobs = [json.loads(line) for line in (part / "jobs.jsonl").read_text().splitlines() if line.strip()][:n]
    keep.mkdir(parents=True, exist_ok=True)
    opts, timeout = spec["ncu"]["options"], float(spec["ncu"]["timeout_s"])

    def run(name: str, batch: list[dict], wrap: list[str]) -> int:
        jobs_file = keep / f"{name}.jobs.jsonl"
        jobs_file.write_text("".join(json.dumps(j) + "\n" for j in batch))
        run_part.harness(spec, jobs_file, keep / f"{name}.jsonl", "nvtx", opts, timeout, env, wrap)
        return sum(1 for e in run_part.done_ids(keep / f"{name}.jsonl").values() if not e)

    out = {}
    t0 = time.perf_counter()
    out["batched"] = (run("batched", jobs, run_part.ncu_command(spec, ncu, keep / "batched-{n}")),
                      time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    done = calls = 0
    for i, job in enumerate(jobs):
        if full_seconds is not None and time.perf_counter() - t0 > full_seconds:
            print(f"per-kernel full: stopped after {calls} of {len(jobs)} kernels (--full-seconds {full_seconds:g})")
            break
        done = run("full", [job], run_part.ncu_command(spec, ncu, keep / f"full-{i}-{{n}}", section_set="full"))
        calls += 1
    out["per-kernel full"] = (done, time.perf_counter() - t0, calls)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=32)
    p.add_argument("--workspace", type=Path, help="an existing CUDA workspace (<paths.data>/<dataset>-<target>)")
    p.add_argument("--part", type=Path, help="an unpacked part of a collect bundle (a GPU host with only Python)")
    p.add_argument("--reports", type=Path, help="with --part: keep the reports and events in this folder")
    p.add_argument("--target", default="h100")
    p.add_argument("--ops", default="GMM,C1D,C2D,SFM")
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--full-seconds", type=float, help="with --part: start no further `--set full` kernel after this long")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="collect-bench-"))
    try:
        if args.part:
            if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
                fail("no NVIDIA GPU on this machine (no /dev/nvidiactl, nvidia-smi finds none); run this on a GPU host.")
            ncu = shutil.which(args.ncu) or fail(f"ncu not found as {args.ncu!r}: put Nsight Compute's ncu on PATH")
            print(f"{args.kernels} kernels from the part {args.part}")
            results = part_rates(args.part.resolve(), args.kernels, ncu, (args.reports or tmp / "reports").resolve(),
                                 args.full_seconds)
        else:
            results = workspace_rates(args, tmp)
        rate = {}
        for name, (n, wall, calls) in results.items():
            rate[name] = n / (wall / 60.0) if wall > 0 else 0.0
            print(f"{name:>16}: {n} kernels profiled in {wall:.1f} s with {calls} ncu invocation(s) "
                  f"= {rate[name]:.1f} kernels/min")
        if rate["per-kernel full"] > 0:
            print(f"ratio batched / per-kernel full: {rate['batched'] / rate['per-kernel full']:.1f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
