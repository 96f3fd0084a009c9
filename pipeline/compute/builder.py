"""Builds: MetaSchedule's Builder for tuning in long-lived worker processes, and the replay
of one recorded trace into an exported kernel (`lib/<record_id>.so`), the per-item work
that stage=replay hands to its executor (pipeline/compute/executor.py).

Why a builder of our own: MetaSchedule's LocalBuilder starts fresh worker processes for
every batch, and each worker's first build imports `tvm.s_tir.tensor_intrin` (TVMScript
parsing of every tensor intrinsic: 30-100 s here, see pipeline/shims/tvm_compat.py), which
costs more than the builds of a 16-trial batch. `PersistentBuilder` runs the same build
and export functions (LocalBuilder's `default_build` / `default_export`) on TVM's
`PopenPoolExecutor`, as LocalBuilder does, but in workers that live as long as the
builder and import the intrinsics once, the fast way. The pool enforces the per-build
timeout inside each worker and replaces a worker that timed out or crashed, so a build
that hangs (LLVM can spend an hour on one huge unrolled loop) or kills its process
becomes an error result and nothing else is lost. Each worker dies with the process that
started it (`harness.die_with_parent`), so a replay or tuning run killed even with SIGKILL
leaves no build running behind it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder import local_builder as lb
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from pipeline.core import database as D
from pipeline.compute.executor import RECYCLE_AFTER
from pipeline.device.harness import die_with_parent, short_error
from pipeline.shims.tvm_compat import preload_tensor_intrin


def _worker_init(parent: int, preload_intrinsics: bool) -> None:
    die_with_parent(parent)
    if preload_intrinsics:
        preload_tensor_intrin()  # what default_build imports, once per worker and fast


def _build(mod, target, params) -> str:
    return lb.default_export(lb.default_build(mod, target, lb._deserialize_params(params)))


def build_record(job: dict, root: str) -> dict:
    """Replay one record: trace -> schedule -> tvm.compile -> `<root>/<job["artifact"]>`. Never raises.

    job: record_id, task_id, trace (JSON), workload (a database_workload.json line),
    target (dict), artifact (path relative to the workspace `root`)."""
    t0 = time.perf_counter()
    row = dict(record_id=job["record_id"], task_id=job["task_id"])
    try:
        mod = D.load_workload_mod(job["workload"])
        trace = D.load_trace(job["workload"], [job["trace"], None, None, None])
        sch = Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        lib = tvm.compile(sch.mod, target=tvm.target.Target(job["target"]))
        out = str(Path(root) / job["artifact"])
        tmp = f"{out}.{os.getpid()}.tmp.so"
        lib.export_library(tmp)
        os.replace(tmp, out)
        row.update(build_s=time.perf_counter() - t0, artifact=job["artifact"])
    except Exception as e:  # noqa: BLE001 - a candidate that fails to build is an error row
        row.update(build_s=time.perf_counter() - t0, error=short_error("build", e))
    return row


@derived_object
class PersistentBuilder(PyBuilder):
    """LocalBuilder's build and export in long-lived worker processes (see the module docstring):
    MetaSchedule's Builder interface, for tuning."""

    def __init__(self, max_workers: int = 2, timeout_sec: float = 60.0, recycle_after: int = RECYCLE_AFTER,
                 preload_intrinsics: bool = True):
        super().__init__()
        self.max_workers = max(1, int(max_workers))
        self.timeout_sec = float(timeout_sec)
        self.recycle_after = int(recycle_after)
        self.preload_intrinsics = bool(preload_intrinsics)
        self.pool = None

    def _pool(self) -> PopenPoolExecutor:
        if self.pool is None:
            self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                          initializer=_worker_init, initargs=(os.getpid(), self.preload_intrinsics),
                                          maximum_process_uses=self.recycle_after)
        return self.pool

    def build(self, build_inputs):
        args = [(b.mod, b.target, lb._serialize_params(b.params)) for b in build_inputs]
        out = []
        for r in self._pool().map_with_error_catching(lambda x: _build(*x), args):
            if r.status == StatusKind.COMPLETE:
                out.append(BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                out.append(BuilderResult(None, f"PersistentBuilder: timeout, killed after {self.timeout_sec:.0f} s"))
            else:
                out.append(BuilderResult(None, f"PersistentBuilder: an exception occurred\n{r.value}"))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

