"""stage=measure: run every built kernel on the device, time it, check a sample.

`measure.mode` picks where the kernels run (pipeline/runner/modes.py): on the executor's
devices (`executor=local`: here; `executor=ray`: the measuring nodes of a Ray cluster,
one batch per machine at a time), in child processes of the kernel harness
(pipeline/core/harness.py, TVM runtime only), so a kernel that crashes or hangs becomes
an error row and the rest go on; or on a device host through an exported bundle whose
results are imported back. Every row says where it was measured (`hardware`, CPU model
and count, GPU name and driver) and whether the CPU cache was flushed before each repeat
(`measure.cache_flush`). Run times are written back into the workspace's MetaSchedule
JSON database (`database.sync_records`), which makes the workspace a TenSet-style
dataset that `ms.database.JSONDatabase` loads.

A kernel whose library is missing is not measured (a lost file is not a slow kernel):
stage=replay builds it again, and the next measure run times it.
"""

from __future__ import annotations

import json
import logging
import os

import pandas as pd
from tqdm import tqdm

from pipeline.core import database as D
from pipeline.core import executor as E
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace
from pipeline.reference import make_reference
from pipeline.runner import modes

log = logging.getLogger(__name__)


def check_sample(kernels: pd.DataFrame, per_task: int) -> set:
    """Record ids whose outputs are compared with the reference (first few per task)."""
    if per_task <= 0:
        return set()
    ok = kernels[kernels["error"].isna()].sort_values("record_id")
    return set(ok.groupby("task_id").head(per_task)["record_id"])


def references(ws: Workspace, tasks: pd.DataFrame, task_ids: set) -> dict[str, str]:
    """task_id -> its reference file (made once per task), relative to the workspace; none
    for a task whose workload line is corrupt (its kernels are timed, not checked)."""
    if not task_ids:
        return {}
    workloads = D.read_workload_lines(ws)
    usable = set(D.usable_tasks(tasks.loc[sorted(task_ids)].reset_index(), workloads, "measure")["task_id"])
    out = {}
    for tid in sorted(task_ids & usable):
        path = ws.references / f"{tid}.npz"
        if not path.exists():
            make_reference(D.load_workload_mod(workloads[int(tasks.loc[tid, "workload_index"])]),
                           json.loads(tasks.loc[tid, "args_json"]), path)
        out[tid] = os.path.relpath(path, ws.root)
    return out


def run(cfg) -> dict:
    with E.create(cfg) as executor:
        return measure(cfg, executor)


def measure(cfg, executor: E.Executor) -> dict:
    ws = Workspace.from_cfg(cfg)
    mode = modes.create(str(cfg.measure.mode), cfg, ws, executor)
    shard = Shard.from_cfg(cfg)
    device = str(cfg.target.device)
    todo = ws.todo("measurements", ws.read("kernels", require=True), shard=shard, force=bool(cfg.force))
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
    to_check = check_sample(todo, int(cfg.measure.check_per_task))
    tasks = ws.read("tasks").set_index("task_id")
    refs = references(ws, tasks, set(todo[todo["record_id"].isin(to_check)]["task_id"]))
    jobs = [dict(record_id=r.record_id, task_id=r.task_id, artifact=r.artifact,
                 args=json.loads(tasks.loc[r.task_id, "args_json"]),
                 reference=refs.get(r.task_id) if r.record_id in to_check else None)
            for r in todo.itertuples()]
    if not mode.measures:
        for _ in mode.results(jobs):
            pass
        return mode.summary()
    counts = {"measured": 0, "failed": len(failed), "checked": 0, "incorrect": 0, "missing_library": len(lost)}
    job_of = {j["record_id"]: j for j in jobs}
    bar = tqdm(total=len(jobs), desc="measure", unit="kernel")
    for results in mode.results(jobs):
        for res in results:
            job = job_of[res["record_id"]]
            row = {k: v for k, v in res.items() if k != "event"}
            row.update(task_id=job["task_id"], device=device)
            row.setdefault("checked", False)
            if row.get("error") and mode.reads_libraries and not (ws.root / job["artifact"]).is_file():
                counts["missing_library"] += 1  # deleted while the stage ran: not a label
                continue
            if row.get("error"):
                counts["failed"] += 1
            else:
                counts["measured"] += 1
                counts["checked"] += int(bool(row["checked"]))
                counts["incorrect"] += int(row.get("correct") is False)
            out.add([row])
        out.flush()
        bar.update(len(results))
    bar.close()
    if counts["incorrect"]:
        log.warning("%d checked kernel(s) disagree with the unscheduled reference", counts["incorrect"])
    counts["written_back"] = D.sync_records(ws).get("measured", 0)
    return counts
