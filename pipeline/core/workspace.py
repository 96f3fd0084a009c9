"""A workspace's tables: where they live, how they are read, written (atomically) and resumed.

A workspace is one dataset on one target: `<paths.data>/<workspace>/`. Tables are named
in the catalog (pipeline/core/catalog.py). Per-item stages write part files
(`<table>/part-<shard>-<id>.parquet`, under `device=<d>/` for device-partitioned tables)
with `pyarrow.dataset.write_dataset`, so that an interrupted run keeps every finished part
and a multirun over shards needs no merge step; a table folder reads back as one table
with `pyarrow.dataset`. `Workspace.todo` is the one place that decides what a resumed or
forced run still has to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.core import identity, locks
from pipeline.core import schema as S
from pipeline.core.catalog import Table, table
from pipeline.core.errors import PipelineError
from pipeline.core.sharding import Shard

# Key of the dataset selection in tasks.parquet's file metadata (identity.selection).
SELECTION_KEY = b"pipeline.selection"

# Rows buffered by a part writer before it writes a part (bounds what a kill can lose).
FLUSH_ROWS = 16


class WorkspaceError(PipelineError):
    """A workspace lacks what a stage needs; the message says which stage to run."""


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    # Files of the stages, in data-flow order (the Parquet ones are also catalog tables).
    @property
    def tasks(self) -> Path:
        return self.path("tasks")

    @property
    def network_tasks(self) -> Path:
        return self.path("network_tasks")

    @property
    def db_workload(self) -> Path:
        return self.root / "database_workload.json"

    @property
    def db_tuning_record(self) -> Path:
        return self.root / "database_tuning_record.json"

    @property
    def candidates(self) -> Path:
        return self.path("candidates")

    @property
    def kernels(self) -> Path:
        return self.path("kernels")

    @property
    def kernel_libs(self) -> Path:
        """Exported kernels, `<record_id>.so` (kept apart from the Parquet folders)."""
        return self.root / "lib"

    @property
    def references(self) -> Path:
        return self.root / "references"

    @property
    def measurements(self) -> Path:
        return self.path("measurements")

    @property
    def features(self) -> Path:
        return self.root / "features"

    @property
    def history_file(self) -> Path:
        """`history.jsonl`: one line per finished run of a stage that writes the tables (the
        command, when, where, how long, what it did): the provenance a release carries."""
        return self.root / "history.jsonl"

    def add_history(self, entry: dict) -> None:
        """Append one entry to history.jsonl (one write of one line: whole or not at all)."""
        self.root.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(entry, default=str, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.history_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def history(self) -> list[dict]:
        """The entries of history.jsonl, oldest first (a damaged line is skipped)."""
        out = []
        try:
            lines = self.history_file.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def runs_on_tasks(self) -> list[dict]:
        """The entries of history.jsonl made on the present task table: those that recorded its
        digest (`tasks_digest`), and of those that recorded none (older lines) the ones since the last
        run that rebuilt the table (stage=tasks force=true). A workspace reused for one network
        after another thus gives each release the runs that made it, not its predecessors'."""
        history, digest = self.history(), self.tasks_digest()
        rebuilt = [i for i, e in enumerate(history) if e.get("stage") == "tasks" and e.get("force")]
        since = rebuilt[-1] if rebuilt else 0
        return [e for i, e in enumerate(history)
                if (e["tasks_digest"] == digest if e.get("tasks_digest") else i >= since)]

    # ------------------------------------------------------------------ identity

    def selection(self) -> dict | None:
        """The dataset selection that stage=tasks recorded with the task table (None: the
        table is missing, or older than the record)."""
        if not self.tasks.exists():
            return None
        raw = (pq.read_schema(self.tasks).metadata or {}).get(SELECTION_KEY)
        return json.loads(raw) if raw else None

    def check_selection(self, dataset, max_tasks: int | None) -> None:
        """Refuse a dataset config and budget whose selection differs from the one the workspace
        was built for: every table, run and model of the workspace would be labelled with a
        dataset it does not hold (`dataset.ops=[GMM]` on a workspace of 13 operators)."""
        recorded = self.selection()
        diff = identity.selection_diff(recorded, dataset, max_tasks) if recorded else []
        if diff:
            raise WorkspaceError(
                f"workspace {self.root} holds the tasks of another dataset selection ({'; '.join(diff)}). Give this "
                f"selection its own workspace (workspace=<name> or paths.data=<folder>), run with the workspace's "
                f"values, or rebuild it for this selection with `python -m pipeline stage=tasks force=true` and the "
                f"stages after it.")

    def tasks_digest(self, *, require: bool = False) -> str | None:
        """The content hash of the task table (`identity.tasks_digest`); None without one,
        unless `require`d (then the error that names the stage to run)."""
        if not require and not self.tasks.exists():
            return None
        tasks = self.read("tasks", require=require, columns=["task_id", "target"])
        return identity.tasks_digest(tasks["task_id"], tasks["target"])

    def identity(self, dataset: str, target: str) -> dict[str, str]:
        """Who the workspace is, wherever its folder lies: the names of its dataset and target and
        the content hash of its task table (`workspace_id` is a hash of the three)."""
        digest = self.tasks_digest(require=True)
        dataset, target = str(dataset), str(target)
        return {"workspace_id": identity.workspace_id(dataset, target, digest), "workspace.dataset": dataset,
                "workspace.target": target, "workspace.tasks_digest": digest}

    def require(self, path: Path, stage: str) -> Path:
        if not path.exists() or (path.is_dir() and not any(path.rglob("*.parquet"))):
            raise WorkspaceError(
                f"{path} does not exist: run `python -m pipeline stage={stage}` for workspace "
                f"'{self.name}' first (same dataset/target/paths.data overrides)."
            )
        return path

    # ------------------------------------------------------------------ catalog tables

    def path(self, name: str | Table, device: str | None = None) -> Path:
        """The file or folder of a table; for a device-partitioned table and a device, its partition."""
        t = table(name)
        p = self.root / t.path
        return p / f"{t.partition}={device}" if t.partition and device is not None else p

    def read(self, name: str | Table, device: str | None = None, *, require: bool = False,
             columns: Sequence[str] | None = None) -> pd.DataFrame:
        """A table as one DataFrame (empty with its columns when nothing is written yet);
        `require=True` stops with the stage to run when it is missing."""
        t = table(name)
        p = self.path(t, device)
        if require:
            self.require(p, t.stage)
        elif not p.exists():
            return empty_frame(t.schema, columns)
        return read_table(p, t.schema, columns=columns)

    def write(self, name: str | Table, rows: pd.DataFrame | Iterable[dict], metadata: dict | None = None) -> Path:
        """Write a single-file table (tasks.parquet, ...) as a whole, atomically, with extra
        file `metadata` (bytes keys and values) beside the schema's."""
        t = table(name)
        if t.is_folder:
            raise ValueError(f"table {t.name} is a folder of part files: write it with Workspace.writer")
        schema = t.schema.with_metadata({**(t.schema.metadata or {}), **metadata}) if metadata else t.schema
        return write_table(rows, schema, self.path(t))

    def todo(self, name: str | Table, items: pd.DataFrame, *, shard: Shard, force: bool,
             on: Sequence[str] | None = None, device: str | None = None, shard_by: str | None = None,
             clears: Sequence[str | Table] = (), retry_errors: bool = False) -> pd.DataFrame:
        """The items of `shard` that table `name` has no row for yet: what a stage still has to do.

        Items and table rows are matched on `on` (default: the table's key). force=True first
        deletes the rows of these items from the table and from `clears` (tables written along
        with it, matched on the key columns they share), so the items are redone; rows of
        anything else (other shards, a task the stage skips) stay. retry_errors=True: an item
        whose rows all carry an `error` is not done either (a failure that a new run may not
        repeat)."""
        t = table(name)
        items = shard.of(items, by=shard_by)
        keys = list(on or t.key)
        if force and len(items):
            for other in (t, *clears):
                self.delete_matching(other, items[keys].drop_duplicates(), device)
        done = self.read(t, device, columns=[*keys, "error"] if retry_errors else keys)
        if retry_errors and "error" in done.columns:
            done = done[done["error"].isna()]
        if done.empty or items.empty:
            return items
        if len(keys) == 1:
            return items[~items[keys[0]].isin(set(done[keys[0]]))]
        have = pd.MultiIndex.from_frame(done[keys])
        return items[~pd.MultiIndex.from_frame(items[keys]).isin(have)]

    def delete_rows(self, name: str | Table, keys: Iterable[str], device: str | None = None) -> int:
        """Delete the rows whose first key column is in `keys` from a table folder (of one
        device, or of every device); returns how many went (see `delete_matching`)."""
        t = table(name)
        return self.delete_matching(t, pd.DataFrame({t.key[0]: sorted(set(keys))}, dtype=object), device)

    def delete_matching(self, name: str | Table, items: pd.DataFrame, device: str | None = None) -> int:
        """Delete the rows of a table folder whose values in the columns of `items` (those the
        table has) match a row of `items`; each part that holds one is rewritten without it
        (atomically), a part left empty goes. Returns how many rows went."""
        t = table(name)
        folder = self.path(t, device)
        if items.empty or not folder.is_dir():
            return 0
        removed, wanted = 0, {}
        for f in part_files(folder):
            part = pq.ParquetFile(f)
            cols = tuple(c for c in items.columns if c in part.schema_arrow.names)
            if not cols:
                continue
            if cols not in wanted:
                wanted[cols] = pd.MultiIndex.from_frame(items[list(cols)].drop_duplicates().astype(str))
            keys = part.read(columns=list(cols)).to_pandas()
            hit = pd.MultiIndex.from_frame(keys[list(cols)].astype(str)).isin(wanted[cols])
            n = int(hit.sum())
            if not n:
                continue
            removed += n
            data = part.read()
            keep = data.filter(pa.array(~hit))
            if keep.num_rows:
                tmp = f.with_name(f".{f.name}.{uuid.uuid4().hex[:8]}.tmp")
                pq.write_table(keep, tmp)
                os.replace(tmp, f)
            else:
                f.unlink()
        return removed

    def stage_lock(self, stage: str, shard: Shard, wait_s: float | None = 0.0):
        """Held while a stage runs on this shard of the workspace (pipeline/core/locks.py)."""
        return locks.stage_lock(self.root, stage, shard.index, shard.count, wait_s)

    def writer(self, name: str | Table, shard: Shard | int = 0, device: str | None = None, *,
               schema: pa.Schema | None = None, flush_rows: int = FLUSH_ROWS,
               flush_s: float | None = None) -> "PartWriter":
        """A buffered part writer for one table and shard (and device, for partitioned tables)."""
        t = table(name)
        if t.partition and device is None:
            raise ValueError(f"table {t.name} is partitioned by {t.partition}: give the {t.partition}")
        schema = schema or t.schema
        if schema is None:
            raise ValueError(f"table {t.name} has no fixed schema: give the schema of its parts")
        index = shard.index if isinstance(shard, Shard) else int(shard)
        return PartWriter(self.root / t.path, schema, index, {t.partition: device} if t.partition else None,
                          flush_rows=flush_rows, flush_s=flush_s)

    def sink(self, shard: Shard | int = 0, device: str | None = None) -> "TableSink":
        """`sink(table, rows[, schema])` for the rows of several tables of one shard (and device)."""
        return TableSink(self, shard, device)


