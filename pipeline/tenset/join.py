"""Workload keys -> task ids: which imported task an Ansor record schedules."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def dag_for_key(key: str, imported: dict | None = None):
    """The DAG behind a workload key: a task imported from TenSet (by key) or a registered
    tutorial workload (`["matmul_add", ...]`); None when it cannot be rebuilt."""
    from pipeline.tenset import records as R
    from pipeline.tenset import registered

    if imported and key in imported:
        return imported[key]
    try:
        name, args = R.workload_args(key)
    except R.RecordError:
        return None
    return registered.dag_for(name, args)


def imported_dags(root: Path | None, target_kind: str) -> dict:
    """{workload key: DAG} of every task pickle of the target kind under `root`."""
    from pipeline.tenset import dataset as DS
    from pipeline.tenset import tasks as T

    out = {}
    if root is None or not DS.network_info_dirs(root):
        return out
    for tf in T.select(DS.task_files(root), target_kind):
        for t in T.read_task_file(tf):
            if t.dag is not None:
                out.setdefault(t.workload_key, t.dag)
    return out


def task_ids_for_keys(root: Path | None, target_kind: str, keys) -> dict[str, str]:
    """{workload key: task id} for the keys whose compute can be rebuilt."""
    from pipeline.core import identity

    dags = imported_dags(root, target_kind)
    out = {}
    for k in keys:
        dag = dag_for_key(k, dags)
        if dag is not None:
            out[k] = identity.task_id(dag.mod())
    return out
