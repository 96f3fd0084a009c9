"""This machine's peaks for the roofline columns (features/roofline.py), with the load beside them.

    python benchmarks/machine_peaks.py [--cores N] [--lanes 8]

Prints fp32 GFLOP/s (a 2048^3 float32 matrix product through numpy's BLAS on every core) and
memory bandwidth in GB/s (a 256 MiB copy, bytes read + written), the best of 5 each, as the
`roofline:` block of a model config, and the ratio of the two (the roofline's ridge point,
FLOP per byte: the only figure a ranking within a task depends on). Peaks taken on a busy
machine are low: the 1-minute load average is printed with them; take them idle.
"""

from __future__ import annotations

import argparse
import os

from features.roofline import measure_peaks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--lanes", type=int, default=8, help="fp32 lanes of a SIMD register (AVX2: 8, AVX-512: 16)")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    peaks = measure_peaks(cores=args.cores, lanes=args.lanes)
    print(f"load average (1 min) before: {load:.2f}")
    print("roofline:")
    for k, v in peaks.as_dict().items():
        print(f"  {k}: {v:.1f}" if isinstance(v, float) else f"  {k}: {v}")
    print(f"ridge point: {peaks.gflops / peaks.gbs:.2f} FLOP/byte")


if __name__ == "__main__":
    main()