# ---------------------------------------------------------------------- writing


def umask() -> int:
    """The process's file mode creation mask (read, not changed, where Linux tells it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: the only way to read it is to set it (and put it back)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> bool:
    """Write `path` whole or not at all, with the mode a plain open() would give it (0666
    less the umask; mkstemp's own is 0600). A file that already holds `data` is left alone:
    its time stamp then still says when its content last changed. Returns whether it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def to_arrow(rows: pd.DataFrame | Iterable[dict], schema: pa.Schema) -> pa.Table:
    """Rows as a table of `schema` (extra columns dropped, missing ones null)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    cols = {}
    for field in schema:
        values = df[field.name] if field.name in df.columns else [None] * len(df)
        cols[field.name] = pa.array(list(values) if not isinstance(values, list) else values,
                                    type=field.type, from_pandas=True)
    return pa.table(cols, schema=schema)


def write_table(rows: pd.DataFrame | Iterable[dict], schema: pa.Schema, path: Path) -> Path:
    """Write rows with `schema` as one Parquet file, atomically."""
    data = to_arrow(rows, schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(data, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_part(rows: pd.DataFrame | list[dict], schema: pa.Schema, folder: Path, shard: int = 0,
               partition: dict[str, str] | None = None) -> Path | None:
    """Add one part file to a table folder (under `<col>=<value>/` for a partition); returns
    its path (None for no rows). The part appears whole or not at all: write_dataset writes
    it in a hidden staging folder that readers skip, then it is renamed into place."""
    if len(rows) == 0:
        return None
    data = to_arrow(rows, schema)
    partitioning = None
    if partition:
        for col, value in partition.items():
            data = data.append_column(col, pa.array([str(value)] * data.num_rows, pa.string()))
        partitioning = ds.partitioning(pa.schema([(c, pa.string()) for c in partition]), flavor="hive")
    folder = Path(folder)
    part_id = uuid.uuid4().hex[:12]
    staging = folder / f".staging-{part_id}"
    try:
        ds.write_dataset(data, staging, format="parquet", partitioning=partitioning, preserve_order=True,
                         basename_template=f"part-{shard:04d}-{part_id}-{{i}}.parquet")
        out = None
        for f in staging.rglob("*.parquet"):
            out = folder / f.relative_to(staging)
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, out)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM wait until the block is done: a part is written and its
    rows leave the buffer together, so an interrupt never writes them twice or drops them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are delivered to the main thread only
        return
    blocked = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class PartWriter:
    """Buffers rows of one table and writes them as part files of one shard: every
    `flush_rows` rows (or `flush_s` seconds) and on close, so that a killed run loses at
    most what is buffered. Use as a context manager: leaving the block for any reason
    (Ctrl-C, an error of the stage) writes what is buffered."""

    def __init__(self, folder: Path, schema: pa.Schema, shard: int = 0, partition: dict[str, str] | None = None,
                 *, flush_rows: int = FLUSH_ROWS, flush_s: float | None = None):
        self.folder, self.schema, self.shard, self.partition = Path(folder), schema, shard, partition
        self.flush_rows, self.flush_s = max(1, int(flush_rows)), flush_s
        self.rows: list[dict] = []
        self.written = 0
        self._last = time.monotonic()

    def add(self, rows: Iterable[dict]) -> None:
        self.rows.extend(rows)
        late = self.flush_s is not None and time.monotonic() - self._last > self.flush_s
        if len(self.rows) >= self.flush_rows or (self.rows and late):
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as a part. A write that fails (a full disk) keeps them
        buffered: the next flush, or the one on leaving the `with` block, tries again."""
        if self.rows:
            with interrupts_deferred():
                write_part(self.rows, self.schema, self.folder, self.shard, self.partition)
                self.written += len(self.rows)
                self.rows = []
        self._last = time.monotonic()

    def __enter__(self) -> "PartWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()


class TableSink:
    """Rows for several tables of one shard and device, as a library hands them over:
    `sink(table, rows)` buffers them in that table's part writer; `sink(table, rows, schema)`
    writes them at once as a part of their own (its columns are that part's, as an ncu
    table's grow with the metrics of its reports). Use as a context manager."""

    def __init__(self, ws: Workspace, shard: Shard | int = 0, device: str | None = None):
        self.ws, self.shard, self.device = ws, shard, device
        self.writers: dict[str, PartWriter] = {}

    def __call__(self, name: str | Table, rows: list[dict], schema: pa.Schema | None = None) -> None:
        t = table(name)
        if schema is not None:
            with self.ws.writer(t, self.shard, self.device if t.partition else None, schema=schema) as part:
                part.add(rows)
            return
        if t.name not in self.writers:
            self.writers[t.name] = self.ws.writer(t, self.shard, self.device if t.partition else None)
        self.writers[t.name].add(rows)

    def flush(self) -> None:
        """Write every table's buffered rows; one that cannot be written does not keep the others'."""
        errors = []
        for w in self.writers.values():
            try:
                w.flush()
            except Exception as e:  # noqa: BLE001 - raised below, once every writer has tried
                errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "TableSink":
        return self

    def __exit__(self, *exc) -> None:
        self.flush()


# ---------------------------------------------------------------------- reading


def _check_version(path, meta: dict | None) -> None:
    version = (meta or {}).get(S.METADATA_KEY)
    if version is not None and version.decode() != S.SCHEMA_VERSION:
        raise WorkspaceError(
            f"{path} was written with schema version {version.decode()}, this pipeline reads "
            f"version {S.SCHEMA_VERSION}: re-run the stage that wrote it with force=true."
        )


def part_files(path: Path) -> list[Path]:
    """The Parquet files of a table: the file itself, or a folder's parts in path order
    (hidden and staging entries left out, as pyarrow's discovery does)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    return sorted(f for f in path.rglob("*.parquet")
                  if not any(p.startswith((".", "_")) for p in f.relative_to(path).parts))


def empty_frame(schema: pa.Schema | None, columns: Sequence[str] | None = None) -> pd.DataFrame:
    if schema is None:
        return pd.DataFrame(columns=list(columns or []))
    frame = schema.empty_table().to_pandas()
    return frame[[c for c in columns if c in frame.columns]] if columns else frame


def read_table(path: Path, schema: pa.Schema | None = None, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """One Parquet file or a folder of part files as one DataFrame, parts in path order.

    Every part must carry this pipeline's schema version. Parts whose columns differ (an
    ncu table grows a column when a report brings a new metric) are read with the union
    of their columns, missing values null."""
    files = part_files(path)
    if not files:
        return empty_frame(schema, columns)
    return with_schema_columns(_read_parts(files, columns), schema, columns)


def with_schema_columns(frame: pd.DataFrame, schema: pa.Schema | None, columns: Sequence[str] | None) -> pd.DataFrame:
    """Columns that `schema` has and older files lack (added since), as nulls of their type."""
    if schema is None:
        return frame
    wanted = [f for f in schema if f.name not in frame.columns and (columns is None or f.name in columns)]
    if not wanted:
        return frame
    nulls = pa.table({f.name: pa.nulls(len(frame), f.type) for f in wanted}).to_pandas()
    nulls.index = frame.index
    return pd.concat([frame, nulls], axis=1)


def _read_parts(files: list[Path], columns: Sequence[str] | None) -> pd.DataFrame:
    dataset = ds.dataset([str(f) for f in files], format="parquet")
    schemas = []
    for fragment in dataset.get_fragments():
        physical = fragment.physical_schema
        _check_version(fragment.path, physical.metadata)
        schemas.append(physical)
    if any(not s.equals(schemas[0]) for s in schemas[1:]):
        try:
            dataset = ds.dataset([str(f) for f in files], format="parquet", schema=pa.unify_schemas(schemas))
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a column with two types: let pandas reconcile them
            return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    if columns is not None:
        columns = [c for c in columns if c in dataset.schema.names]
    return dataset.to_table(columns=columns).to_pandas()


def write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, default=str).encode())
