"""Kernels built per second by stage=replay: 1 local worker, all local cores, and Ray on a
local cluster over the same cores, in one run on the same candidates.

    python benchmarks/replay_throughput.py [--candidates 32] [--ops GMM,C1D,C2D,SFM]

Builds the same sampled candidates from scratch for each executor (fresh `kernels/` and
`lib/` each time), twice in a row: the first run pays the one-off costs (this process
importing TVM for the first executor, Ray's workers importing it for theirs), the second
shows the steady state of a long run, where those costs are spread over thousands of
kernels. Prints each rate and the ratios of both. Ray's instance is started before its
timing (as a cluster is, with `ray start`, before a pipeline joins it); its start-up is
printed on its own. Goals (steady state): all cores >= 1.7x one worker on 2 cores; Ray >=
0.9x the local pool on the same cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.config import compose, run_stage
from pipeline.options import executor_of


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", type=int, default=32)
    p.add_argument("--ops", default="GMM,C1D,C2D,SFM")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replay-bench-"))
    cores = os.cpu_count() or 1
    base = [f"paths.data={tmp}", f"dataset.ops=[{args.ops}]", "dataset.configs=[1]",
            f"budget.candidates_per_task={args.candidates}", "budget.max_tasks=null"]
    run_stage("tasks", base)
    run_stage("sample", base)
    ws = next(tmp.iterdir())
    runs = {"1 local worker": ["executor=local", "jobs=1"],
            f"{cores} local workers": ["executor=local", f"jobs={cores}"],
            f"Ray, local instance of {cores} CPUs": ["executor=ray", f"executor.num_cpus={cores}"]}
    cold, warm = {}, {}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, over in runs.items():
        if "executor=ray" in over:
            t0 = time.perf_counter()
            executor_of(compose([*base, *over])).start()
            print(f"  (Ray instance started in {time.perf_counter() - t0:.1f} s, not counted)")
        for kind, rates in (("first", cold), ("again", warm)):
            shutil.rmtree(ws / "kernels", ignore_errors=True)
            shutil.rmtree(ws / "lib", ignore_errors=True)
            t0 = time.perf_counter()
            out = run_stage("replay", [*base, *over])
            wall = time.perf_counter() - t0
            rates[name] = out["new"] / wall
            print(f"{name}, {kind}: {out['new']} kernels ({out['failed']} failed) in {wall:.1f} s = "
                  f"{rates[name]:.2f} kernels/s")
    for kind, rates in (("first run (imports and worker start-up included)", cold),
                        ("run again (warm: the steady state of a long run)", warm)):
        one, pool, ray = rates.values()
        print(f"{kind}: {cores} local workers vs 1: {pool / one:.2f}x (goal >= 1.7x on 2 cores); "
              f"Ray vs {cores} local workers: {ray / pool:.2f}x (goal >= 0.9x)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
