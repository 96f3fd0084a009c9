"""What the entry point says when a run stops: one line naming what went wrong, what is
kept and what to do, and the exit code. No traceback for a fault the user can fix.

| fault                                   | exit |
|-----------------------------------------|------|
| a bad setting, a missing prerequisite   | 2    |
| Ctrl-C (SIGINT)                         | 130  |
| a corrupt Parquet part, mlflow.db       | 1    |
| a read-only or unusable path, full disk | 1    |

Anything else is a bug: `explain` returns None and the traceback is shown.
"""

from __future__ import annotations

import errno
import re
import shlex
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

INTERRUPTED = 130
USER_ERROR = 2
ENVIRONMENT = 1

# What SQLite says of a file that is not a database (any more).
_NOT_A_DATABASE = ("file is not a database", "database disk image is malformed", "file is encrypted")
# What Arrow says of a file that is not Parquet (it raises ArrowInvalid or OSError with no errno).
_NOT_PARQUET = ("parquet magic bytes not found", "couldn't deserialize thrift", "parquet file size is 0",
                "unexpected end of stream", "invalid parquet", "corrupt")


@dataclass(frozen=True)
class Outcome:
    code: int
    message: str


def command(stage: str, overrides: list[str]) -> str:
    """The command line that runs `stage` again with the same settings, without `force`."""
    prog = "python -m pipeline" if Path(sys.argv[0]).name == "__main__.py" else Path(sys.argv[0]).name
    kept = [o for o in overrides if not o.lstrip("+~").startswith(("stage=", "force="))]
    return " ".join([prog, f"stage={stage}", *map(shlex.quote, kept)])


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _workspace(cfg):
    # pandas and pyarrow come with the workspace: imported when a run stops, not for --help
    from pipeline.options import workspace_of

    return workspace_of(cfg)


def _part_rows(files) -> tuple[int, list[tuple]]:
    """(rows of the readable Parquet files, [(file, reason)] of those that cannot be read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, bad = 0, []
    for f in files:
        try:
            rows += pq.ParquetFile(f).metadata.num_rows
        except (OSError, pa.ArrowException) as e:
            bad.append((f, str(e).splitlines()[0] if str(e) else type(e).__name__))
    return rows, bad


def _tables(ws):
    """(table, its part files) of the workspace's catalog tables that exist."""
    from pipeline.core.catalog import TABLES
    from pipeline.core.workspace import part_files

    return [(t, part_files(ws.root / t.path)) for t in TABLES.values() if (ws.root / t.path).exists()]


def kept_rows(ws, stage: str) -> str:
    """`kernels/ 12 rows, ...`: the rows of the tables `stage` writes, as they are on disk now."""
    return ", ".join(f"{t.path}{'/' if t.is_folder else ''} {_part_rows(files)[0]} rows"
                     for t, files in _tables(ws) if t.stage == stage)


def interrupted(cfg, stage: str | None, overrides: list[str]) -> Outcome:
    """Ctrl-C: the finished part files stay; a re-run does only what is missing."""
    if stage is None:
        return Outcome(INTERRUPTED, "interrupted before any stage started: nothing was written")
    ws = _workspace(cfg)
    rows = kept_rows(ws, stage)
    kept = f"kept every finished row in {ws.root}" + (f" ({rows})" if rows else "")
    return Outcome(INTERRUPTED, f"interrupted during stage={stage}: {kept}; resume with `"
                                f"{command(str(cfg.stage), overrides)}` (finished work is skipped)")


def corrupt_parquet(ws, exc: BaseException) -> Outcome | None:
    """A part file Arrow cannot read: named, with the stage that writes it again."""
    text = " ".join(str(e) for e in _chain(exc)).lower()
    if not any(s in text for s in _NOT_PARQUET):
        return None
    bad = [(f, t, why) for t, files in _tables(ws) for f, why in _part_rows(files)[1]]
    if not bad:
        return None
    f, t, why = bad[0]
    more = f" (and {len(bad) - 1} more: {', '.join(str(b[0]) for b in bad[1:3])})" if len(bad) > 1 else ""
    return Outcome(ENVIRONMENT, f"{f} is not a readable Parquet file ({why}){more}: delete it and re-run "
                                f"`python -m pipeline stage={t.stage}` with the same settings; it writes again "
                                f"only the rows that file held")


def corrupt_database(cfg, exc: BaseException) -> Outcome | None:
    """MLflow's SQLite store that SQLite cannot read."""
    for e in _chain(exc):
        text = str(e).lower()
        if (isinstance(e, sqlite3.DatabaseError) or type(e).__name__ in ("DatabaseError", "MlflowException")) \
                and any(s in text for s in _NOT_A_DATABASE):
            uri = str(cfg.mlflow.get("tracking_uri") or "")
            db = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else "mlflow.db (next to the project)"
            return Outcome(ENVIRONMENT, f"the MLflow tracking database {db} is not a readable SQLite database "
                                        f"({str(e).splitlines()[0][:120]}): move it away (mv {Path(db).name} "
                                        f"{Path(db).name}.corrupt) and re-run stage=train, which starts a new one, "
                                        f"or set mlflow.tracking_uri=sqlite:///<another file>")
    return None


def os_error(cfg, stage: str | None, exc: BaseException) -> Outcome | None:
    """No space, no permission, a path that is not a folder: named, with the fix."""
    for e in _chain(exc):
        if not isinstance(e, OSError):
            continue
        text = str(e)
        where = e.filename or _path_in(text) or cfg.paths.data
        rerun = f"; re-run stage={stage} afterwards (finished part files are kept)" if stage else ""
        if e.errno == errno.ENOSPC or "no space left on device" in text.lower():
            return Outcome(ENVIRONMENT, f"no space left on the device holding {where}: free space there or set "
                                        f"paths.data=<a folder on another disk>{rerun}")
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or "permission denied" in text.lower() \
                or "read-only file system" in text.lower():
            return Outcome(ENVIRONMENT, f"cannot write {where} ({e.strerror or text.splitlines()[0]}): make it "
                                        f"writable or set paths.data=<a writable folder> (now "
                                        f"paths.data={cfg.paths.data}){rerun}")
        if e.errno in (errno.ENOTDIR, errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP):
            return Outcome(ENVIRONMENT, f"cannot use {where} ({e.strerror}): paths.data={cfg.paths.data} must be "
                                        f"a folder (or a path where one can be made){rerun}")
    return None


def _path_in(text: str) -> str | None:
    m = re.search(r"'(/[^']+)'", text) or re.search(r"(/\S+)", text)
    return m.group(1) if m else None


def explain(exc: BaseException, cfg, stage: str | None) -> Outcome | None:
    """The one-line outcome of a run that raised `exc` during `stage` (None: a bug, show it)."""
    if isinstance(exc, PipelineError):
        return Outcome(USER_ERROR, str(exc))
    ws = _workspace(cfg)
    for found in (corrupt_database(cfg, exc), corrupt_parquet(ws, exc) if ws.root.is_dir() else None,
                  os_error(cfg, stage, exc)):
        if found is not None:
            return found
    return None
