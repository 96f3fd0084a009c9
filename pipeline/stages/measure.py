"""stage=measure: run every built kernel on the device, time it, check a sample.

`measure.mode` picks where the kernels run (pipeline/runner/modes.py): on the executor's
devices (`executor=local`: here; `executor=ray`: the measuring nodes of a Ray cluster,
one batch per machine at a time), in child processes of the kernel harness
(pipeline/core/harness.py, TVM runtime only), so a kernel that crashes or hangs becomes
an error row and the rest go on; or on a device host through an exported bundle whose
results are imported back. Run times are written back
into the workspace's MetaSchedule JSON database, which makes the workspace a
TenSet-style dataset that `ms.database.JSONDatabase` loads.
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
    """task_id -> its reference file (made once per task), relative to the workspace."""
    workloads = D.read_workload_lines(ws)
    out = {}
    for tid in sorted(task_ids):
        path = ws.references / f"{tid}.npz"
        if not path.exists():
            make_reference(D.load_workload_mod(workloads[int(tasks.loc[tid, "workload_index"])]),
                           json.loads(tasks.loc[tid, "args_json"]), path)
        out[tid] = os.path.relpath(path, ws.root)
    return out


def write_back(ws: Workspace, measured: pd.DataFrame) -> int:
    """Put run times into every tuning-record file; failed runs get MetaSchedule's 1e10."""
    tasks = ws.read("tasks")
    task_of_index = dict(zip(tasks["workload_index"], tasks["task_id"]))
    by_id = {r.record_id: r for r in measured.itertuples()}
    n = 0
    for f in D.record_files(ws):
        lines, bad = D.read_record_lines([f])
        for rec in lines:
            m = by_id.get(rec.record_id(task_of_index.get(rec.workload_index, "")))
            if m is None:
                continue
            rec.run_secs = list(m.run_secs) if pd.isna(m.error) and m.run_secs is not None else [D.FAILED_RUN_SECS]
            n += 1
        if bad:
            log.warning("%s: %d corrupted line(s) dropped while writing run times back", f, len(bad))
        D.rewrite_records(f, lines)
    return n


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
    counts = {"measured": 0, "failed": len(failed), "checked": 0, "incorrect": 0}
    task_of = {j["record_id"]: j["task_id"] for j in jobs}
    bar = tqdm(total=len(jobs), desc="measure", unit="kernel")
    for results in mode.results(jobs):
        for res in results:
            row = {k: v for k, v in res.items() if k != "event"}
            row.update(task_id=task_of[res["record_id"]], device=device)
            row.setdefault("checked", False)
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
    counts["written_back"] = write_back(ws, ws.read("measurements"))
    return counts
