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
    """Every task of one pickle, rebuilt as TE; a task that fails keeps its error text.

    A file that is not a TenSet task file as TenSet writes it raises a TaskFileError
    naming the file, what was wrong and what to do."""
    try:
        tasks, weights, kinds = _read(tf)
    except U.TaskFileError as e:
        hint = f"or leave network {tf.network} out (dataset.networks lists the networks to import)"
        raise type(e)(f"{e}, {hint}") from None
    if not tasks:
        log.info("%s holds no tasks (an empty TenSet task list); nothing to import", tf.path.name)
        return []
    out = []
    for task, w, kind in zip(tasks, weights, kinds):
        try:
            dag, err = G.rebuild(task.compute_dag.graph()), None
        except Exception as e:  # noqa: BLE001 - one task that cannot be rebuilt is reported, not fatal
            dag, err = None, f"{type(e).__name__}: {e}"
        out.append(ImportedTask(str(task.workload_key), tf.network, tf.shapes, w, kind, dag, err, tf.path.name))
    return out


def _read(tf: TaskFile) -> tuple[list, list[int], list[str]]:
    """(tasks, weights, target kinds) of a task file, each checked to be what TenSet writes:
    `([SearchTask, ...], [int, ...])` with string workload keys."""
    obj = U.load(tf.path)
    if not (isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(x, list) for x in obj)):
        raise U.damaged(tf.path, f"it holds {_kind_of(obj)}, not TenSet's ([tasks], [weights])")
    tasks, weights = obj
    if tasks and len(weights) != len(tasks):
        raise U.damaged(tf.path, f"{len(tasks)} tasks but {len(weights)} weights")
    kinds = []
    for i, (task, w) in enumerate(zip(tasks, weights)):
        if not isinstance(task, U.SearchTask):
            raise U.damaged(tf.path, f"task {i} is {_kind_of(task)}, not a SearchTask")
        fields = task.__dict__
        if not isinstance(fields.get("workload_key"), str):
            raise U.damaged(tf.path, f"task {i}: workload_key is {_kind_of(fields.get('workload_key'))}, not a string")
        dag = fields.get("compute_dag")
        if not (isinstance(dag, U.ComputeDAG) and isinstance(dag.__dict__.get("tensors"), str)):
            raise U.damaged(tf.path, f"task {i}: compute_dag is {_kind_of(dag)}, not a ComputeDAG with its JSON graph")
        if not (isinstance(w, int) and not isinstance(w, bool) and w >= 1):
            raise U.damaged(tf.path, f"task {i}: weight {w!r} is not a positive integer")
        target = fields.get("target")
        if isinstance(target, U.Target):
            try:
                kinds.append(target.kind())
            except Exception as e:  # noqa: BLE001 - any failure reading the target's JSON graph
                raise U.damaged(tf.path, f"task {i}: unreadable target ({type(e).__name__}: {e})") from None
        else:
            kinds.append(tf.target)
    return tasks, weights, kinds


def _kind_of(value) -> str:
    """`a list`, `a SearchTask`: what a value is, without printing it."""
    if value is None:
        return "missing"
    name = value.type_name if isinstance(value, U.TVMObject) else type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


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
