"""stage=download: the TenSet archives, verified and unpacked, and their Ansor records.

Archives come from TenSet's Google Drive with gdown (resumable), are checked (sha256
against the config or the value recorded on first download, size, every zip member's
CRC) and unpacked under `<paths.data>/tenset/`. With `dataset.path=<zip or folder>` the
user's copy is used instead and nothing is fetched. Without network access the stage
stops at once and says how to fetch the file by hand and where to put it.

Then the Ansor measure records of the target kind (`measure_records/<device>/*.json`,
plus `dataset.records.files`) become `<workspace>/ansor_records.parquet`, joined to the
imported tasks by workload key.
"""

from __future__ import annotations

import glob
import logging
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.extras import require
from pipeline.core.release import sha256
from pipeline.tenset import dataset as DS
from pipeline.tenset import records as R
from pipeline.tenset.join import task_ids_for_keys
from pipeline.options import workspace_of

log = logging.getLogger(__name__)

_KIND_ARCHIVE = {"cuda": "gpu", "llvm": "cpu"}


class DownloadError(PipelineError):
    """An archive could not be fetched or verified; the message says what to do by hand."""


def manual_instructions(spec, dest: Path) -> str:
    gid = spec.gdrive_id
    return (
        f"Download {spec.file} by hand on a machine with internet access:\n"
        f"    pip install gdown && gdown https://drive.google.com/uc?id={gid} -O {spec.file}\n"
        f"  (or open https://drive.google.com/file/d/{gid}/view in a browser), then either put it at\n"
        f"    {dest}\n"
        f"  and run this stage again, or pass it directly: dataset=tenset dataset.path=/path/to/{spec.file}"
    )


def fetch(spec, dest: Path, timeout_s: float) -> Path:
    """gdown the archive to `dest` (resuming a partial download); fails fast offline."""
    if not spec.gdrive_id:
        raise DownloadError(f"no Google Drive id is configured for {spec.file}; {manual_instructions(spec, dest)}")
    gdown = require("gdown", "tenset", "stage=download (TenSet's archives from Google Drive)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    log.info("fetching %s (Google Drive id %s) -> %s", spec.file, spec.gdrive_id, dest)
    try:
        out = gdown.download(id=str(spec.gdrive_id), output=str(dest), quiet=False, resume=True,
                             timeout=float(timeout_s))
    except Exception as e:  # noqa: BLE001 - any network failure ends in the same instructions
        raise DownloadError(
            f"could not fetch {spec.file} from Google Drive ({type(e).__name__}: {str(e)[:300]}).\n"
            + manual_instructions(spec, dest)
        ) from e
    if out is None or not dest.exists():
        raise DownloadError(f"gdown did not produce {dest}.\n" + manual_instructions(spec, dest))
    return dest


def verify(spec, path: Path) -> str:
    """Checks size, sha256 and zip CRCs; returns the sha256."""
    size = path.stat().st_size
    if spec.get("size_bytes") and int(spec.size_bytes) != size:
        raise DownloadError(f"{path} has {size} bytes, expected {spec.size_bytes}: the download is "
                            f"incomplete or a different file; delete it and run stage=download again")
    digest = sha256(path)
    sidecar = path.with_name(path.name + ".sha256")
    expected = spec.get("sha256") or (sidecar.read_text().split()[0] if sidecar.exists() else None)
    if expected and expected != digest:
        raise DownloadError(f"{path}: sha256 {digest} does not match the expected {expected}; "
                            f"delete it and run stage=download again")
    n = DS.check_zip(path)
    if not expected:
        sidecar.write_text(f"{digest}  {path.name}\n")
        log.warning("%s: sha256 %s (%d bytes, %d members, CRCs ok). TenSet publishes no checksum: "
                    "record it as dataset.download.archives.<gpu|cpu>.sha256 to pin this file.",
                    path.name, digest, size, n)
    return digest


def archives_for(cfg) -> list:
    which = str(cfg.dataset.download.which)
    kind = str(cfg.target.tvm.kind)
    names = {"auto": [_KIND_ARCHIVE.get(kind, "gpu")], "both": ["gpu", "cpu"]}.get(which, [which])
    specs = cfg.dataset.download.archives
    for n in names:
        if n not in specs:
            raise ValueError(f"dataset.download.which={which!r}: no archive {n!r}; valid: auto, both, {', '.join(specs)}")
    return [specs[n] for n in names]


def obtain(cfg) -> Path:
    """The folder of the TenSet copy, fetching and unpacking what is missing."""
    if cfg.dataset.get("path"):
        root = DS.resolve(cfg.dataset.get("path"), cfg.paths.data)
        log.info("using the TenSet copy at %s (dataset.path)", root)
        return root
    root = DS.tenset_root(cfg.paths.data)
    for spec in archives_for(cfg):
        dest = root / str(spec.file)
        if (root / f".unpacked-{spec.file}").exists():
            log.info("%s already unpacked in %s", spec.file, root)
            continue
        if not dest.exists():  # gdown keeps a partial download as <file>XXXXXXXX.part and resumes it
            fetch(spec, dest, float(cfg.dataset.download.timeout_s))
        verify(spec, dest)
        DS.unpack(dest, root)
    return root


def import_records(cfg, root: Path | None) -> dict:
    """`<workspace>/ansor_records.parquet` from the copy's records and dataset.records.files."""
    kind = str(cfg.target.tvm.kind)
    rc = cfg.dataset.get("records") or {}
    files = DS.record_files(root, kind, rc.get("devices")) if root is not None else []
    for pattern in rc.get("files") or []:
        matched = sorted(glob.glob(str(Path(str(pattern)).expanduser())))
        if not matched:
            raise ValueError(f"dataset.records.files: {pattern!r} matches no file")
        files += [Path(m) for m in matched]
    if not files:
        log.info("no Ansor record files for target kind %s", kind)
        return {"record_files": 0}
    records, errors = R.read_records(files, max_per_file=rc.get("max_per_file"))
    for e in errors[:20]:
        log.warning("%s:%s: %s", e["source"], e["line"], e["error"])
    keys = sorted({r.workload_key for r in records})
    ids = task_ids_for_keys(root, kind, keys)
    rows = R.rows(records, ids)
    ws = workspace_of(cfg)
    path = ws.write("ansor_records", rows)
    joined = sum(1 for r in rows if r["task_id"])
    log.info("wrote %d Ansor records (%d joined to a task, %d unreadable lines) to %s",
             len(rows), joined, len(errors), path)
    return {"record_files": len(files), "records": len(rows), "records_joined": joined, "bad_lines": len(errors)}


def run(cfg) -> dict:
    if str(cfg.dataset.source) != "tenset":
        log.info("stage=download only applies to dataset=tenset; nothing to do for dataset=%s", cfg.dataset.name)
        return {}
    root = obtain(cfg)
    counts = {"dataset": str(root)}
    counts.update(import_records(cfg, root))
    return counts
