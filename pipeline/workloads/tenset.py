"""The TenSet dataset's tasks (network_info/*.task.pkl), rebuilt for today's TVM.

TenSet's task pickles were written by TVM 0.8's Ansor. They are read with a restricted
Unpickler (pipeline.tenset.unpickle), each ComputeDAG is rebuilt as TE from its JSON
graph and turned into a PrimFunc. Only pickles whose target kind matches the
workspace's are loaded (`target=llvm` takes the `,llvm).task.pkl` files); the target
itself is the workspace's (TenSet's `cuda` tasks are tuned for the configured GPU).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.tenset import dataset as DS
from pipeline.tenset import tasks as T
from pipeline.workloads.base import Workload

log = logging.getLogger(__name__)


def load(dataset, target, *, data: Path = Path("data"), **_) -> list[Workload]:
    """The tasks of TenSet's task pickles for `target`'s kind: `dataset.path` (or the copy under
    `data`), `dataset.networks` (all when empty)."""
    kind = str(target.kind.name)
    root = DS.resolve(dataset.get("path"), data)
    files = T.select(DS.task_files(root), kind, dataset.get("networks"))
    if not files:
        raise ValueError(f"{root} has no TenSet task file for target kind {kind!r} (names end in ',{kind}).task.pkl')")
    out, failed = [], 0
    for tf in files:
        tasks = T.read_task_file(tf)
        log.info("%s: %d tasks", tf.path.name, len(tasks))
        for t in tasks:
            if t.error:
                failed += 1
                log.error("%s task %s cannot be rebuilt and is left out: %s", tf.path.name, t.workload_key, t.error)
                continue
            out.append(Workload(
                name=t.workload_key, mod=t.mod(), network=t.network, weight=t.weight, source="tenset",
                extra=dict(workload_key=t.workload_key, shapes=t.shapes, task_file=tf.path.name),
            ))
    if failed:
        log.error("%d TenSet tasks could not be rebuilt (see above)", failed)
    return out
