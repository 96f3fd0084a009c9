"""Whether kept tuning runs were timed on a machine like this one: their databases re-timed here.

    python benchmarks/kept_runs_on_this_machine.py FOLDER [overrides] [--runs xgb-s0,random-s0]

FOLDER holds a network's kept runs (`data/tuning/<workspace>/<comparison>/<network>`, one
folder per run with `result.json` and the gzipped database). The Hydra overrides build the
network as the comparison's stage=tune did (`dataset=release dataset.release=... budget=transfer
tune.tasks=resnet18`; `tune.tasks` defaults to FOLDER's name). In one run, with the runner's
evaluator settings (`tune.runner.number`, `repeat`, `min_repeat_ms`), it times the untuned
network and then the network compiled with each run's database, and prints per run its kept
end-to-end latency, the one timed now and their ratio, and the untuned network now against
the one timed beside the run (where the run kept it). The machine's figure is the untuned
network's ratio, now / beside each run: the same program then and now, whereas a run kept
before its records were applied at compile time kept the untuned network's latency as its own
(docs/tuning.md, End-to-end figures taken before the records applied). The same kind of
machine gives ratios near 1; a machine that times slower or faster gives that factor, and runs
kept from it compare with runs tuned here only as speedups over the untuned network
(`speedup_vs_untuned` of the tuning report).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def fail(msg: str, script: str = "kept_runs_on_this_machine") -> None:
    print(f"{script}: {msg}", file=sys.stderr)
    sys.exit(2)


def kept_runs_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every kept-runs benchmark takes: FOLDER, Hydra overrides, --runs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("folder", type=Path, help="a network's kept runs (data/tuning/<workspace>/<comparison>/<network>)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides that build the network as stage=tune did")
    p.add_argument("--runs", default="", help="comma-separated run folders (default: every run with a database)")
    return p


def kept_runs_and_network(args: argparse.Namespace, script: str):
    """The run folders named (or every one with a database), the config, and the network and
    target built as the comparison's stage=tune did; a clear exit where FOLDER or a run is not."""
    from pipeline.config import compose
    from pipeline.options import task_choice
    from pipeline.tuning import tasks as tuning_tasks
    from pipeline.tuning.comparison import DATABASE_FILES, RESULT_FILE

    folder = args.folder
    if not folder.is_dir():
        fail(f"{folder}: no such folder; name a network's folder of kept runs, e.g. "
             f"data/tuning/zoo_ops-llvm-epyc2-v1/d2071fdd493f/resnet18", script)
    with_db = sorted(d.name for d in folder.iterdir()
                     if (d / RESULT_FILE).exists() and (d / f"{DATABASE_FILES[1]}.gz").exists())
    names = [n for n in args.runs.split(",") if n] or with_db
    missing = [n for n in names if n not in with_db]
    if missing or not names:
        fail(f"{folder}: no kept run with a database named {', '.join(missing) or '(none)'}; its runs with "
             f"one: {', '.join(with_db) or 'none'}", script)
    overrides = ["stage=tune", *args.overrides]
    if not any(o.startswith("tune.tasks=") for o in overrides):
        overrides.append(f"tune.tasks={folder.name}")
    cfg = compose(overrides)
    net, target = tuning_tasks.network(task_choice(cfg), str(cfg.tune.tasks))
    return names, cfg, net, target


def main() -> None:
    args = kept_runs_parser(__doc__.splitlines()[0]).parse_args()
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.comparison import RESULT_FILE, network_latency, open_database, read_result

    folder = args.folder
    names, cfg, net, target = kept_runs_and_network(args, "kept_runs_on_this_machine")
    r = cfg.tune.runner
    evaluator = {"number": int(r.number), "repeat": int(r.repeat), "min_repeat_ms": int(r.min_repeat_ms)}
    untuned = network_latency(ms.database.MemoryDatabase(), net.mod, target, net.inputs, **evaluator) * 1e3
    print(f"{net.name}: untuned {untuned:.1f} ms now; evaluator {evaluator}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'run':32s} {'kept ms':>9s} {'now ms':>9s} {'now/kept':>8s} {'untuned kept':>12s}")
    ratios = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            kept = read_result(folder / name / RESULT_FILE).get("end_to_end") or {}
            if "e2e_latency_ms" not in kept:
                print(f"{name:32s} (no end-to-end latency kept: not a network run)")
                continue
            db = open_database(folder / name, Path(scratch) / name)
            now = network_latency(db, net.mod, target, net.inputs, **evaluator) * 1e3
            ratio = now / float(kept["e2e_latency_ms"])  # NaN: kept before its records applied
            beside = kept.get("untuned_ms")
            if beside:
                ratios.append(untuned / float(beside))
            print(f"{name:32s} {kept['e2e_latency_ms']:9.1f} {now:9.1f} {ratio:8.3f} "
                  f"{f'{beside:.1f}' if beside else 'not kept':>12s}")
    if ratios:
        print(f"this machine / the kept runs' machine, the untuned network: x{np.median(ratios):.3f} "
              f"(now / beside each of {len(ratios)} runs, median, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
