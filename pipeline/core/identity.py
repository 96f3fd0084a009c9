"""Task, record and workspace identities: stable across processes, machines and folders."""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

from omegaconf import OmegaConf


def task_id(mod) -> str:
    """Structural hash of the workload, as 16 hex digits."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def trace_json(trace) -> str:
    """A trace (with its decisions) as canonical JSON text."""
    return json.dumps(_plain(trace.as_json()), separators=(",", ":"))


def record_id(task: str, trace_text: str) -> str:
    return hashlib.sha1(f"{task}\n{trace_text}".encode()).hexdigest()[:16]


def tasks_digest(task_ids: Iterable[str], targets: Iterable[str]) -> str:
    """Content hash of a task table: its (task id, target) pairs, in any order, as 16 hex digits.

    A task id is the structural hash of the workload, so two task tables with the same
    workloads for the same target have one digest wherever their folders are."""
    lines = sorted(f"{t}\t{g}" for t, g in zip(task_ids, targets))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def workspace_id(dataset: str, target: str, digest: str) -> str:
    """A workspace's identity: dataset name, target name and the digest of its task table."""
    return hashlib.sha256(f"{dataset}\n{target}\n{digest}".encode()).hexdigest()[:16]


def selection(d, max_tasks: int | None, available: int) -> dict:
    """What picks a workspace's tasks, as stage=tasks records it: the name and source of the
    dataset config `d`, its keys named in `dataset.task_keys`, and how many of the `available`
    workloads `max_tasks` (`budget.max_tasks`) keeps (a larger budget that keeps them all selects
    the same tasks)."""
    out = {"dataset.name": str(d.name), "dataset.source": str(d.get("source"))}
    for key in d.get("task_keys") or []:
        value = d.get(key)
        out[f"dataset.{key}"] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if out["dataset.source"] == "release":  # a release's tasks are all of its tasks, whatever the budget
        out["available"] = int(available)
        return out
    out["budget.max_tasks"] = int(available) if max_tasks is None else min(int(max_tasks), int(available))
    out["available"] = int(available)
    return out


def selection_diff(recorded: dict, dataset, max_tasks: int | None) -> list[str]:
    """How the selection of the dataset config and budget differs from the one a workspace
    recorded (empty: none)."""
    now = selection(dataset, max_tasks, int(recorded.get("available", 0)))
    return [f"{k}={json.dumps(recorded.get(k))} there, {json.dumps(v)} in this run"
            for k, v in now.items() if k != "available" and recorded.get(k) != v]


def _plain(obj):
    """TVM FFI containers -> JSON-serialisable Python values."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    if isinstance(obj, (str, bool, int)) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj
    if hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes)):
        return [_plain(x) for x in obj]
    if isinstance(obj, tvm.tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tvm.tirx.FloatImm):
        return float(obj.value)
    return str(obj)
