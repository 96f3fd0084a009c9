"""The workspace's MetaSchedule JSON database, read line by line and rebuilt from the tables.

`ms.database.JSONDatabase` refuses a whole file when one line is corrupt; a dataset of
hours of measurements must not be lost to one bad line, so lines are parsed here one at
a time (as bytes: damaged text is a bad line too) and bad ones are reported with their
file and line number and skipped.

The tuning records are derived data: `candidates/` holds every sampled trace and
`measurements/` every run time, so `sync_records` can always make the record files agree
with them. It keeps the lines that are right, puts the latest run times in, and writes
back, from the tables, every record that a file lost; a line it takes out (corrupt, or
pointing at no workload) is kept, with the reason, in `<file>.removed`. New records are
serialized by MetaSchedule itself (`new_record_lines`) into a scratch database, so no
stage ever has to load a record file that might hold a bad line.
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from pipeline.core import identity
from pipeline.core.locks import file_lock
from pipeline.core.workspace import Workspace, atomic_write_bytes

log = logging.getLogger(__name__)

# MetaSchedule's run time for a candidate that failed to build or run.
FAILED_RUN_SECS = 1e10
# How to rebuild database_workload.json (it keeps every record: see sync_records).
REPAIR_WORKLOADS = "rebuild it with `python -m pipeline stage=tasks force=true` (every record is kept)"


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class RecordLine:
    workload_index: int
    trace: list  # the trace as JSON (instructions, decisions)
    run_secs: list | None
    target: dict | None
    args_info: list | None
    file: str | None
    line_no: int | None
    raw: str | None = None  # the line as read; None once something in it changed

    @property
    def trace_text(self) -> str:
        return _dumps(self.trace)

    def record_id(self, task_id: str) -> str:
        return identity.record_id(task_id, self.trace_text)

    def to_line(self) -> str:
        if self.raw is not None:
            return self.raw
        return _dumps([self.workload_index, [self.trace, self.run_secs, self.target, self.args_info]])


@dataclass
class BadLine:
    file: str
    line_no: int
    reason: str
    raw: bytes = b""

    def __str__(self) -> str:
        return f"{self.file}:{self.line_no}: {self.reason}"


class WorkloadLines(list):
    """database_workload.json, one entry per non-blank line (the index that records and
    `tasks.workload_index` use): `[structural_hash, workload_json]`, or None for a line that
    cannot be read (`bad` says why)."""

    def __init__(self, lines, bad: dict[int, BadLine]):
        super().__init__(lines)
        self.bad = bad


def record_files(ws: Workspace) -> list[Path]:
    """The main tuning-record file and any per-shard ones (`..._record.shard-K.json`)."""
    files = [ws.db_tuning_record] + sorted(ws.root.glob("database_tuning_record.shard-*.json"))
    return [f for f in files if f.exists()]


def shard_record_file(ws: Workspace, shard_index: int, shard_count: int) -> Path:
    if shard_count <= 1:
        return ws.db_tuning_record
    return ws.root / f"database_tuning_record.shard-{shard_index}.json"


#: a MetaSchedule JSON database's two files, as a workspace keeps them; a dataset release
#: and a kept tuning run keep them gzipped (`<name>.gz`; the releases before
#: zoo_ops-llvm-epyc2-v8 as they are until `release.compact` gzips them)
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def write_gzipped(path: Path, data: bytes) -> None:
    """`data` gzipped into `path` with no time stamp, so the same database packs to the same bytes."""
    atomic_write_bytes(path, gzip.compress(data, mtime=0))


def read_bytes(path: Path) -> bytes:
    """A file's bytes, gunzipped if its name ends in .gz."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if Path(path).suffix == ".gz" else data


def database_file(folder: Path, name: str) -> Path:
    """The database file `name` (of DATABASE_FILES) in `folder`: gzipped if it is kept so."""
    packed = folder / f"{name}.gz"
    return packed if packed.exists() else folder / name


def unpack_database(folder: Path, dest: Path) -> list[Path]:
    """The database of `folder` (gzipped or not) into `dest` as a workspace keeps it, byte for
    byte; the paths of DATABASE_FILES there, for `ms.database.JSONDatabase`."""
    paths = []
    for name in DATABASE_FILES:
        src = database_file(folder, name)
        if not src.exists():
            raise FileNotFoundError(f"{src}: no MetaSchedule database file here ({name} or {name}.gz)")
        paths.append(dest / name)
        atomic_write_bytes(paths[-1], read_bytes(src))
    return paths


