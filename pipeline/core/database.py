"""The workspace's MetaSchedule JSON database, read line by line.

`ms.database.JSONDatabase` refuses a whole file when one line is corrupt; a dataset of
hours of measurements must not be lost to one bad line, so lines are parsed here one at
a time and bad ones are reported with their file and line number.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.workspace import Workspace, atomic_write_bytes

log = logging.getLogger(__name__)

# MetaSchedule's run time for a candidate that failed to build or run.
FAILED_RUN_SECS = 1e10


@dataclass
class RecordLine:
    workload_index: int
    trace: list  # the trace as JSON (instructions, decisions)
    run_secs: list | None
    target: dict | None
    args_info: list | None
    file: str
    line_no: int

    @property
    def trace_text(self) -> str:
        return json.dumps(self.trace, separators=(",", ":"))

    def record_id(self, task_id: str) -> str:
        return hashlib.sha1(f"{task_id}\n{self.trace_text}".encode()).hexdigest()[:16]

    def to_line(self) -> str:
        body = [self.trace, self.run_secs, self.target, self.args_info]
        return json.dumps([self.workload_index, body], separators=(",", ":"))


@dataclass
class BadLine:
    file: str
    line_no: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line_no}: {self.reason}"


def record_files(ws: Workspace) -> list[Path]:
    """The main tuning-record file and any per-shard ones (`..._record.shard-K.json`)."""
    files = [ws.db_tuning_record] + sorted(ws.root.glob("database_tuning_record.shard-*.json"))
    return [f for f in files if f.exists()]


def shard_record_file(ws: Workspace, shard_index: int, shard_count: int) -> Path:
    if shard_count <= 1:
        return ws.db_tuning_record
    return ws.root / f"database_tuning_record.shard-{shard_index}.json"


def read_workload_lines(ws: Workspace) -> list[list]:
    """[structural_hash, workload_json] per line; a bad workload file is fatal (tasks owns it)."""
    out = []
    for i, line in enumerate(ws.db_workload.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{ws.db_workload}:{i}: corrupted workload line ({e}); rebuild it with "
                f"`python -m pipeline stage=tasks force=true`"
            ) from e
    return out


def read_record_lines(files: list[Path]) -> tuple[list[RecordLine], list[BadLine]]:
    good, bad = [], []
    for f in files:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                idx, body = json.loads(line)
                trace, run_secs, target, args_info = (list(body) + [None] * 4)[:4]
                if not isinstance(idx, int) or not isinstance(trace, list):
                    raise ValueError("expected [workload_index, [trace, run_secs, target, args_info]]")
                good.append(RecordLine(idx, trace, run_secs, target, args_info, str(f), i))
            except (ValueError, TypeError) as e:
                bad.append(BadLine(str(f), i, f"corrupted tuning record ({e})"))
    for b in bad:
        log.warning("skipping %s", b)
    return good, bad


def rewrite_records(path: Path, records: list[RecordLine]) -> None:
    atomic_write_bytes(path, ("\n".join(r.to_line() for r in records) + "\n").encode() if records else b"")


def load_workload_mod(workload_line: list):
    """IRModule of one workload line (TVM imported lazily: workers call this)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    return ms.database.Workload.from_json(workload_line).mod


def load_trace(workload_line: list, record: list):
    """A Trace object from a record's JSON (trace, run_secs, target, args_info)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    wl = ms.database.Workload.from_json(workload_line)
    return ms.database.TuningRecord.from_json(record, wl).trace
