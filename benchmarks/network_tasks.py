"""Seconds to split a network into its MetaSchedule tasks, with the constants folded in NumPy
before legalization (pipeline.workloads.zoo.fuse) and with FoldConstant alone, on the same
exported module; both must give the same tasks (ids and weights).

    python benchmarks/network_tasks.py [--networks densenet121 swin_t ecapa_tdnn mobilevit_xs resnet50]

Prints, per network, the export time (shared by both), the two lowering-and-extraction
times and their ratio; exits non-zero if the tasks differ.
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", nargs="+",
                        default=["densenet121", "swin_t", "ecapa_tdnn", "mobilevit_xs", "resnet50"])
    args = parser.parse_args()

    import tvm
    from tvm.s_tir import meta_schedule as ms

    from pipeline.core.identity import task_id
    from pipeline.workloads import zoo

    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})

    def tasks(mod, fold_in_numpy: bool) -> tuple[dict, float]:
        start = time.perf_counter()
        found = ms.relax_integration.extract_tasks(zoo.fuse(mod, fold_in_numpy=fold_in_numpy), target)
        seconds = time.perf_counter() - start
        return {task_id(zoo.as_main(t.dispatched[0])): int(t.weight) for t in found}, seconds

    print(f"{'network':<14} {'tasks':>5} {'export s':>9} {'FoldConstant s':>15} {'NumPy fold s':>13} {'ratio':>7}")
    same, total_old, total_new = True, 0.0, 0.0
    for name in args.networks:
        start = time.perf_counter()
        mod = zoo.export(name)
        export_s = time.perf_counter() - start
        old, old_s = tasks(mod, fold_in_numpy=False)
        new, new_s = tasks(mod, fold_in_numpy=True)
        same &= old == new
        total_old, total_new = total_old + old_s, total_new + new_s
        print(f"{name:<14} {len(new):>5} {export_s:>9.1f} {old_s:>15.1f} {new_s:>13.1f} {old_s / new_s:>6.1f}x"
              + ("" if old == new else "  TASKS DIFFER"), flush=True)
    print(f"{'all':<14} {'':>5} {'':>9} {total_old:>15.1f} {total_new:>13.1f} {total_old / total_new:>6.1f}x")
    if not same:
        print("network_tasks: the two lowerings gave different tasks", file=sys.stderr)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
