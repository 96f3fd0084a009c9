"""Where a workspace's files live, and how they are written (atomically) and read.

A workspace is one dataset on one target: `<paths.data>/<workspace>/`. Per-item stages
write part files (`<table>/part-<shard>-<n>.parquet`) so that an interrupted run keeps
every finished part and a multirun over shards needs no merge step.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core import schema as S
from pipeline.core.errors import PipelineError


class WorkspaceError(PipelineError):
    """A workspace lacks what a stage needs; the message says which stage to run."""


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def from_cfg(cls, cfg) -> "Workspace":
        return cls(Path(cfg.paths.data).expanduser().resolve() / str(cfg.workspace))

    @property
    def name(self) -> str:
        return self.root.name

    # Files of the stages, in data-flow order.
    @property
    def tasks(self) -> Path:
        return self.root / "tasks.parquet"

    @property
    def network_tasks(self) -> Path:
        return self.root / "network_tasks.parquet"

    @property
    def db_workload(self) -> Path:
        return self.root / "database_workload.json"

    @property
    def db_tuning_record(self) -> Path:
        return self.root / "database_tuning_record.json"

    @property
    def candidates(self) -> Path:
        return self.root / "candidates"

    @property
    def kernels(self) -> Path:
        return self.root / "kernels"

    @property
    def kernel_libs(self) -> Path:
        """Exported kernels, `<record_id>.so` (kept apart from the Parquet folders)."""
        return self.root / "lib"

    @property
    def references(self) -> Path:
        return self.root / "references"

    @property
    def measurements(self) -> Path:
        return self.root / "measurements"

    @property
    def features(self) -> Path:
        return self.root / "features"

    def require(self, path: Path, stage: str) -> Path:
        if not path.exists() or (path.is_dir() and not any(path.rglob("*.parquet"))):
            raise WorkspaceError(
                f"{path} does not exist: run `python -m pipeline stage={stage}` for workspace "
                f"'{self.name}' first (same dataset/target/paths.data overrides)."
            )
        return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_table(rows: pd.DataFrame | Iterable[dict], schema: pa.Schema, path: Path) -> Path:
    """Write rows with `schema` (extra columns dropped, missing ones null) atomically."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    cols = {}
    for field in schema:
        values = df[field.name] if field.name in df.columns else [None] * len(df)
        cols[field.name] = pa.array(list(values) if not isinstance(values, list) else values,
                                    type=field.type, from_pandas=True)
    table = pa.table(cols, schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_part(rows: pd.DataFrame | list[dict], schema: pa.Schema, folder: Path, shard: int = 0) -> Path | None:
    """Append one part file to a table folder; returns its path (None for no rows)."""
    if len(rows) == 0:
        return None
    name = f"part-{shard:04d}-{uuid.uuid4().hex[:12]}.parquet"
    return write_table(rows, schema, folder / name)


def _check_version(path: Path, meta: dict | None) -> None:
    version = (meta or {}).get(S.METADATA_KEY)
    if version is not None and version.decode() != S.SCHEMA_VERSION:
        raise WorkspaceError(
            f"{path} was written with schema version {version.decode()}, this pipeline reads "
            f"version {S.SCHEMA_VERSION}: re-run the stage that wrote it with force=true."
        )


def read_table(path: Path, schema: pa.Schema | None = None) -> pd.DataFrame:
    """Read one Parquet file or a folder of part files as one DataFrame."""
    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    files = [f for f in files if not f.name.startswith(".")]
    frames = []
    for f in files:
        t = pq.read_table(f)
        _check_version(f, t.schema.metadata)
        frames.append(t.to_pandas())
    if not frames:
        if schema is None:
            return pd.DataFrame()
        return schema.empty_table().to_pandas()
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, default=str).encode())
