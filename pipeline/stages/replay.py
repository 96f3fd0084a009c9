"""stage=replay: apply each record's trace to its workload, build it, export the kernel.

Builds run in worker processes over all cores (MetaSchedule's LocalBuilder does the
same). Results are written in small part files as they finish, so a run that is killed
keeps every finished kernel and the next run builds only what is missing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
import multiprocessing as mp

from tqdm import tqdm

from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.core.sharding import shard_of
from pipeline.core.targets import target_dict
from pipeline.core.workspace import Workspace, read_table, write_part

log = logging.getLogger(__name__)

# Seconds between part files at most (with replay.flush_rows, bounds what a kill can lose).
FLUSH_SECONDS = 10.0
# Allowance for a fresh worker process to import TVM before its first build.
STARTUP_S = 60.0


def build_one(job: dict) -> dict:
    """Worker: trace -> schedule -> tvm.compile -> exported library. Never raises."""
    t0 = time.perf_counter()
    row = dict(record_id=job["record_id"], task_id=job["task_id"])
    try:
        import tvm
        from tvm.s_tir import Schedule

        mod = D.load_workload_mod(job["workload"])
        trace = D.load_trace(job["workload"], [job["trace"], None, None, None])
        sch = Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        lib = tvm.compile(sch.mod, target=tvm.target.Target(job["target"]))
        out = job["artifact_abs"]
        tmp = f"{out}.{os.getpid()}.tmp.so"
        lib.export_library(tmp)
        os.replace(tmp, out)
        row.update(build_s=time.perf_counter() - t0, artifact=job["artifact"])
    except Exception as e:  # noqa: BLE001 - a candidate that fails to build is an error row
        msg = str(e).strip().splitlines()
        row.update(build_s=time.perf_counter() - t0, error=f"build: {type(e).__name__}: {msg[-1] if msg else ''}"[:2000])
    return row


def pending_jobs(cfg, ws: Workspace) -> tuple[list[dict], int]:
    cands = shard_of(read_table(ws.require(ws.candidates, "sample"), S.CANDIDATES), cfg)
    cands = cands[cands["error"].isna()]
    done = set()
    if ws.kernels.exists() and not cfg.force:
        done = set(read_table(ws.kernels, S.KERNELS)["record_id"])
    tasks = read_table(ws.tasks).set_index("task_id")
    workloads = D.read_workload_lines(ws)
    tdict = target_dict(cfg)
    jobs = []
    for c in cands.itertuples():
        if c.record_id in done:
            continue
        artifact = f"lib/{c.record_id}.so"
        jobs.append(dict(
            record_id=c.record_id, task_id=c.task_id, trace=json.loads(c.trace_json),
            workload=workloads[int(tasks.loc[c.task_id, "workload_index"])], target=tdict,
            artifact=artifact, artifact_abs=str(ws.root / artifact),
        ))
    return jobs, len(done)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    # The executor has no way to stop one task; its worker processes are killed instead.
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()


def build_all(jobs: list[dict], workers: int, on_rows, flush_rows: int = 16, timeout_s: float = 300.0,
              startup_s: float = STARTUP_S, desc: str = "replay") -> None:
    """Build `jobs` on `workers` processes; `on_rows(rows)` receives results in batches.

    A build that runs past `timeout_s` (LLVM can spend an hour on one huge unrolled loop)
    or whose worker dies becomes an error row; the builds in flight beside it are
    retried in a fresh pool."""
    buf, last = [], time.monotonic()

    def flush(force=False):
        nonlocal buf, last
        if buf and (force or len(buf) >= flush_rows or time.monotonic() - last > FLUSH_SECONDS):
            on_rows(buf)
            buf, last = [], time.monotonic()

    def fail(job, reason):
        buf.append(dict(record_id=job["record_id"], task_id=job["task_id"], error=f"build: {reason}"))
        bar.update()

    bar = tqdm(total=len(jobs), desc=desc, unit="kernel")
    queue = list(reversed(jobs))
    ctx = mp.get_context("spawn")
    while queue:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
        running: dict = {}  # future -> (job, submitted at)
        broken = None
        try:
            while queue or running:
                while queue and len(running) < workers:
                    job = queue.pop()
                    running[pool.submit(build_one, job)] = (job, time.monotonic())
                finished, _ = wait(list(running), timeout=1.0, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job, _ = running.pop(fut)
                    try:
                        buf.append(fut.result())
                        bar.update()
                    except BrokenProcessPool as e:
                        broken = e
                        fail(job, f"worker process crashed ({e})")
                if broken is None:
                    now = time.monotonic()
                    late = [f for f, (_, t) in running.items() if now - t > timeout_s + startup_s]
                    if late:
                        for f in late:
                            fail(running.pop(f)[0], f"timeout: not built within {timeout_s:g} s")
                        broken = "timeout"
                if broken is not None:
                    queue.extend(job for job, _ in running.values())  # innocent bystanders: retry
                    break
                flush()
        finally:
            if broken is not None:
                _kill_workers(pool)
            pool.shutdown(wait=broken is None, cancel_futures=True)
        flush(force=True)
    flush(force=True)
    bar.close()


def run(cfg) -> dict:
    ws = Workspace.from_cfg(cfg)
    if cfg.force and ws.kernels.exists():
        for p in ws.kernels.glob(f"part-{int(cfg.shard.index):04d}-*.parquet"):
            p.unlink()
    jobs, skipped = pending_jobs(cfg, ws)
    ws.kernel_libs.mkdir(parents=True, exist_ok=True)
    workers = int(cfg.jobs) or os.cpu_count() or 1
    t0 = time.time()
    counts = {"built": 0, "failed": 0}

    def on_rows(rows):
        write_part(rows, S.KERNELS, ws.kernels, int(cfg.shard.index))
        for r in rows:
            counts["failed" if r.get("error") else "built"] += 1

    if jobs:
        log.info("building %d kernels on %d workers (%d already built)", len(jobs), workers, skipped)
        build_all(jobs, workers, on_rows, int(cfg.replay.flush_rows), float(cfg.replay.timeout_s))
    wall = time.time() - t0
    return {"new": len(jobs), "built": counts["built"], "failed": counts["failed"], "skipped": skipped,
            "kernels_per_s": round(len(jobs) / wall, 2) if jobs and wall > 0 else 0.0}
