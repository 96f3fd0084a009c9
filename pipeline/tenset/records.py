"""Ansor measure records (TenSet's `measure_records/*.json`, TVM tutorial logs).

One JSON object a line: `{"i": [[workload_key, target, hw_params?, target_host?,
layout_rewrite?, task_input_names?], [[], [steps...]]], "r": [[costs], error_no,
all_cost, timestamp], "v": "v0.6"}`. Versions before v0.5 carry fewer task fields;
`#` lines are comments. Labels follow TenSet: per task (workload key, target), the
best mean cost of the valid records divided by this record's mean cost.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

# Ansor's step kinds (record prefix -> name), as in auto_scheduler/transform_step.cc.
STEP_KINDS = {
    "AN": "annotation", "FU": "fuse", "PR": "pragma", "RE": "reorder", "SP": "split",
    "FSP": "follow_split", "FFSP": "follow_fused_split", "SA": "storage_align",
    "CA": "compute_at", "CI": "compute_inline", "CR": "compute_root", "CHR": "cache_read",
    "CHW": "cache_write", "RF": "rfactor",
}


class RecordError(ValueError):
    """A line is not an Ansor measure record."""


@dataclass
class Record:
    workload_key: str
    target: str
    steps: list
    costs: list[float]
    error_no: int
    all_cost: float
    timestamp: float
    version: str
    hardware_params: list | None = None
    task_input_names: list = field(default_factory=list)
    source: str = ""
    line: int = 0

    @property
    def target_kind(self) -> str:
        return self.target.split()[0] if self.target else ""

    @property
    def mean_cost(self) -> float | None:
        if self.error_no != 0 or not self.costs:
            return None
        return float(sum(self.costs) / len(self.costs))

    @property
    def record_id(self) -> str:
        text = json.dumps([self.workload_key, self.target, self.steps], separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def parse_line(text: str, source: str = "", line: int = 0) -> Record | None:
    """One record, or None for a blank or comment line."""
    text = text.strip()
    if not text or text.startswith("#"):
        return None
    try:
        obj = json.loads(text)
        inp, res = obj["i"], obj["r"]
        task, state = inp[0], inp[1]
        steps = state[1]
        costs, error_no, all_cost, timestamp = res[0], res[1], res[2], res[3]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise RecordError(f"{source}:{line}: not an Ansor measure record ({e})") from e
    for s in steps:
        if not isinstance(s, list) or not s or s[0] not in STEP_KINDS:
            raise RecordError(f"{source}:{line}: unknown transform step {s!r}")
    return Record(
        workload_key=str(task[0]), target=str(task[1]), steps=steps,
        costs=[float(c) for c in costs], error_no=int(error_no), all_cost=float(all_cost),
        timestamp=float(timestamp), version=str(obj.get("v", "")),
        hardware_params=task[2] if len(task) > 2 else None,
        task_input_names=list(task[5]) if len(task) > 5 else [], source=source, line=line,
    )


def read_records(paths: Iterable[str | Path], max_per_file: int | None = None) -> tuple[list[Record], list[dict]]:
    """Records of the given files (at most `max_per_file` from each), and one error row
    per line that does not parse."""
    records, errors = [], []
    for p in paths:
        p = Path(p)
        n = 0
        with open(p, "rb") as f:
            for i, raw in enumerate(f, 1):
                if max_per_file is not None and n >= int(max_per_file):
                    break
                try:
                    r = parse_line(raw.decode("utf-8"), p.name, i)
                except UnicodeDecodeError as e:
                    errors.append(dict(source=p.name, line=i, error=f"not UTF-8 text ({e.reason} at byte {e.start})"))
                    continue
                except RecursionError:
                    errors.append(dict(source=p.name, line=i, error="nested too deeply to be a record"))
                    continue
                except RecordError as e:
                    errors.append(dict(source=p.name, line=i, error=str(e)))
                    continue
                except (ValueError, TypeError, KeyError, IndexError) as e:  # a hostile line: its own error row
                    errors.append(dict(source=p.name, line=i, error=f"not a record ({type(e).__name__}: {e})"))
                    continue
                if r is not None:
                    records.append(r)
                    n += 1
    return records, errors


def workload_args(key: str) -> tuple[str, list]:
    """A workload key `["<hash or function>", args...]` as (name, args)."""
    try:
        v = json.loads(key)
    except ValueError as e:
        raise RecordError(f"workload key {key[:60]!r} is not JSON") from e
    if not isinstance(v, list) or not v or not isinstance(v[0], str):
        raise RecordError(f"workload key {key[:60]!r} is not [name, args...]")
    return v[0], v[1:]


def rows(records: list[Record], task_ids: dict[str, str] | None = None) -> list[dict]:
    """Table rows (schema ANSOR_RECORDS) with TenSet's per-task normalized label."""
    task_ids = task_ids or {}
    best: dict[tuple, float] = {}
    for r in records:
        m = r.mean_cost
        if m is not None and m > 0:
            k = (r.workload_key, r.target)
            best[k] = min(best.get(k, m), m)
    out = []
    for r in records:
        m = r.mean_cost
        b = best.get((r.workload_key, r.target))
        out.append(dict(
            record_id=r.record_id, task_id=task_ids.get(r.workload_key), workload_key=r.workload_key,
            target=r.target, target_kind=r.target_kind, version=r.version,
            steps_json=json.dumps(r.steps, separators=(",", ":")), n_steps=len(r.steps),
            step_kinds=",".join(sorted({s[0] for s in r.steps})), costs_s=r.costs,
            mean_s=m, min_s=min(r.costs) if m is not None else None, error_no=r.error_no,
            all_cost_s=r.all_cost, timestamp=r.timestamp,
            label=(b / m) if (m is not None and m > 0 and b is not None) else None,
            source=r.source, line=r.line,
        ))
    return out