def nonblank_lines(path: Path):
    """(line number, bytes) of every non-blank line of a file (gunzipped if it ends in .gz)."""
    for i, line in enumerate(read_bytes(path).split(b"\n"), 1):
        if line.strip():
            yield i, line.rstrip(b"\r")


def shift_record_line(line: str, workload_index: dict[int, int]) -> str | None:
    """A tuning-record line pointing at its workload's new index (`workload_index`: old ->
    new), or None when its workload is not kept: a release that extends another renumbers
    the workloads it holds (pipeline/core/release.py)."""
    value = json.loads(line)
    if value[0] not in workload_index:
        return None
    return _dumps([workload_index[value[0]], *value[1:]])


def _decode(line: bytes):
    """A line's JSON value; ValueError (UnicodeDecodeError, JSONDecodeError) when it has none."""
    return json.loads(line.decode("utf-8"))


def read_workload_lines(ws: Workspace) -> WorkloadLines:
    """database_workload.json line by line; a bad line is logged with its file and line
    number and its entry is None (the tasks on it are skipped by the stages)."""
    out, bad = [], {}
    for i, line in nonblank_lines(ws.db_workload):
        try:
            value = _decode(line)
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
                raise ValueError("expected [structural_hash, workload]")
            out.append(value)
        except ValueError as e:
            bad[len(out)] = BadLine(str(ws.db_workload), i, f"corrupted workload line ({_reason(e)})", line)
            log.warning("%s; %s", bad[len(out)], REPAIR_WORKLOADS)
            out.append(None)
    return WorkloadLines(out, bad)


def usable_tasks(tasks: pd.DataFrame, workloads: WorkloadLines, stage: str) -> pd.DataFrame:
    """The tasks whose workload line can be read; the others are named once, with the fix."""
    ok = tasks["workload_index"].map(lambda i: 0 <= int(i) < len(workloads) and workloads[int(i)] is not None)
    for t in tasks[~ok].itertuples():
        where = workloads.bad.get(int(t.workload_index))
        log.warning("stage=%s skips task %s (%s) and its records: %s; %s", stage, t.name, t.task_id,
                    where or f"{len(workloads)} workload lines, none at index {t.workload_index}", REPAIR_WORKLOADS)
    return tasks[ok]


def read_record_lines(files: list[Path]) -> tuple[list[RecordLine], list[BadLine]]:
    good, bad = [], []
    for f in files:
        for i, line in nonblank_lines(f):
            try:
                idx, body = _decode(line)
                trace, run_secs, target, args_info = (list(body) + [None] * 4)[:4]
                if not isinstance(idx, int) or idx < 0 or not (isinstance(trace, list) and len(trace) == 2):
                    raise ValueError("expected [workload_index, [trace, run_secs, target, args_info]]")
                if run_secs is not None and not (isinstance(run_secs, list) and
                                                 all(isinstance(x, (int, float)) for x in run_secs)):
                    raise ValueError("run_secs is not a list of numbers")
                good.append(RecordLine(idx, trace, run_secs, target, args_info, str(f), i, line.decode()))
            except (ValueError, TypeError) as e:
                bad.append(BadLine(str(f), i, f"corrupted tuning record ({_reason(e)})", line))
    for b in bad:
        log.warning("skipping %s", b)
    return good, bad


