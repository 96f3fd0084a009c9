"""The measurements table from the harness's `done` events (stage=measure, and the
measurements of a device bundle imported by stage=collect)."""

from __future__ import annotations

import logging

from pipeline.core import database as D
from pipeline.device import harness
from pipeline.compute.progress import progress
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace
from pipeline.runner.jobs import kernel_jobs

log = logging.getLogger(__name__)


def measure(ws: Workspace, shard: Shard, mode) -> dict:
    """Measure the shard's kernels with `mode` (a run mode of pipeline/runner/modes.py, which
    imports this module) and write the measurements table (error rows for build failures and
    failed kernels, under the target's device name of the mode's settings) and the run times
    into the MetaSchedule database; `check_per_task` kernels of each task are checked against
    the unscheduled reference; force=true measures again. Returns the counts."""
    device, check_per_task, force = mode.settings.device_name, mode.settings.check_per_task, mode.settings.force
    mode.prepare()
    todo = ws.todo("measurements", ws.read("kernels", require=True), shard=shard, force=force)
    out = ws.writer("measurements", shard, flush_rows=1 << 30)  # flushed by hand: a part per batch of results
    # Build failures carry over as error rows: every record appears once in measurements.
    failed = todo[todo["error"].notna()]
    out.add(dict(record_id=r.record_id, task_id=r.task_id, device=device, error=r.error) for r in failed.itertuples())
    out.flush()
    todo = todo[todo["error"].isna()]
    lost = todo[~todo["artifact"].map(lambda a: (ws.root / a).is_file())] if mode.reads_libraries else todo[:0]
    if len(lost):
        log.warning("%d kernel(s) have no library under %s (lost since they were built): not measured; "
                    "`python -m pipeline stage=replay` builds them again", len(lost), ws.kernel_libs)
        todo = todo[~todo["record_id"].isin(set(lost["record_id"]))]
    jobs = kernel_jobs(ws, todo, int(check_per_task))
    if not mode.measures:
        for _ in mode.results(jobs):
            pass
        return mode.summary()
    counts = {"measured": 0, "failed": len(failed), "checked": 0, "incorrect": 0, "missing_library": len(lost),
              "timed_busy": 0}
    job_of = {j["record_id"]: j for j in jobs}
    bar = progress(total=len(jobs), desc="measure", unit="kernel")
    for results in mode.results(jobs):
        for res in results:
            job = job_of[res["record_id"]]
            row = {k: v for k, v in res.items() if k != "event"}
            row.update(task_id=job["task_id"], device=device)
            row.setdefault("checked", False)
            row.setdefault("rounds", 1)
            if row.get("error") and mode.reads_libraries and not (ws.root / job["artifact"]).is_file():
                counts["missing_library"] += 1  # deleted while the stage ran: not a label
                continue
            if row.get("error"):
                counts["failed"] += 1
            else:
                counts["measured"] += 1
                counts["checked"] += int(bool(row["checked"]))
                counts["incorrect"] += int(row.get("correct") is False)
                counts["timed_busy"] += int(harness.timed_busy(row))
            out.add([row])
        out.flush()
        bar.update(len(results))
    bar.close()
    if counts["timed_busy"]:
        log.warning("%d of %d kernels were timed while the load average was above the CPU count: other "
                    "processes shared the cores, so their run times are noisy labels (`load_avg` column; "
                    "benchmarks/measurement_noise.py measures how noisy). Measure on a quiet machine: "
                    "`python -m pipeline stage=measure force=true`", counts["timed_busy"], counts["measured"])
    if counts["incorrect"]:
        log.warning("%d checked kernel(s) disagree with the unscheduled reference", counts["incorrect"])
    counts["written_back"] = D.sync_records(ws).get("measured", 0)
    return counts
