"""How well the roofline bound alone ranks each task's candidates: without a cache (every
touched line moved from memory) against with one (`cache_bytes`: a buffer whose reuse fits
moves each line once), features/roofline.py. No model is trained: the bound is the score.

    python benchmarks/roofline_ranking.py --workspace data/zoo_ops-llvm-epyc2-v34 \
        [--exclude-networks lstm_lm] [--cache-bytes 32768 1048576 33554432] \
        [--gflops 210 --gbs 28 --cores 2 --lanes 8] [--min-records 32]

Prints, over the tasks with at least --min-records timed records (those of the excluded
networks left out, so that a held-out network is never looked at), the bound's pairwise
accuracy and top-1 score per task and per network (models/metrics.py `evaluate`, as a model's
are scored) for each cache size, and each against no cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workspace", required=True, help="a collected workspace folder (stage=collect done)")
    p.add_argument("--exclude-networks", nargs="*", default=[], help="networks whose tasks are left out")
    p.add_argument("--cache-bytes", nargs="*", type=float, default=[32 * 1024, 1024 * 1024, 32 * 1024 * 1024])
    p.add_argument("--gflops", type=float, default=210.0)
    p.add_argument("--gbs", type=float, default=28.0)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--min-records", type=int, default=32)
    args = p.parse_args()

    from features import roofline as roof
    from models import metrics as M, tables as T
    from pipeline.core.workspace import Workspace

    ws = Workspace(Path(args.workspace))
    table = T.build_table(ws, "static")  # the records a model trains on, their stores packed per record
    members = ws.read("network_tasks")
    left_out = set(members.loc[members["network"].isin(args.exclude_networks), "task_id"])
    table = table.take(np.flatnonzero(~table.frame["task_id"].isin(left_out).to_numpy()))
    figures = {}
    for c in [0.0, *args.cache_bytes]:
        peaks = roof.Peaks(gflops=args.gflops, gbs=args.gbs, cores=args.cores, lanes=args.lanes, cache_bytes=c)
        bound = roof.record_bound_ns(table.stores, table.offsets, peaks, table.spec.store_columns)
        # the bound is a time: the fastest-bounded record is the pick (metrics rank higher first)
        ev = M.evaluate(table.frame, -bound, calibrated=False, members=table.members,
                        topk_min_records=args.min_records)
        figures[f"cache {c:.0f} B" if c else "no cache"] = ev.summary
    first = next(iter(figures.values()))
    print(f"{args.workspace}: {first['n_tasks_topk']:.0f} tasks with >= {args.min_records} records "
          f"({len(left_out)} tasks of {', '.join(args.exclude_networks) or 'no network'} left out)")
    for name, f in figures.items():
        print(f"{name:>16}: " + ", ".join(
            f"{label} {f[key]:.3f} ({f[key] / first[key]:.3f}x)" for label, key in
            (("pairwise", "topk_pair_acc"), ("per-task top-1", "peak1"), ("network top-1", "top1_score"))))

if __name__ == "__main__":
    main()
