"""How repeatable a workspace's run times are: its stored labels against a re-measurement.

    python benchmarks/measurement_noise.py [overrides] [--tasks 6] [--records 24] [--rounds 4]

The Hydra overrides name the workspace and the timer's settings as for stage=measure
(`dataset=zoo_ops budget=transfer measure.repeat=5`). Re-times a seeded sample of measured
kernels (`--records` of each of `--tasks` tasks whose median run time is under `--max-ms`)
with the measure stage's timer and those settings, in
`--rounds` interleaved rounds (each round times every sampled kernel of a task once, in a
fresh random order, so a burst of load on a shared machine hits one round of a kernel, not
all of them). For every task it prints, as pairwise accuracy (the share of record pairs
whose order two measurements agree on) and top-1 score (best latency / latency of the
record the first measurement ranks best, both read from the second):

  one pass     one round against the next (a single measurement, as stage=measure takes)
  min of half  the minimum over the first half of the rounds against the other half's
  stored       the workspace's stored `mean_s` against the minimum over all rounds

  baseline     with `--baseline PATH` (the `measurements/` folder of an earlier measurement
               of the same kernels, e.g. a copy kept before `stage=measure force=true`):
               those labels against the minimum over all rounds, on the same kernels

and the ratio of the first two: what taking the minimum over interleaved rounds buys over
a single pass, measured in the same run. `stored` is the ceiling of any cost model
evaluated on these labels: a model that predicted the re-measured times exactly would
agree with the stored labels only this often.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import tvm

from models.metrics import latency_agreement
from models.tables import successful_measurements, usable_rows
from pipeline.config import compose
from pipeline.core import schema as S
from pipeline.device.harness import Timer, load_kernel
from pipeline.core.workspace import Workspace, read_table
from pipeline.runner.jobs import kernel_jobs
from pipeline.options import measure_settings, workspace_of


def sample_jobs(ws: Workspace, n_tasks: int, n_records: int, max_ms: float, seed: int,
                baseline: pd.Series | None) -> dict[str, list[dict]]:
    """task name -> jobs of `n_records` measured kernels (with a `baseline` label too, when
    given), for `n_tasks` tasks drawn with `seed`."""
    tasks = ws.read("tasks", require=True)
    meas = successful_measurements(ws)
    if baseline is not None:
        meas = meas[meas["record_id"].isin(set(baseline.index))]
    kernels = ws.read("kernels")
    kernels = kernels[kernels["error"].isna() & kernels["record_id"].isin(set(meas["record_id"]))]
    per_task = meas.groupby("task_id")["mean_s"].agg(["size", "median"])
    eligible = per_task[(per_task["size"] >= n_records) & (per_task["median"] * 1e3 < max_ms)].index
    if len(eligible) == 0:
        raise SystemExit(f"{ws.root}: no task has {n_records} measured kernels with a median under {max_ms} ms; "
                         f"lower --records or raise --max-ms")
    rng = np.random.default_rng(seed)
    chosen = rng.choice(np.array(sorted(eligible), dtype=object), size=min(n_tasks, len(eligible)), replace=False)
    names = tasks.set_index("task_id")["name"]
    stored = meas.drop_duplicates("record_id", keep="last").set_index("record_id")["mean_s"]
    picked = pd.concat(kernels[kernels["task_id"] == tid].sample(n=n_records, random_state=seed) for tid in chosen)
    out: dict[str, list[dict]] = {}
    for j in kernel_jobs(ws, picked, check_per_task=0):
        j["stored_s"] = float(stored[j["record_id"]])
        if baseline is not None:
            j["baseline_s"] = float(baseline[j["record_id"]])
        out.setdefault(f"{names[j['task_id']]} ({j['task_id']})", []).append(j)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides naming the workspace and measure.* settings")
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--records", type=int, default=24)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-ms", type=float, default=20.0, help="skip tasks whose median run time is above this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", type=Path, help="an earlier measurements/ folder of the same kernels")
    args = p.parse_args()
    if args.rounds < 2 or args.rounds % 2:
        raise SystemExit(f"--rounds {args.rounds}: give an even number of at least 2 (half against half)")
    cfg = compose(args.overrides)
    ws = workspace_of(cfg)
    baseline = None
    if args.baseline:
        old = read_table(args.baseline, S.MEASUREMENTS)
        if old.empty:
            raise SystemExit(f"--baseline {args.baseline}: no measurement parts there; give a copy of a "
                             f"measurements/ folder")
        old = old[usable_rows(old)]
        baseline = old.drop_duplicates("record_id", keep="last").set_index("record_id")["mean_s"]
    timer = Timer(**measure_settings(cfg).timer_options())
    dev = tvm.cpu(0)
    rng = np.random.default_rng(args.seed)
    rows = []
    t0 = time.perf_counter()
    for name, jobs in sample_jobs(ws, args.tasks, args.records, args.max_ms, args.seed, baseline).items():
        kernels = [load_kernel(tvm, dev, j, str(ws.root)) for j in jobs]
        lat = np.empty((args.rounds, len(kernels)))
        for r in range(args.rounds):
            for i in rng.permutation(len(kernels)):
                lat[r, i] = timer.run(kernels[i])["mean_s"]
        half = args.rounds // 2
        one = [latency_agreement(lat[r], lat[r + 1]) for r in range(args.rounds - 1)]
        halves = latency_agreement(lat[:half].min(0), lat[half:].min(0))
        stored = latency_agreement(np.array([j["stored_s"] for j in jobs]), lat.min(0))
        rows.append({"task": name, "records": len(jobs),
                     "one pass pair": np.mean([a for a, _ in one]), "one pass top-1": np.mean([b for _, b in one]),
                     "min of half pair": halves[0], "min of half top-1": halves[1],
                     "stored pair": stored[0], "stored top-1": stored[1]})
        if baseline is not None:
            base = latency_agreement(np.array([j["baseline_s"] for j in jobs]), lat.min(0))
            rows[-1].update({"baseline pair": base[0], "baseline top-1": base[1]})
        print(f"{name}: {args.rounds} rounds of {len(jobs)} kernels timed", flush=True)
    table = pd.DataFrame(rows)
    mean = table.drop(columns=["task", "records"]).mean()
    print(f"\n{ws.root}: {len(rows)} tasks x {args.records} kernels, {args.rounds} rounds of "
          f"{timer.repeat} repeats, {time.perf_counter() - t0:.0f} s")
    print(table.round(3).to_string(index=False))
    print("\nmean over tasks:")
    print(mean.round(3).to_string())
    print(f"min over {args.rounds // 2} interleaved rounds vs one pass (pairwise accuracy): "
          f"{mean['min of half pair'] / mean['one pass pair']:.2f}x")
    if baseline is not None:
        print(f"stored labels vs the baseline's (pairwise accuracy against the re-measurement): "
              f"{mean['stored pair'] / mean['baseline pair']:.2f}x")
    report = {"tasks": len(rows), "records": args.records, "rounds": args.rounds, "repeats": timer.repeat,
              "seconds": round(time.perf_counter() - t0, 1), "load_avg_after": os.getloadavg()[0],
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "one_pass_pair": mean["one pass pair"], "one_pass_top1": mean["one pass top-1"],
              "min_half_pair": mean["min of half pair"], "min_half_top1": mean["min of half top-1"],
              "stored_pair": mean["stored pair"], "stored_top1": mean["stored top-1"],
              "command": "python benchmarks/measurement_noise.py " + " ".join(sys.argv[1:])}
    out = ws.root / "reports" / "measurement_noise.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({k: float(v) if isinstance(v, np.floating) else v for k, v in report.items()}, indent=2))
    print(f"written: {out} (stage=release puts it on the dataset card)")


if __name__ == "__main__":
    main()
