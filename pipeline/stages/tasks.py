"""stage=tasks: the task table and the MetaSchedule workload database of a workspace.

force=true rebuilds both (the repair of a damaged database_workload.json) and then
writes the tuning records back from candidates/ and measurements/ with the new workload
indices (pipeline/core/database.py `sync_records`): no sampled or measured record is lost.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

import pandas as pd

from pipeline.core import database as D
from pipeline.core import identity
from pipeline.core.targets import make_target, target_dict, target_json
from pipeline.core.workspace import SELECTION_KEY, Workspace
from pipeline.workloads import args_of, flops_of, load_workloads

log = logging.getLogger(__name__)


def select_tasks(workloads: list, limit: int) -> list:
    """At most `limit` tasks: for networks, round-robin over networks, heaviest first
    (weight x FLOPs), so that a small budget still covers every network."""
    if not any(w.network for w in workloads):
        return workloads[:limit]
    by_net: dict[str, list] = {}
    for w in sorted(workloads, key=lambda w: -w.weight * max(flops_of(w.mod), 0.0)):
        by_net.setdefault(w.network, []).append(w)
    out, queues = [], list(by_net.values())
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out


def network_rows(workloads: list) -> list[dict]:
    """One row per (network, task): a task shared by two networks counts in both."""
    rows: dict[tuple, dict] = {}
    for w in workloads:
        key = (w.network, identity.task_id(w.mod))
        if key in rows:
            rows[key]["weight"] += int(w.weight)
        else:
            rows[key] = dict(network=w.network, task_id=key[1], name=w.name, weight=int(w.weight))
    return list(rows.values())


def run(cfg) -> dict:
    # TVM takes seconds to import: loaded when the stage runs, not when the CLI starts.
    from tvm.s_tir import meta_schedule as ms

    ws = Workspace.from_cfg(cfg, check=not cfg.force)  # force rebuilds it for this selection
    if ws.tasks.exists() and not cfg.force:
        tasks = ws.read("tasks")
        log.info("%s exists (%d tasks); force=true rebuilds it", ws.tasks, len(tasks))
        return {"tasks": len(tasks)}
    tdict = target_dict(cfg)
    target = make_target(tdict)
    workloads = load_workloads(cfg, target)
    available = len(workloads)
    limit = cfg.budget.max_tasks
    if limit is not None and len(workloads) > int(limit):
        workloads = select_tasks(workloads, int(limit))
    ws.root.mkdir(parents=True, exist_ok=True)
    ws.tasks.unlink(missing_ok=True)  # written last: until then the stage is not done, whatever stops it
    rows, index = [], {}
    with tempfile.TemporaryDirectory(dir=ws.root, prefix=".tasks-") as tmp:
        # Workloads go to a scratch database first; the records are never emptied.
        scratch = os.path.join(tmp, ws.db_workload.name)
        db = ms.database.JSONDatabase(scratch, os.path.join(tmp, "records.json"), allow_missing=True)
        for w in workloads:
            tid = identity.task_id(w.mod)
            if tid in index:  # the same workload from two places: one task, summed weight
                rows[index[tid]]["weight"] += w.weight
                continue
            db.commit_workload(w.mod)
            index[tid] = len(rows)
            rows.append(
                dict(task_id=tid, name=w.name, network=w.network, weight=int(w.weight), flops=flops_of(w.mod),
                     target=target_json(tdict), source=w.source, args_json=json.dumps(args_of(w.mod)),
                     workload_index=len(rows))
            )
        os.replace(scratch, ws.db_workload)
    # The workload indices may have moved: every record line is written anew from the tables.
    synced = D.sync_records(ws, pd.DataFrame(rows), fresh=True)
    ws.write("network_tasks", network_rows(workloads))
    ws.write("tasks", rows, metadata={SELECTION_KEY: json.dumps(identity.selection(cfg, available))})
    log.info("wrote %d tasks to %s", len(rows), ws.tasks)
    return {"tasks": len(rows), "records": synced.get("lines", 0)}
