"""`python -m pipeline.tenset replay <record files> --tenset <dir>`: which Ansor records
replay on today's TVM, build for their target and compute the right result.

For each record whose compute can be rebuilt (a task of the TenSet copy with the same
workload key, or a registered tutorial workload), the steps are replayed on s_tir, the
schedule is built for the record's target kind, and the program (threads unbound for a
CUDA record) is run on the CPU against the unscheduled PrimFunc.

Record files are untrusted: a line that cannot be read, a workload that cannot be built and
a record whose check fails each become one line `<file>:<line>: ...` and the next record
goes on. Each check runs in a forked child within `--timeout-s` seconds and
`--max-memory-gib` of address space (past either, the child is killed or fails, and only
that record is lost).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.compute.executor import ForkedWorker


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


# What the forked checker reads (set before its first fork, so a child has it without pickling).
_STATE: dict = {}


def _mapped_bytes() -> int:
    """This process's virtual address space (VmSize), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def check_job(job: dict, root: str) -> str:
    """One record's check, in a forked child: its address space bounded to what the child
    maps already plus `max_bytes`, so a record that would allocate more fails with
    MemoryError (or kills only the child)."""
    import resource

    if "limit" not in _STATE:  # once per child: what it maps at the fork (TVM, LLVM) plus the bound
        _STATE["limit"] = _mapped_bytes() + int(job["max_bytes"])
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_STATE["limit"], hard))
    rec = _STATE["recs"][job["index"]]
    dag = _STATE["dags"][job["index"]]
    return _check(rec, dag, _STATE["cuda"], _STATE["numerics"])


def replay_main(argv: list[str]) -> int:
    from pipeline.tenset import join
    from pipeline.tenset import records as R

    ap = argparse.ArgumentParser(prog="python -m pipeline.tenset replay", description=__doc__)
    ap.add_argument("files", nargs="+", type=Path, help="Ansor record files (JSON lines)")
    ap.add_argument("--tenset", type=Path, default=None, help="a TenSet copy (folder with network_info/)")
    ap.add_argument("--arch", default="sm_90a", help="CUDA arch for CUDA records (default sm_90a)")
    ap.add_argument("--no-numerics", action="store_true", help="replay and build only")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="seconds one record may take (default 300)")
    ap.add_argument("--max-memory-gib", type=float, default=4.0,
                    help="address space one record's check may use, GiB (default 4)")
    a = ap.parse_args(argv)
    recs, errors = R.read_records(a.files)
    status, kinds_ok, kinds_fail = collections.Counter(), set(), collections.Counter()
    for e in errors:
        print(f"{e['source']}:{e['line']}: unreadable: {e['error']}")
        status["unreadable"] += 1
    dags = {}
    for kind in ("cuda", "llvm"):
        dags.update(join.imported_dags(a.tenset, kind))
    cuda = {"kind": "cuda", "arch": a.arch, "max_threads_per_block": 1024,
            "max_shared_memory_per_block": 49152, "thread_warp_size": 32}
    found = []
    for rec in recs:
        try:
            found.append(join.dag_for_key(rec.workload_key, dags))
        except Exception as e:  # noqa: BLE001 - a hostile key (wrong arguments, unknown dtype) is its own row
            print(f"{rec.source}:{rec.line}: FAILED: workload {rec.workload_key[:60]!r}: {type(e).__name__}: {e}")
            status["FAILED"] += 1
            found.append(False)
    _STATE.pop("limit", None)
    _STATE.update(recs=recs, dags=found, cuda=cuda, numerics=not a.no_numerics)
    worker = ForkedWorker()
    try:
        for i, rec in enumerate(recs):
            where = f"{rec.source}:{rec.line}"
            if found[i] is False:
                continue
            if found[i] is None:
                status["compute not rebuildable"] += 1
                continue
            t0 = time.time()
            ok, res = worker.run(check_job, {"index": i, "max_bytes": int(a.max_memory_gib * 2**30)}, "",
                                 a.timeout_s)
            if not ok:
                res = f"FAILED: {res}"
                kinds_fail.update({s[0] for s in rec.steps})
            else:
                kinds_ok.update(s[0] for s in rec.steps)
            status[res.split(" (")[0].split(":")[0]] += 1
            print(f"{where:40s} {rec.target_kind:5s} {len(rec.steps):3d} steps  {time.time() - t0:6.1f}s  {res}",
                  flush=True)
    finally:
        worker.stop()
    print(f"\n{len(recs)} records: " + ", ".join(f"{v} {k}" for k, v in sorted(status.items())))
    print("step kinds replayed: " + ", ".join(sorted(kinds_ok)))
    if kinds_fail:
        print("step kinds in failed records: " + ", ".join(f"{k} ({v})" for k, v in sorted(kinds_fail.items())))
    return 1 if any(k.startswith(("FAILED", "WRONG", "unreadable")) for k in status) else 0


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