def _reason(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at column {e.start + 1}"
    return f"{type(e).__name__}: {e}"[:200]


def load_workload_mod(workload_line: list):
    """IRModule of one workload line (TVM imported lazily: workers call this)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    if workload_line is None:
        raise ValueError(f"corrupted workload line: {REPAIR_WORKLOADS}")
    return ms.database.Workload.from_json(workload_line).mod


def load_trace(workload_line: list, record: list):
    """A Trace object from a record's JSON (trace, run_secs, target, args_info)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    wl = ms.database.Workload.from_json(workload_line)
    return ms.database.TuningRecord.from_json(record, wl).trace


def new_record_lines(workload_index: int, mod, traces: list, target) -> list[RecordLine]:
    """Tuning records of `traces` on one workload, serialized by MetaSchedule's JSONDatabase
    (into a scratch database: the workspace's own files are not read) and numbered with
    the workspace's `workload_index`."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms

    with tempfile.TemporaryDirectory(prefix="tuning-records-") as tmp:
        db = ms.database.JSONDatabase(f"{tmp}/workload.json", f"{tmp}/records.json", allow_missing=True)
        workload = db.commit_workload(mod)
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        for trace in traces:
            db.commit_tuning_record(ms.database.TuningRecord(trace, workload, None, target, args_info))
        lines, bad = read_record_lines([Path(tmp) / "records.json"]) if traces else ([], [])
    assert not bad, bad  # MetaSchedule's own output
    return [replace(r, workload_index=int(workload_index), file=None, line_no=None, raw=None) for r in lines]


def drop_record_lines(path: Path, workload_indices: set[int]) -> int:
    """Take the lines of these workloads out of a tuning-record file (what stage=sample
    force=true redraws); other lines, a bad one included, stay as they are. Returns how many
    went."""
    if not Path(path).exists() or not workload_indices:
        return 0
    with file_lock(path):
        kept, dropped = [], 0
        for _, raw in nonblank_lines(path):
            try:
                value = _decode(raw)
                if isinstance(value, list) and value and int(value[0]) in workload_indices:
                    dropped += 1
                    continue
            except (ValueError, TypeError):
                pass
            kept.append(raw)
        if dropped:
            atomic_write_bytes(Path(path), b"".join(line + b"\n" for line in kept))
        return dropped


def append_records(path: Path, lines: list[RecordLine]) -> None:
    """Add lines at the end of a record file (a line cut short by a crash stays its own line)."""
    if not lines:
        return
    text = "".join(r.to_line() + "\n" for r in lines).encode()
    with file_lock(path):
        with open(path, "ab") as f:
            if f.tell() and not _ends_with_newline(path):
                f.write(b"\n")
            f.write(text)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


# ----------------------------------------------------------------------------- sync


def sync_records(ws: Workspace, tasks: pd.DataFrame | None = None, *, fresh: bool = False) -> dict:
    """Make the tuning-record files agree with `candidates/` and `measurements/`.

    Every sampled candidate of a task in `tasks` (default: tasks.parquet) gets exactly one
    line, carrying the run times of its latest measurement (MetaSchedule's 1e10 when that
    failed) or none before it is measured. Lines that are right stay as they are (and
    where they are), and so do lines of no candidate (records added by other means);
    duplicates go; corrupt lines and lines that point past the workload
    file go to `<file>.removed` with the reason; candidates that no file holds are written
    from the tables into the main file. `fresh=True` (after database_workload.json was
    rebuilt, when old workload indices mean nothing) writes every candidate's line anew
    and moves the lines of no candidate to `<file>.removed`. A file whose content does not
    change is not rewritten. Returns counts."""
    if tasks is None:
        if not ws.tasks.exists():
            return {}
        tasks = ws.read("tasks")
    if not ws.db_workload.exists():
        return {}
    with file_lock(ws.db_tuning_record):
        return _sync(ws, tasks, fresh)


@dataclass
class _Scan:
    """The record files read line by line: each record once, the lines each file keeps, the
    lines it loses (kept aside in `.removed`), and the (target, args_info) MetaSchedule wrote
    per workload, to write lost lines back the same way."""
    workloads: list
    workload_file: str
    task_of_index: dict[int, str]
    wanted: set[str]
    run_secs: dict
    fresh: bool
    counts: dict
    seen: set[str] = field(default_factory=set)
    ids: dict[int, str] = field(default_factory=dict)  # id(line) -> record id
    templates: dict[int, tuple] = field(default_factory=dict)  # workload index -> (target, args_info)

    def file(self, f: Path) -> list[RecordLine]:
        lines, bad = read_record_lines([f]) if f.exists() else ([], [])
        removed, kept = list(bad), []
        for r in lines:
            if r.workload_index >= len(self.workloads):
                removed.append(BadLine(str(f), r.line_no, f"workload index {r.workload_index} is past the "
                                                            f"{len(self.workloads)} lines of {self.workload_file}",
                                       r.raw.encode()))
                continue
            rid = r.record_id(self.task_of_index.get(r.workload_index, ""))
            if rid in self.seen:
                self.counts["duplicates"] += 1
                continue
            if self.fresh and rid not in self.wanted:
                removed.append(BadLine(str(f), r.line_no, "no candidate of this workspace has this trace on this "
                                                          "workload (database_workload.json was rebuilt)",
                                       r.raw.encode()))
                continue
            self.seen.add(rid)
            self.ids[id(r)] = rid
            if r.target is not None and r.args_info is not None:
                self.templates.setdefault(r.workload_index, (r.target, r.args_info))
            if self.fresh:
                continue  # written anew, from the tables
            secs = self.run_secs.get(rid)
            if rid in self.wanted and secs != r.run_secs:  # a candidate's line says what measurements/ says
                r.run_secs, r.raw = secs, None
                self.counts["updated"] += 1
            kept.append(r)
        if removed:
            _keep_removed(f, removed)
            self.counts["removed"] += len(removed)
        return kept


def _sync(ws: Workspace, tasks: pd.DataFrame, fresh: bool) -> dict:
    workloads = read_workload_lines(ws)
    tasks = tasks[tasks["workload_index"].map(lambda i: 0 <= int(i) < len(workloads))]
    task_of_index = dict(zip(tasks["workload_index"].astype(int), tasks["task_id"]))
    cands = ws.read("candidates", columns=["record_id", "task_id", "trace_json"])
    cands = cands[cands["trace_json"].notna() & cands["task_id"].isin(set(task_of_index.values()))]
    cands = cands.drop_duplicates("record_id")
    run_secs = measured_run_secs(ws)
    counts = dict(lines=0, measured=0, updated=0, rebuilt=0, duplicates=0, removed=0)
    files = record_files(ws)
    if ws.db_tuning_record not in files:
        files.insert(0, ws.db_tuning_record)
    scan = _Scan(workloads, ws.db_workload.name, task_of_index, set(cands["record_id"]), run_secs, fresh, counts)
    kept = {f: scan.file(f) for f in files}
    seen, ids = scan.seen, scan.ids
    missing = cands if fresh else cands[~cands["record_id"].isin(seen)]
    if len(missing):
        index_of = {t: i for i, t in task_of_index.items()}
        rebuilt = _lines_from_tables(missing, index_of, run_secs, scan.templates, workloads, tasks)
        kept[ws.db_tuning_record] += [r for r, _ in rebuilt]
        ids.update((id(r), rid) for r, rid in rebuilt)
        counts["rebuilt"] = len(rebuilt) - (len(seen) if fresh else 0)
    for f, lines in kept.items():
        if f == ws.db_tuning_record or f.exists() or lines:
            atomic_write_bytes(f, "".join(r.to_line() + "\n" for r in lines).encode())
        counts["lines"] += len(lines)
    counts["measured"] = sum(1 for lines in kept.values() for r in lines if ids.get(id(r)) in run_secs)
    if counts["rebuilt"] > 0:
        log.info("%s: %d record(s) written back from candidates/ and measurements/", ws.db_tuning_record,
                 counts["rebuilt"])
    return counts


def measured_run_secs(ws: Workspace) -> dict[str, list]:
    """record_id -> the run times of its latest measurement ([1e10] when it failed)."""
    meas = ws.read("measurements", columns=["record_id", "run_secs", "error"])
    out = {}
    for r in meas.drop_duplicates("record_id", keep="last").itertuples():
        ok = pd.isna(r.error) and r.run_secs is not None and len(r.run_secs)
        out[r.record_id] = [float(x) for x in r.run_secs] if ok else [FAILED_RUN_SECS]
    return out


def _lines_from_tables(cands: pd.DataFrame, index_of: dict, run_secs: dict, templates: dict,
                       workloads: WorkloadLines, tasks: pd.DataFrame) -> list[tuple[RecordLine, str]]:
    """(line, record id) of candidate rows (the trace as sampled) with their measurements.
    A task whose workload line is corrupt waits for its repair (stage=tasks force=true)."""
    target_of = dict(zip(tasks["task_id"], tasks["target"]))
    out = []
    for task_id, group in cands.groupby("task_id", sort=False):
        wi = int(index_of[task_id])
        if wi not in templates:
            templates[wi] = _template(wi, workloads[wi], target_of.get(task_id))
        target, args_info = templates[wi]
        if target is None:
            continue
        out += [(RecordLine(wi, json.loads(c.trace_json), run_secs.get(c.record_id), target, args_info, None, None),
                 c.record_id) for c in group.itertuples()]
    return out


def _template(workload_index: int, workload_line: list | None, target_text: str | None) -> tuple:
    """(target, args_info) of a task's records, as MetaSchedule serializes them."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import Schedule

    from pipeline.shims.targets import make_target

    if workload_line is None or not target_text:
        return None, None
    mod = load_workload_mod(workload_line)
    line = new_record_lines(workload_index, mod, [Schedule(mod).trace], make_target(json.loads(target_text)))[0]
    return line.target, line.args_info


def _keep_removed(path: Path, removed: list[BadLine]) -> Path:
    """Append lines taken out of `path` to `<path>.removed`, each after a `# file:line: reason` line."""
    out = path.with_name(path.name + ".removed")
    with open(out, "ab") as f:
        for b in removed:
            f.write(f"# {b}\n".encode() + b.raw + b"\n")
    log.warning("%s: %d line(s) taken out and kept in %s (%s); the workspace's records are written back from "
                "candidates/ and measurements/", path, len(removed), out, "; ".join(str(b) for b in removed[:3]))
    return out
