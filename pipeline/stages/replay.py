"""stage=replay: apply each record's trace to its workload, build it, export the kernel.

Each build is a job of the executor (`executor=local`: worker processes over all cores,
TVM's PopenPoolExecutor as MetaSchedule's LocalBuilder; `executor=ray`: a Ray cluster,
the library coming back with the row); a build past `replay.timeout_s` or whose worker
dies is an error row. Rows are written in small part files as they finish, so a run that
is killed keeps every finished kernel and the next run builds only what is missing. A
kernel whose library has gone from `lib/` since it was built is built again (its old row
goes), so a lost file never becomes a failed measurement. Local build workers die with
this process, however it ends.
"""

from __future__ import annotations

import json
import logging
import os
import time


from pipeline.core import database as D
from pipeline.compute.progress import progress
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace
from pipeline.options import executor_of, shard_of, target_of, workspace_of

log = logging.getLogger(__name__)



def build_jobs(ws: Workspace, candidates, target: dict) -> list[dict]:
    """One `build_record` job per candidate, its library at `lib/<record_id>.so`; the
    candidates of a task whose workload line is corrupt are skipped (and named)."""
    tasks = ws.read("tasks", require=True)
    workloads = D.read_workload_lines(ws)
    index = D.usable_tasks(tasks, workloads, "replay").set_index("task_id")["workload_index"]
    return [dict(record_id=c.record_id, task_id=c.task_id, trace=json.loads(c.trace_json),
                 workload=workloads[int(index[c.task_id])], target=target, artifact=f"lib/{c.record_id}.so",
                 writes=[f"lib/{c.record_id}.so"])
            for c in candidates.itertuples() if c.task_id in index.index]


def lost_libraries(ws: Workspace) -> set[str]:
    """Record ids of kernels that were built but whose library is no longer in the workspace."""
    kernels = ws.read("kernels", columns=["record_id", "artifact", "error"])
    built = kernels[kernels["error"].isna() & kernels["artifact"].notna()]
    return {r.record_id for r in built.itertuples() if not (ws.root / r.artifact).is_file()}


def remove_stale_partial_libraries(ws: Workspace) -> int:
    """Delete `lib/<record>.so.<pid>.tmp.so` files of builds whose process is gone (a killed
    replay's half-written exports); a running build's file is left alone."""
    removed = 0
    for f in ws.kernel_libs.glob("*.tmp.so"):
        pid = f.name[:-len(".tmp.so")].rsplit(".", 1)[-1]
        try:
            os.kill(int(pid), 0)
            continue  # its build is still running
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        f.unlink(missing_ok=True)
        removed += 1
    return removed


def failed_build(job: dict, reason: str) -> dict:
    return dict(record_id=job["record_id"], task_id=job["task_id"], error=f"build: {reason}")


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    shard = shard_of(cfg)
    cands = ws.read("candidates", require=True)
    cands = shard.of(cands[cands["error"].isna()])
    # A task whose workload line is corrupt is skipped, and force=true leaves its rows alone.
    usable = D.usable_tasks(ws.read("tasks", require=True), D.read_workload_lines(ws), "replay")
    cands = cands[cands["task_id"].isin(set(usable["task_id"]))]
    lost = lost_libraries(ws) & set(cands["record_id"]) if not cfg.force else set()
    if lost:
        log.warning("%d built kernel(s) have lost their library under %s: built again", len(lost), ws.kernel_libs)
        ws.delete_rows("kernels", lost)
    todo = ws.todo("kernels", cands, shard=Shard(), force=bool(cfg.force))
    skipped = len(cands) - len(todo)
    jobs = build_jobs(ws, todo, target_of(cfg)) if len(todo) else []
    ws.kernel_libs.mkdir(parents=True, exist_ok=True)
    stale = remove_stale_partial_libraries(ws)
    if stale:
        log.info("removed %d half-written librar%s of an interrupted replay", stale, "y" if stale == 1 else "ies")
    t0 = time.time()
    counts = {"built": 0, "failed": 0}
    if jobs:
        # TVM takes seconds to import: loaded when there is something to build.
        from pipeline.compute.builder import build_record

        with executor_of(cfg) as executor:
            log.info("building %d kernels on %s (%d already built)", len(jobs), executor.describe(), skipped)
            bar = progress(total=len(jobs), desc="replay", unit="kernel")
            try:
                with ws.writer("kernels", shard, flush_rows=int(cfg.replay.flush_rows),
                               flush_s=float(cfg.replay.flush_s)) as out:
                    for rows in executor.map(build_record, jobs, root=ws.root, failed=failed_build,
                                             timeout_s=float(cfg.replay.timeout_s)):
                        out.add(rows)
                        for r in rows:
                            counts["failed" if r.get("error") else "built"] += 1
                        bar.update(len(rows))
            finally:
                bar.close()
    wall = time.time() - t0
    return {"new": len(jobs), "built": counts["built"], "failed": counts["failed"], "skipped": skipped,
            "rebuilt_lost": len(lost), "kernels_per_s": round(len(jobs) / wall, 2) if jobs and wall > 0 else 0.0}
