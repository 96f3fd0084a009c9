"""`python -m pipeline.tenset replay <record files> --tenset <dir>`: which Ansor records
replay on today's TVM, build for their target and compute the right result.

For each record whose compute can be rebuilt (a task of the TenSet copy with the same
workload key, or a registered tutorial workload), the steps are replayed on s_tir, the
schedule is built for the record's target kind, and the program (threads unbound for a
CUDA record) is run on the CPU against the unscheduled PrimFunc.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

from pipeline.core.errors import PipelineError


def _check(rec, dag, cuda_target: dict, numerics: bool) -> str:
    import numpy as np
    import tvm

    from pipeline.tenset import replay as RP

    func = dag.prim_func()
    sch = RP.replay(func, dag.ops, rec.steps, rec.target_kind)
    if rec.target_kind == "cuda":
        tvm.compile(sch.mod, target=tvm.target.Target(cuda_target))
        sch = RP.replay(func, dag.ops, rec.steps, rec.target_kind, bind_threads=False)
    if not numerics:
        return "built"
    cpu = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    rng = np.random.default_rng(0)
    arrays = [rng.uniform(-1, 1, [int(x) for x in t.shape]).astype(str(t.dtype)) for t in dag.tensors]
    outs = []
    for mod in (sch.mod, tvm.IRModule({"main": func})):
        args = [tvm.runtime.tensor(a) for a in arrays]
        tvm.compile(mod, target=cpu)["main"](*args)
        outs.append(args[-1].numpy())
    err = float(np.abs(outs[0] - outs[1]).max()) / (float(np.abs(outs[1]).max()) + 1.0)
    return "correct" if err < 1e-5 else f"WRONG (relative error {err:.2e})"


def replay_main(argv: list[str]) -> int:
    from pipeline.tenset import join
    from pipeline.tenset import records as R

    ap = argparse.ArgumentParser(prog="python -m pipeline.tenset replay", description=__doc__)
    ap.add_argument("files", nargs="+", type=Path, help="Ansor record files (JSON lines)")
    ap.add_argument("--tenset", type=Path, default=None, help="a TenSet copy (folder with network_info/)")
    ap.add_argument("--arch", default="sm_90a", help="CUDA arch for CUDA records (default sm_90a)")
    ap.add_argument("--no-numerics", action="store_true", help="replay and build only")
    a = ap.parse_args(argv)
    recs, errors = R.read_records(a.files)
    for e in errors:
        print(f"unreadable {e['source']}:{e['line']}: {e['error']}")
    dags = {}
    for kind in ("cuda", "llvm"):
        dags.update(join.imported_dags(a.tenset, kind))
    cuda = {"kind": "cuda", "arch": a.arch, "max_threads_per_block": 1024,
            "max_shared_memory_per_block": 49152, "thread_warp_size": 32}
    status, kinds_ok, kinds_fail = collections.Counter(), set(), collections.Counter()
    for rec in recs:
        dag = join.dag_for_key(rec.workload_key, dags)
        where = f"{rec.source}:{rec.line}"
        if dag is None:
            status["compute not rebuildable"] += 1
            continue
        t0 = time.time()
        try:
            res = _check(rec, dag, cuda, not a.no_numerics)
        except Exception as e:  # noqa: BLE001 - report every record
            res = f"FAILED: {e}"
            kinds_fail.update({s[0] for s in rec.steps})
        else:
            kinds_ok.update(s[0] for s in rec.steps)
        status[res.split(" (")[0].split(":")[0]] += 1
        print(f"{where:40s} {rec.target_kind:5s} {len(rec.steps):3d} steps  {time.time() - t0:6.1f}s  {res}")
    print(f"\n{len(recs)} records: " + ", ".join(f"{v} {k}" for k, v in sorted(status.items())))
    print("step kinds replayed: " + ", ".join(sorted(kinds_ok)))
    if kinds_fail:
        print("step kinds in failed records: " + ", ".join(f"{k} ({v})" for k, v in sorted(kinds_fail.items())))
    return 1 if any(k.startswith(("FAILED", "WRONG")) for k in status) else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("replay",):
        print(__doc__.strip())
        return 2
    try:
        return replay_main(argv[1:])
    except PipelineError as e:  # e.g. a damaged task pickle under --tenset: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
