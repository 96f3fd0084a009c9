"""Kernels built per second by stage=replay with 1 worker and with all cores, in one run.

    python benchmarks/replay_throughput.py [--candidates 16] [--ops GMM,C1D,C2D,SFM]

Builds the same candidates twice from scratch (fresh workspaces sharing one sampled
database) and prints both rates and their ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.config import run_stage


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--ops", default="GMM,C1D,C2D,SFM")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    base = [f"paths.data={tmp}", f"dataset.ops=[{args.ops}]", "dataset.configs=[1]",
            f"budget.candidates_per_task={args.candidates}", "budget.max_tasks=null"]
    run_stage("tasks", base)
    run_stage("sample", base)
    ws = next(tmp.iterdir())
    cores = os.cpu_count() or 1
    rates = {}
    for workers in (1, cores):
        shutil.rmtree(ws / "kernels", ignore_errors=True)
        shutil.rmtree(ws / "lib", ignore_errors=True)
        t0 = time.perf_counter()
        out = run_stage("replay", [*base, f"jobs={workers}"])
        wall = time.perf_counter() - t0
        rates[workers] = out["new"] / wall
        print(f"workers={workers}: {out['new']} kernels ({out['failed']} failed) in {wall:.1f} s "
              f"= {rates[workers]:.2f} kernels/s")
    print(f"speedup with {cores} workers vs 1: {rates[cores] / rates[1]:.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
