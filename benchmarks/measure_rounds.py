"""What interleaved rounds (`measure.rounds`) buy over one pass of as many repeats.

    python benchmarks/measure_rounds.py [overrides] [--repeat 3] [--rounds 2] [--passes 2]
                                        [--load 0] [--burst-s 5]

The Hydra overrides name a workspace whose kernels are built (`stage=replay` done). Its
kernels are timed by stage=measure on a copy of the workspace (the workspace keeps its
labels) under two settings of equal timing cost:

  one pass  measure.rounds=1, measure.repeat=<rounds x repeat> (MetaSchedule's runner)
  rounds    measure.rounds=<rounds>, measure.repeat=<repeat>

each `--passes` times, alternating (A B A B), so that slow drift of the host hits both
settings alike. For every task it prints how the labels of two passes of one setting
agree (pairwise accuracy, top-1 score: `models.metrics.latency_agreement`), then the means
over tasks, the wall time of each pass, and the ratio rounds / one pass. `--load N` runs
N CPU burners during every pass that switch on and off at random (`--burst-s` mean
seconds each way): the bursts of load of a shared host.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from models.metrics import latency_agreement
from models.tables import usable_rows
from pipeline.config import compose, run_stage
from pipeline.core.workspace import Workspace
from pipeline.options import workspace_of

# Tasks with fewer measured kernels in both passes say nothing about ranking.
MIN_RECORDS = 8


def burn(mean_s: float, seed: int, stop) -> None:
    """Busy, idle, busy, ... for random spells of `mean_s` seconds on average."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        end = time.monotonic() + rng.exponential(mean_s)
        while time.monotonic() < end and not stop.is_set():
            pass
        stop.wait(rng.exponential(mean_s))


def labels(root: Path) -> pd.DataFrame:
    """record_id -> (task_id, mean_s) of the copy's successful measurements."""
    meas = Workspace(root).read("measurements")
    meas = meas[usable_rows(meas)].drop_duplicates("record_id", keep="last")
    return meas.set_index("record_id")[["task_id", "mean_s"]]


def agreement_by_task(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Per task: pairwise accuracy and top-1 score of pass `a`'s labels judged by pass `b`'s."""
    both = a.join(b["mean_s"].rename("mean_s_b"), how="inner")
    rows = []
    for task, g in both.groupby("task_id"):
        if len(g) >= MIN_RECORDS:
            pair, top1 = latency_agreement(g["mean_s"].to_numpy(), g["mean_s_b"].to_numpy())
            rows.append({"task_id": task, "records": len(g), "pair": pair, "top-1": top1})
    return pd.DataFrame(rows).set_index("task_id")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides naming the workspace and measure.* settings")
    p.add_argument("--repeat", type=int, default=3, help="repeats per round (one pass: rounds x this)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--passes", type=int, default=2, help="passes per setting (>= 2: they are compared)")
    p.add_argument("--load", type=int, default=0, help="CPU burners running during the passes")
    p.add_argument("--burst-s", type=float, default=5.0, help="mean seconds a burner is busy, then idle")
    args = p.parse_args()
    if args.passes < 2 or args.rounds < 2:
        raise SystemExit("--passes and --rounds: give at least 2")
    ws = workspace_of(compose(args.overrides))
    if ws.read("kernels").empty:
        raise SystemExit(f"{ws.root}: no built kernels; run `python -m pipeline stage=replay` with these overrides")
    settings = {"one pass": ["measure.rounds=1", f"measure.repeat={args.rounds * args.repeat}"],
                "rounds": [f"measure.rounds={args.rounds}", f"measure.repeat={args.repeat}"]}
    stop = mp.Event()
    burners = [mp.Process(target=burn, args=(args.burst_s, i, stop), daemon=True) for i in range(args.load)]
    with tempfile.TemporaryDirectory(prefix="measure-rounds-") as tmp:
        copy = Path(tmp) / ws.root.name
        shutil.copytree(ws.root, copy, ignore=shutil.ignore_patterns("measurements", "runner", "features",
                                                                      "bundle-*", "*.tar.gz"))
        over = [*args.overrides, f"paths.data={tmp}", "force=true", "measure.check_per_task=0"]
        got: dict[str, list[pd.DataFrame]] = {name: [] for name in settings}
        walls: dict[str, list[float]] = {name: [] for name in settings}
        for b in burners:
            b.start()
        try:
            for i in range(args.passes):
                for name, setting in settings.items():
                    shutil.rmtree(copy / "measurements", ignore_errors=True)
                    t0 = time.perf_counter()
                    run_stage("measure", [*over, *setting])
                    walls[name].append(time.perf_counter() - t0)
                    got[name].append(labels(copy))
                    print(f"pass {i + 1} of {name} ({' '.join(setting)}): {len(got[name][-1])} kernels timed in "
                          f"{walls[name][-1]:.0f} s", flush=True)
        finally:
            stop.set()
            for b in burners:
                b.join(timeout=10)
    tables = {name: pd.concat([agreement_by_task(runs[k], runs[k + 1]) for k in range(args.passes - 1)])
              .groupby(level=0).mean() for name, runs in got.items()}
    table = pd.concat(tables, axis=1)
    print(f"\n{ws.root}: {len(table)} tasks with >= {MIN_RECORDS} kernels, {args.passes} passes of each setting, "
          f"{args.load} burners (bursts of {args.burst_s:g} s)")
    print(table.round(3).to_string())
    mean = table.mean()
    print("\nmean over tasks (consecutive passes of one setting against each other):")
    for name in settings:
        print(f"  {name:9s} pairwise accuracy {mean[(name, 'pair')]:.3f}, top-1 {mean[(name, 'top-1')]:.3f}, "
              f"{np.mean(walls[name]):.0f} s per pass")
    print(f"rounds vs one pass of equal cost: pairwise accuracy {mean[('rounds', 'pair')] / mean[('one pass', 'pair')]:.3f}x, "
          f"top-1 {mean[('rounds', 'top-1')] / mean[('one pass', 'top-1')]:.3f}x, "
          f"time {np.mean(walls['rounds']) / np.mean(walls['one pass']):.2f}x")


if __name__ == "__main__":
    main()
