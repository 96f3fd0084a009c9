"""This machine's peaks for the roofline columns (features/roofline.py), with the load beside them.

    python benchmarks/machine_peaks.py [--cores N] [--lanes 8] [--reached RELEASE ...]

Prints fp32 GFLOP/s (a 2048^3 float32 matrix product through numpy's BLAS on every core) and
memory bandwidth in GB/s (a 256 MiB copy, bytes read + written), the best of 5 each, as the
`roofline:` block of a model config, and the ratio of the two (the roofline's ridge point,
FLOP per byte: the only figure a ranking within a task depends on). Peaks taken on a busy
machine are low: the 1-minute load average is printed with them; take them idle.

BLAS uses every vector unit the CPU has; the kernels a target builds may not (the generic
llvm target builds 128-bit SSE2 code). `--reached` prints what the kernels of dataset
releases (each with every release it extends) reached: each task's FLOPs over its fastest
timed kernel, the fastest tasks first, and the best against the BLAS peak.
"""

from __future__ import annotations

import argparse
import os

from features.roofline import measure_peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--lanes", type=int, default=8, help="fp32 lanes of a SIMD register (AVX2: 8, AVX-512: 16)")
    ap.add_argument("--reached", nargs="*", default=[], metavar="RELEASE",
                    help="dataset releases (names or folders), each with the releases it extends, whose fastest kernels to show")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    peaks = measure_peaks(cores=args.cores, lanes=args.lanes)
    print(f"load average (1 min) before: {load:.2f}")
    print("roofline:")
    for k, v in peaks.as_dict().items():
        print(f"  {k}: {v:.1f}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"ridge point: {peaks.gflops / peaks.gbs:.2f} FLOP/byte")
    if args.reached:
        reached = reached_gflops(args.reached)
        print(f"fastest kernels of {', '.join(args.reached)} and the releases they extend, {len(reached)} tasks timed:")
        print(reached.head(5).to_string(float_format=lambda v: f"{v:.1f}"))
        print(f"best reached: {reached['gflops'].iloc[0]:.1f} GFLOP/s = "
              f"{reached['gflops'].iloc[0] / peaks.gflops:.2f}x the BLAS peak")


def reached_gflops(releases: list[str]):
    """Per task of the releases and of every release they extend: its FLOPs over its fastest
    kernel, in GFLOP/s, with the release and hardware that timed it; the fastest first."""
    import pandas as pd

    from pipeline.core import release as R

    rows = []
    for name in releases:
        for folder, manifest in R.chain(R.find(name, R.search_path())):
            tables = folder / R.TABLES_DIR
            tasks = pd.read_parquet(tables / "tasks.parquet", columns=["task_id", "name", "flops"])
            times = pd.read_parquet(tables / "measurements.parquet", columns=["task_id", "mean_s", "error", "hardware"])
            best = times[times["error"].isna()].groupby("task_id").agg(mean_s=("mean_s", "min"),
                                                                      hardware=("hardware", "first"))
            both = tasks.join(best, on="task_id", how="inner").assign(release=manifest["name"])
            rows.append(both.assign(gflops=both["flops"] / both["mean_s"] / 1e9))
    out = pd.concat(rows, ignore_index=True).drop_duplicates(["release", "task_id"])
    out = out.sort_values("gflops", ascending=False)
    return out[["release", "name", "hardware", "gflops"]].reset_index(drop=True)

if __name__ == "__main__":
    main()
