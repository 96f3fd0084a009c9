"""The kernel jobs of a workspace: what the harness runs (measure, and the bundle's ncu step).

A job is `record_id`, `task_id`, `artifact` (the library, relative to the workspace),
`args` ([[dtype, shape], ...]) and `reference` (the task's reference .npz for the first
`check_per_task` records of each task, else None).
"""

from __future__ import annotations

import json
import os

import pandas as pd

from pipeline.core import database as D
from pipeline.core.workspace import Workspace
from pipeline.runner.reference import make_reference


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


def kernel_jobs(ws: Workspace, kernels: pd.DataFrame, check_per_task: int) -> list[dict]:
    """One job per built kernel of `kernels` (rows of the kernels table without error)."""
    to_check = check_sample(kernels, int(check_per_task))
    tasks = ws.read("tasks").set_index("task_id")
    refs = references(ws, tasks, set(kernels[kernels["record_id"].isin(to_check)]["task_id"]))
    return [dict(record_id=r.record_id, task_id=r.task_id, artifact=r.artifact,
                 args=json.loads(tasks.loc[r.task_id, "args_json"]),
                 reference=refs.get(r.task_id) if r.record_id in to_check else None)
            for r in kernels.itertuples()]
