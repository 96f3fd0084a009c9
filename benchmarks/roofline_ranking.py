"""How well the roofline bound alone ranks each task's candidates: without a cache (every
touched line moved from memory) against with one (`cache_bytes`: a buffer whose reuse fits
moves each line once), features/roofline.py. No model is trained: the bound is the score.

    python benchmarks/roofline_ranking.py --workspace data/zoo_ops-llvm-epyc2-v34 \
        [--exclude-networks lstm_lm] [--cache-bytes 32768 1048576 33554432] \
        [--gflops 210 --gbs 28 --cores 2 --lanes 8] [--min-records 32]

Prints, over the tasks with at least --min-records timed records (those of the excluded
networks left out, so that a held-out network is never looked at), the mean per-task pairwise
accuracy and top-1 score of the bound for each cache size, and each against no cache.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def bounds(stores: pd.DataFrame, peaks) -> pd.Series:
    """Each record's roofline bound in ns (the sum over its stores)."""
    from features import roofline as roof
    from pipeline.core import schema as S

    names = list(S.PER_STORE_FEATURE_NAMES)
    offsets = np.r_[0, np.cumsum(stores.groupby("record_id", sort=False).size().to_numpy())]
    ns = roof.record_bound_ns(stores[names].to_numpy(np.float32), offsets, peaks, names)
    return pd.Series(ns, index=stores["record_id"].drop_duplicates().to_numpy())


def task_scores(records: pd.DataFrame, score: str) -> tuple[float, float]:
    """(pairwise accuracy, top-1 score) of `score` (lower = predicted faster) within a task."""
    t, s = records["mean_s"].to_numpy(), records[score].to_numpy()
    i, j = np.triu_indices(len(t), 1)
    keep = t[i] != t[j]
    pair = float(np.mean((s[i] < s[j])[keep] == (t[i] < t[j])[keep])) if keep.any() else np.nan
    picked = t[s == s.min()].mean()  # ties: the expected latency of a pick among them
    return pair, float(t.min() / picked)


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

    from features import roofline as roof, static
    from models import tables as T
    from pipeline.core.workspace import Workspace

    ws = Workspace(Path(args.workspace))
    labels = T.labelled_records(ws)
    members = ws.read("network_tasks")
    left_out = set(members.loc[members["network"].isin(args.exclude_networks), "task_id"])
    labels = labels[~labels["task_id"].isin(left_out)]
    _, stores = static.load(ws)
    stores = stores[stores["record_id"].isin(labels["record_id"])]
    sizes = [0.0, *args.cache_bytes]
    table = labels.set_index("record_id")[["task_id", "mean_s"]]
    for c in sizes:
        peaks = roof.Peaks(gflops=args.gflops, gbs=args.gbs, cores=args.cores, lanes=args.lanes, cache_bytes=c)
        table[f"cache {c:.0f}"] = bounds(stores, peaks)
    table = table.dropna()
    cols = [f"cache {c:.0f}" for c in sizes]
    rows = []
    for task, g in table.groupby("task_id"):
        if len(g) >= args.min_records:
            rows.append({"task_id": task, **{f"{c} {m}": v for c in cols for m, v in zip(("pair", "top1"),
                                                                                       task_scores(g, c))}})
    out = pd.DataFrame(rows)
    print(f"{args.workspace}: {len(out)} tasks with >= {args.min_records} records "
          f"({len(left_out)} tasks of {', '.join(args.exclude_networks) or 'no network'} left out)")
    base_pair, base_top1 = out[f"{cols[0]} pair"].mean(), out[f"{cols[0]} top1"].mean()
    for c in cols:
        pair, top1 = out[f"{c} pair"].mean(), out[f"{c} top1"].mean()
        print(f"{c + ' B' if c != cols[0] else 'no cache':>16}: pairwise {pair:.3f} ({pair / base_pair:.3f}x), "
              f"top-1 {top1:.3f} ({top1 / base_top1:.3f}x)")


if __name__ == "__main__":
    main()
