"""TenSet's own programs as candidates of a workspace.

An Ansor record joined to a task of the workspace (`ansor_records.parquet`, written by
stage=download) is replayed on s_tir; the schedule's trace becomes a MetaSchedule tuning
record in the workspace's JSON database and a `candidates` row (strategy `tenset`), so
stage=replay builds it and stage=measure times it like any other candidate. A record
that cannot be replayed becomes a row with its error.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path


from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.tenset import replay as RP
from pipeline.compute.progress import progress
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace, read_table, write_json, write_part

log = logging.getLogger(__name__)

STRATEGY = "tenset"


def ansor_records_path(ws: Workspace):
    return ws.root / "ansor_records.parquet"


def add_records(ws: Workspace, shard: Shard, target: dict, *, tenset_root: Path | None = None,
                max_per_task: int | None = None, force: bool = False) -> dict:
    """Commits the workspace's replayable Ansor records as candidates (once each; all again with
    `force`) for the TVM `target` (a target dict); `tenset_root`: the TenSet copy whose DAGs give
    Ansor's stage order (None: the tutorial workloads registered in TVM only)."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.shims.targets import make_target

    tasks = read_table(ws.require(ws.tasks, "tasks"))
    path = ansor_records_path(ws)
    if not path.exists():
        log.info("%s does not exist (stage=download writes it); no TenSet candidates", path)
        return {"tenset_candidates": 0}
    kind = str(target["kind"])
    recs = read_table(path, S.ANSOR_RECORDS)
    recs = recs[recs["task_id"].isin(set(tasks["task_id"])) & (recs["target_kind"] == kind)]
    # Ansor record id -> candidate record id, for the records already added.
    index_path = ws.root / "tenset_candidates.json"
    index = json.loads(index_path.read_text()) if index_path.exists() and not force else {}
    if max_per_task:
        recs = recs.sort_values("label", ascending=False).groupby("task_id").head(int(max_per_task))
    tvm_target = make_target(target)
    workloads = D.read_workload_lines(ws)
    by_task = tasks.set_index("task_id")
    out_file = D.shard_record_file(ws, shard.index, shard.count)
    usable = set(D.usable_tasks(tasks, workloads, "sample")["task_id"])
    rows, lines, added, failed = [], [], 0, 0
    for rec in progress(list(recs.itertuples()), desc="tenset", unit="record"):
        if rec.record_id in index or rec.task_id not in usable:
            continue
        wi = int(by_task.loc[rec.task_id, "workload_index"])
        workload = ms.database.Workload.from_json(workloads[wi])
        try:
            sch = replay_on(workload.mod, rec.workload_key, json.loads(rec.steps_json), kind, tenset_root)
        except Exception as e:  # noqa: BLE001 - a record that cannot be replayed is a row
            failed += 1
            rid = index[rec.record_id] = f"{rec.task_id}-ansor-{rec.record_id}"
            rows.append(dict(record_id=rid, task_id=rec.task_id, strategy=STRATEGY,
                             error=f"tenset replay ({rec.source}:{rec.line}): {e}"[:2000]))
            continue
        # The id comes from the line as MetaSchedule writes it, as for every other candidate.
        line = D.new_record_lines(wi, workload.mod, [sch.trace], tvm_target)[0]
        index[rec.record_id] = line.record_id(rec.task_id)
        rows.append(dict(record_id=index[rec.record_id], task_id=rec.task_id, strategy=STRATEGY,
                         trace_json=line.trace_text))
        lines.append(line)
        added += 1
    write_part(rows, S.CANDIDATES, ws.candidates, shard.index)  # candidates first, then the records
    D.append_records(out_file, lines)
    write_json(index_path, index)
    return {"tenset_candidates": added, "tenset_failed": failed}


def replay_on(mod, workload_key: str, steps: list, target_kind: str, tenset_root: Path | None = None):
    """The schedule of a workspace task's module after an Ansor record's steps.

    The DAG is rebuilt from the TenSet copy (or the registered tutorial workloads) for
    Ansor's stage order; its PrimFunc is the task's (same task id)."""
    from pipeline.core import identity
    from pipeline.tenset import join

    dag = _dag_cache(tenset_root, target_kind).get(workload_key) or join.dag_for_key(workload_key)
    if dag is None:
        raise RP.ReplayError(f"the compute of {workload_key[:80]} cannot be rebuilt")
    if identity.task_id(dag.mod()) != identity.task_id(mod):
        raise RP.ReplayError("the rebuilt DAG is not the workspace task's workload")
    return RP.replay(mod["main"], dag.ops, steps, target_kind)


_CACHE: dict = {}


def _dag_cache(root: Path | None, kind) -> dict:
    from pipeline.tenset import join

    if root is None:
        return {}
    key = (str(root), kind)
    if key not in _CACHE:
        _CACHE[key] = join.imported_dags(root, kind)
    return _CACHE[key]
