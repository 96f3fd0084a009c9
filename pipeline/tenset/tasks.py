"""TenSet task pickles -> tasks on today's TVM (PrimFuncs, weights, networks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.tenset import graph as G
from pipeline.tenset import unpickle as U
from pipeline.tenset.dataset import TaskFile

log = logging.getLogger(__name__)


@dataclass
class ImportedTask:
    workload_key: str
    network: str
    shapes: str
    weight: int
    target_kind: str
    dag: G.DAG | None
    error: str | None = None
    source_file: str = ""

    def mod(self):
        return self.dag.mod()


def read_task_file(tf: TaskFile) -> list[ImportedTask]:
    """Every task of one pickle, rebuilt as TE; a task that fails keeps its error text."""
    obj = U.load(tf.path)
    if not (isinstance(obj, tuple) and len(obj) == 2):
        raise U.UnsafePickleError(f"{tf.path.name}: expected (tasks, weights), got {type(obj).__name__}")
    tasks, weights = obj
    if not tasks:
        log.info("%s holds no tasks (an empty TenSet task list); nothing to import", tf.path.name)
        return []
    if len(weights) != len(tasks):
        raise U.UnsafePickleError(f"{tf.path.name}: {len(tasks)} tasks but {len(weights)} weights")
    out = []
    for task, w in zip(tasks, weights):
        if not isinstance(task, U.SearchTask):
            raise U.UnsafePickleError(f"{tf.path.name}: a task is a {type(task).__name__}, not a SearchTask")
        key = str(task.workload_key)
        kind = task.target.kind() if isinstance(getattr(task, "target", None), U.Target) else tf.target
        try:
            dag, err = G.rebuild(task.compute_dag.graph()), None
        except Exception as e:  # noqa: BLE001 - one task that cannot be rebuilt is reported, not fatal
            dag, err = None, f"{type(e).__name__}: {e}"
        out.append(ImportedTask(key, tf.network, tf.shapes, int(w), kind, dag, err, tf.path.name))
    return out


def select(files: list[TaskFile], target_kind: str, networks=None) -> list[TaskFile]:
    """Task files for the workspace's target kind (and the chosen networks)."""
    nets = {str(n) for n in networks} if networks else None
    out = [f for f in files if f.target.split()[0] == target_kind]
    if nets is not None:
        known = {f.network for f in out}
        missing = nets - known
        if missing:
            raise ValueError(
                f"dataset.networks: {sorted(missing)} have no {target_kind} task file; "
                f"available: {sorted(known)}"
            )
        out = [f for f in out if f.network in nets]
    return out
