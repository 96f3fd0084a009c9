"""Releases: a workspace, or a trained model, packed into a folder that outlives its machine.

A dataset release (`data/releases/<name>/`) holds one zstd-compressed Parquet file per
workspace table (`tables/<table>.parquet`; a device-partitioned table keeps its `device`
as a column), the MetaSchedule database (`database_workload.json.gz`,
`database_tuning_record.json.gz`, gunzipped for `ms.database.JSONDatabase`), `manifest.json`
(what it holds, where and how it was timed, versions, row counts, the sha256 of every
file, the commands that made it) and a card. No libraries: stage=replay builds them again
from the traces. A model release holds an MLflow model folder, a manifest and a card.

A release is written whole or not at all (a hidden folder renamed into place) and is
verified before anything is read from it: the manifest, every file it lists with its
size and sha256, no table missing, the schema version this pipeline reads. A workspace
made from a release (`unpack`) is also written whole or not at all.

Releases packed before the database was gzipped (those before zoo_ops-llvm-epyc2-v8) can be
compacted in place (`compact`): the database files are gzipped and the manifest is left as
it was, so the releases that extend them, which pin its sha256, still verify; a gzipped
database file verifies by its content against the manifest's entry for the plain file.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import uuid
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.core import schema as S
from pipeline.core.catalog import TABLES, Table, ncu_tables
from pipeline.core.errors import PipelineError
from pipeline.core.home import home
from pipeline.core import database as D
from pipeline.core.workspace import SELECTION_KEY, Workspace, atomic_write_bytes, part_files

FORMAT = 1  # the layout of a release folder (this module); a reader refuses another
MANIFEST = "manifest.json"
DATASET_CARD = "DATASET.md"
MODEL_CARD = "MODEL.md"
TABLES_DIR = "tables"
DATABASE_FILES = D.DATABASE_FILES
# Tables a workspace keeps that are not the dataset (a tuning comparison's trials).
NOT_RELEASED = ("tune_trials",)
# Tables measured on the release's hardware: left out of a workspace that labels the
# programs for another machine (`labels=False`).
LABEL_TABLES = ("measurements", "cpu_counters", "ncu", "ncu_kernels")
COMPRESSION = dict(compression="zstd", compression_level=15)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ReleaseError(PipelineError):
    """A release that cannot be used or written; the message names the file and the fix."""


def versions() -> dict[str, str]:
    """The versions a release names: Python, this pipeline, TVM and the libraries of its models."""
    out = {"python": platform.python_version()}
    for p in ("tensor-cost-pipeline", "apache-tvm", "apache-tvm-ffi", "pyarrow", "mlflow", "lightgbm", "xgboost",
              "torch"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


# ---------------------------------------------------------------------- names and lookup


def hardware_slug(hardware: dict) -> str:
    """A short name for the hardware of a release: the GPU's model (`h100`), or the CPU's
    family and logical CPU count (`epyc2` for 'AMD EPYC', 2 CPUs)."""
    noise = {"amd", "intel", "nvidia", "core", "cpu", "processor", "genuine"}
    name = hardware.get("gpu_name") or hardware.get("cpu_model") or "unknown"
    name = re.sub(r"\((r|tm)\)", "", str(name).lower())
    words = [w for w in re.split(r"[\s,@]+", name) if w and w not in noise]
    word = re.sub(r"[^a-z0-9]", "", words[0] if words else "unknown") or "unknown"
    if hardware.get("gpu_name"):
        return word
    return f"{word}{int(hardware['cpu_count'])}" if hardware.get("cpu_count") else word


def release_name(dataset: str, target: str, hardware: str, version: int) -> str:
    return f"{dataset}-{target}-{hardware}-v{int(version)}"


def check_name(name: str) -> str:
    if not _NAME.match(str(name)):
        raise ReleaseError(f"release name {name!r} is not a folder name: use letters, digits, '.', '_' and '-'")
    return str(name)


# The releases committed with the project: data/releases of a source checkout (an installed
# package has none; the folder it would be is then left out of the search).
PROJECT_RELEASES = Path(__file__).resolve().parents[2] / "data" / "releases"


def search_path(*first: Path) -> list[Path]:
    """Where releases are looked up by name: `first` (e.g. paths.releases), $PIPELINE_RELEASES,
    <home>/data/releases ($PIPELINE_HOME, pipeline/core/home.py), ./data/releases, then the
    project's own data/releases when this runs from a source checkout."""
    env = [Path(p) for p in os.environ.get("PIPELINE_RELEASES", "").split(os.pathsep) if p]
    project = [PROJECT_RELEASES] if PROJECT_RELEASES.is_dir() else []
    return list(dict.fromkeys([*map(Path, first), *env, home() / "data" / "releases", Path.cwd() / "data" / "releases",
                               *project]))


def hardware_of(meas) -> dict:
    """Where the successful rows of a measurements frame were timed: the host columns (one
    machine; several, or one model name with two CPU signatures, are listed and named `mixed`)."""
    ok = meas[meas["error"].isna()] if "error" in meas else meas
    cols = [f.name for f in S.HOST]
    hosts = ok[[c for c in cols if c in ok]].drop_duplicates().astype(object)
    hosts = [{k: (int(v) if k == "cpu_count" else v) if v == v and v is not None else None for k, v in h.items()}
             for h in hosts.to_dict("records")]
    if not hosts:
        return {"hardware": None, "hosts": []}
    cpus = {h.get("cpu_signature") for h in hosts if not h.get("gpu_name")} - {None}  # a GPU's host CPU aside
    if len({h.get("hardware") for h in hosts}) > 1 or len(cpus) > 1:
        return {"hardware": "mixed", "hosts": hosts}
    return {**hosts[0], "hosts": hosts}


def releases(root: Path, kind: str | None = None) -> list[Path]:
    """The release folders directly under `root` (those with a manifest), of `kind`
    (dataset | model; None: every kind), sorted by name."""
    root = Path(root)
    found = sorted(p.parent for p in root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    return [p for p in found if kind is None or read_manifest(p).get("kind") == kind]


def find(name_or_path: str | Path, search: Iterable[Path]) -> Path:
    """The folder of a release given by path or by name (looked up in each `search` folder)."""
    if name_or_path is None or str(name_or_path).strip() in ("", "None"):
        raise ReleaseError("no release given: set dataset.release=<name> (a folder of data/releases) or "
                           "dataset.release=<path to a release folder>")
    given = Path(str(name_or_path)).expanduser()
    if given.is_absolute() or len(given.parts) > 1 or given.exists():
        if (given / MANIFEST).is_file():
            return given.resolve()
        raise ReleaseError(f"{given / MANIFEST} does not exist: {given} is not a release folder (stage=release "
                           f"writes one)")
    searched = []
    for root in search:
        folder = Path(root).expanduser() / str(name_or_path)
        searched.append(str(Path(root).expanduser()))
        if (folder / MANIFEST).is_file():
            return folder.resolve()
    known = sorted({p.name for root in search for p in releases(Path(root).expanduser())})
    raise ReleaseError(f"no release {name_or_path!r} in {', '.join(dict.fromkeys(searched))}: give one of "
                       f"{', '.join(known) or '(none there)'} or the path of a release folder, or add the folder that holds "
                       f"it to PIPELINE_RELEASES")


# ---------------------------------------------------------------------- checksums


def sha256(path: Path) -> str:
    """A file's sha256, hex (releases, downloaded archives)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_entries(root: Path) -> dict[str, dict]:
    """Every file under `root` but the manifest: relative path -> {bytes, sha256}."""
    return {str(f.relative_to(root)): {"bytes": f.stat().st_size, "sha256": sha256(f)}
            for f in sorted(root.rglob("*")) if f.is_file() and f.name != MANIFEST}


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReleaseError(f"{path} does not exist: {folder} is not a release folder (stage=release writes "
                           f"one)") from None
    except (OSError, ValueError) as e:
        raise ReleaseError(f"{path} cannot be read ({e}): the release is damaged; fetch it again") from None
    if not isinstance(manifest, dict) or "files" not in manifest:
        raise ReleaseError(f"{path} is not a release manifest (no `files`): the release is damaged; fetch it again")
    return manifest


def verify(folder: str | Path, *, kind: str | None = None) -> dict:
    """The manifest of a release whose every file holds: refuses (ReleaseError, one line
    naming the file and the fix) a missing, extra-sized or changed file, another release
    format or schema version, or a release of another `kind` (dataset | model)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    where = folder / MANIFEST
    if int(manifest.get("format", -1)) != FORMAT:
        raise ReleaseError(f"{where}: release format {manifest.get('format')}, this pipeline reads format "
                           f"{FORMAT}: use the pipeline version named in the manifest, or re-pack the release "
                           f"with stage=release")
    if kind is not None and manifest.get("kind") != kind:
        raise ReleaseError(f"{where}: a {manifest.get('kind')} release where a {kind} release is needed: give a "
                           f"{kind} release")
    if manifest.get("kind") == "dataset" and str(manifest.get("schema_version")) != S.SCHEMA_VERSION:
        raise ReleaseError(f"{where}: tables of schema version {manifest.get('schema_version')}, this pipeline "
                           f"reads version {S.SCHEMA_VERSION}: use a release made with this version (or re-pack "
                           f"its workspace with this pipeline's stage=release)")
    for rel, entry in manifest["files"].items():
        f, packed = folder / rel, _compacted(folder, rel)
        if not f.is_file() and packed is None:
            raise ReleaseError(f"{f} is missing from release {folder.name}: the release is incomplete; fetch it "
                               f"again (git checkout -- {folder} in a clone)")
        if not f.is_file():
            try:
                data = D.read_bytes(packed)
            except (OSError, EOFError, gzip.BadGzipFile):
                data = b""
            same = len(data) == int(entry["bytes"]) and hashlib.sha256(data).hexdigest() == entry["sha256"]
        else:
            same = f.stat().st_size == int(entry["bytes"]) and sha256(f) == entry["sha256"]
        if not same:
            raise ReleaseError(f"{packed or f} does not match its checksum in {where}: the file was changed or "
                               f"truncated; fetch the release again (git checkout -- {folder} in a clone)")
    if manifest.get("kind") == "dataset":
        for name in manifest.get("tables", {}):
            if f"{TABLES_DIR}/{name}.parquet" not in manifest["files"]:
                raise ReleaseError(f"{where} names table {name} but lists no file for it: the release is "
                                   f"damaged; fetch it again")
        for name in ("tasks", "candidates"):
            if name not in manifest.get("tables", {}):
                raise ReleaseError(f"{where}: release {folder.name} has no {name} table: a dataset release holds "
                                   f"at least tasks and candidates; re-pack it with stage=release")
    return manifest


def _compacted(folder: Path, rel: str) -> Path | None:
    """The gzipped form `compact` left of a database file the manifest lists plain, or None."""
    packed = folder / f"{rel}.gz"
    return packed if rel in DATABASE_FILES and packed.is_file() else None


def compact(folder: str | Path) -> dict:
    """Gzip a dataset release's plain MetaSchedule database files in place (each checked to
    unpack to the released bytes before the plain file goes); the manifest stays as it was.
    Returns {release, files, bytes_before, bytes_after}; a release already compact is left
    as it is (files 0)."""
    folder = Path(folder)
    manifest = verify(folder, kind="dataset")
    before = after = done = 0
    for rel in DATABASE_FILES:
        plain = folder / rel
        if rel not in manifest["files"] or not plain.is_file():
            continue
        data = plain.read_bytes()
        D.write_gzipped(folder / f"{rel}.gz", data)
        packed = _compacted(folder, rel)
        if D.read_bytes(packed) != data:
            packed.unlink()
            raise ReleaseError(f"{packed}: the gzipped database does not unpack to {plain}; the plain file is "
                               f"kept (is the disk full?)")
        before, after, done = before + len(data), after + packed.stat().st_size, done + 1
        plain.unlink()
    return {"release": manifest["name"], "files": done, "bytes_before": before, "bytes_after": after}


def chain(folder: str | Path) -> list[tuple[Path, dict]]:
    """A dataset release and every release it extends, each verified, the first base first:
    (folder, manifest). A release that extends another holds only what the other does not
    (`manifest["extends"]`: its name and the sha256 of its manifest); the base is looked up
    beside it first, then on the search path, and refused when it is not the one the
    release was made on."""
    folder, out = Path(folder), []
    while True:
        manifest = verify(folder, kind="dataset")
        out.append((folder, manifest))
        base = manifest.get("extends")
        if not base:
            return out[::-1]
        if any(m["name"] == base["name"] for _, m in out):
            raise ReleaseError(f"{folder / MANIFEST}: release {manifest['name']} extends {base['name']}, which "
                               f"extends it in turn: re-pack one of them without release.extends")
        found = find(base["name"], search_path(folder.parent))
        if sha256(found / MANIFEST) != base["manifest_sha256"]:
            raise ReleaseError(f"{folder / MANIFEST}: release {manifest['name']} extends {base['name']}, and "
                               f"{found / MANIFEST} is not the manifest it was made on: fetch {base['name']} as it "
                               f"was released (git checkout -- {found} in a clone)")
        folder = found


def chain_tasks(parts: list[tuple[Path, dict]]) -> frozenset[str]:
    """The task ids a chain of dataset releases (`chain`) holds."""
    return frozenset().union(*(pq.read_table(f / TABLES_DIR / "tasks.parquet", columns=["task_id"])["task_id"]
                               .to_pylist() for f, _ in parts))


def _timed_ok(counts: dict) -> str:
    """' (N timed without error)' where the counts say (totals written before the count was
    added do not)."""
    return f" ({counts['measured_ok']:,} timed without error)" if counts.get("measured_ok") is not None else ""


def total_counts(manifest: dict) -> dict:
    """The counts of a dataset release with those of every release it extends."""
    return (manifest.get("extends") or {}).get("total") or manifest["counts"]


def version_of(name: str) -> int | None:
    """The version a release's name ends with (`...-v<version>`), None for a name without one."""
    m = re.search(r"-v(\d+)$", str(name))
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------- packing


def released_tables(ws: Workspace) -> list[Table]:
    """The workspace's tables that a release holds, in catalog order (Nsight Compute
    section-set tables included), those with rows only."""
    out = [t for t in TABLES.values() if t.name not in NOT_RELEASED]
    features = ws.root / "features"
    if features.is_dir():
        for d in sorted(features.glob("ncu_*")):
            section = d.name[len("ncu_"):].removesuffix("_kernels")
            out += [t for t in ncu_tables(section) if t.path == f"features/{d.name}"]
    return [t for t in out if part_files(ws.root / t.path) and (ws.root / t.path).exists()]


def read_arrow(ws: Workspace, t: Table) -> pa.Table:
    """A whole table as Arrow (types kept), a partitioned one with its partition column,
    rows sorted by task and record so that equal workspaces pack to equal bytes."""
    files = [str(f) for f in part_files(ws.root / t.path)]
    schemas = [pq.read_schema(f) for f in files]
    for f, s in zip(files, schemas):
        version = (s.metadata or {}).get(S.METADATA_KEY)
        if version is not None and version.decode() != S.SCHEMA_VERSION:
            raise ReleaseError(f"{f} was written with schema version {version.decode()}, this pipeline writes "
                               f"{S.SCHEMA_VERSION}: re-run stage={t.stage} with force=true before releasing")
    unified = pa.unify_schemas([s.remove_metadata() for s in schemas], promote_options="permissive")
    partitioning = None
    if t.partition:
        partitioning = ds.partitioning(pa.schema([(t.partition, pa.string())]), flavor="hive")
        unified = unified.append(pa.field(t.partition, pa.string())) if t.partition not in unified.names else unified
    data = ds.dataset(files, format="parquet", schema=unified, partitioning=partitioning,
                      partition_base_dir=str(ws.root / t.path)).to_table()
    if t.schema is not None:  # columns added to the schema since older parts were written
        for field in t.schema:
            if field.name not in data.column_names:
                data = data.append_column(field, pa.nulls(data.num_rows, field.type))
    keys = [k for k in ("task_id", *t.key) if k in data.column_names]
    data = data.sort_by([(k, "ascending") for k in dict.fromkeys(keys)])
    return data.replace_schema_metadata({S.METADATA_KEY: S.SCHEMA_VERSION.encode(), S.TABLE_KEY: t.name.encode()})


def staging(dest: Path) -> Path:
    folder = dest.parent / f".{dest.name}.staging-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    return folder


def publish(tmp: Path, dest: Path, *, force: bool) -> Path:
    """Move a finished staging folder into place (replacing `dest` only with `force`)."""
    if dest.exists():
        if not force:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ReleaseError(f"{dest} exists: releases are not overwritten; give a new release.version "
                               f"(or release.name), or force=true to replace it")
        old = dest.parent / f".{dest.name}.replaced-{uuid.uuid4().hex[:8]}"
        os.replace(dest, old)
        os.replace(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dest)
    return dest


def seal(tmp: Path, dest: Path, manifest: dict, card_name: str, card, force: bool) -> dict:
    """Finish a staging folder: its card, the manifest with every file's size and sha256,
    then publish it as `dest`; returns the manifest."""
    (tmp / card_name).write_text(card(manifest))
    manifest["files"] = file_entries(tmp)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    publish(tmp, dest, force=force)
    return manifest


def pack_dataset(ws: Workspace, dest: Path, *, info: dict, card, force: bool = False,
                 record_lines: Iterable[str] = (), drop_tasks: frozenset[str] = frozenset()) -> dict:
    """Write workspace `ws` as the dataset release `dest`; returns its manifest.

    `info` goes into the manifest as it is (selection, target, hardware, timing, versions,
    commands); `record_lines` are the tuning-record lines (one database, all shards);
    `card(manifest) -> str` writes the card from the finished manifest. `drop_tasks` are
    left out (the tasks of the release this one extends, and of an earlier selection):
    every row of theirs but a network's list of its tasks, their workloads and records;
    the workload indices of the tasks kept are renumbered in order."""
    tmp = staging(dest)
    try:
        tables, rows = tmp / TABLES_DIR, {}
        tables.mkdir()
        renumber: dict[int, int] = {}
        for t in released_tables(ws):
            data = read_arrow(ws, t)
            if drop_tasks and t.name != "network_tasks" and "task_id" in data.column_names:
                data = data.filter(pc.invert(pc.is_in(data["task_id"], value_set=pa.array(sorted(drop_tasks)))))
            if drop_tasks and t.name == "tasks":
                old = data["workload_index"].to_pylist()
                renumber = {i: n for n, i in enumerate(sorted(old))}
                data = data.set_column(data.schema.get_field_index("workload_index"), "workload_index",
                                       pa.array([renumber[i] for i in old], data.schema.field("workload_index").type))
            pq.write_table(data, tables / f"{t.name}.parquet", **COMPRESSION)
            rows[t.name] = data.num_rows
        workloads = ws.db_workload.read_bytes()
        if drop_tasks:
            kept = [line for _, line in D.nonblank_lines(ws.db_workload)]
            workloads = b"".join(kept[i] + b"\n" for i in sorted(renumber))
            record_lines = [D.shift_record_line(line, renumber) for line in record_lines]
            record_lines = [line for line in record_lines if line is not None]
        D.write_gzipped(tmp / f"{DATABASE_FILES[0]}.gz", workloads)
        D.write_gzipped(tmp / f"{DATABASE_FILES[1]}.gz", "".join(f"{line}\n" for line in record_lines).encode())
        manifest = {"format": FORMAT, "kind": "dataset", "name": dest.name, "schema_version": S.SCHEMA_VERSION,
                    **info, "tables": rows}
        return seal(tmp, dest, manifest, DATASET_CARD, card, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pack_model(model_dir: Path, dest: Path, *, info: dict, card, force: bool = False) -> dict:
    """Write an MLflow model folder as the model release `dest` (`model/`, manifest, card)."""
    tmp = staging(dest)
    try:
        shutil.copytree(model_dir, tmp / "model")
        return seal(tmp, dest, {"format": FORMAT, "kind": "model", "name": dest.name, **info}, MODEL_CARD, card, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------- a workspace from a release


def unpack(release: Path, root: Path, *, labels: bool = True, selection: bytes | None = None,
           then: Callable[[Workspace], dict] | None = None) -> dict:
    """Make the workspace folder `root` from a verified release and the releases it extends
    (`chain`): their tables as part files (device-partitioned ones under `device=<d>/`),
    one MetaSchedule database (a later release's workload indices follow the earlier
    ones') and `release.json` (the manifest it came from). `labels=False` leaves out what
    was measured on the release's hardware (LABEL_TABLES), so that stage=replay and
    stage=measure label the same programs for this machine; the records then carry no run
    times. `selection` replaces the task table's recorded dataset selection; `then` adds to
    the workspace before it goes into place (kept tuning runs: pipeline/tuning/imported.py),
    its counts joining the result. Written whole or not at all; returns the rows per table."""
    parts = chain(release)
    manifest = parts[-1][1]
    if visible_entries(root):
        raise ReleaseError(f"{root} exists and is not empty: a workspace is made from a release only into a new "
                           f"folder; remove it or give another paths.data")
    tmp = staging(root)
    try:
        ws, rows, files = Workspace(tmp), {}, {}
        offsets = _workload_offsets(parts)
        for (folder, part), offset in zip(parts, offsets):
            for name in part["tables"]:
                if not labels and name in LABEL_TABLES:
                    continue
                data = pq.read_table(folder / TABLES_DIR / f"{name}.parquet")
                if name == "tasks" and offset:
                    data = data.set_column(data.schema.get_field_index("workload_index"), "workload_index",
                                           pc.add(data["workload_index"], offset).cast(data["workload_index"].type))
                t = TABLES.get(name) or _section_table(name)
                rows[name] = rows.get(name, 0) + data.num_rows
                if not t.is_folder:
                    files.setdefault(t, []).append(data)
                    continue
                devices = [None] if not t.partition else pc.unique(data[t.partition]).to_pylist()
                for device in devices:
                    piece = data if device is None else data.filter(pc.equal(data[t.partition], device)).drop_columns(
                        [t.partition])
                    out = ws.path(t, device)
                    out.mkdir(parents=True, exist_ok=True)
                    pq.write_table(piece, out / f"part-0000-{uuid.uuid4().hex[:12]}-0.parquet")
        for t, pieces in files.items():
            data = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces, promote_options="permissive")
            meta = dict(pieces[0].schema.metadata or {})
            if t.name == "tasks" and selection is not None:
                meta[SELECTION_KEY] = selection
            pq.write_table(data.replace_schema_metadata(meta), tmp / t.path)
        _write_database(parts, offsets, tmp)
        if not labels:  # the records say what measurements/ says: not measured here yet
            D.sync_records(ws)
        parts_seen = [{"name": m["name"], "counts": m["counts"], "label_noise": m.get("label_noise")} for _, m in parts]
        atomic_write_bytes(tmp / "release.json", json.dumps(
            {k: v for k, v in manifest.items() if k != "files"} | {"path": str(release), "labels": labels,
                                                                  "parts": parts_seen},
            indent=2, default=str).encode())
        if then is not None:
            rows.update(then(ws))
        # Into place entry by entry (the folder may hold the stage's lock), the task table last:
        # a workspace without it is not made yet, whatever stopped the moves.
        root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(visible_entries(tmp), key=lambda p: p.name == TABLES["tasks"].path):
            os.replace(entry, root / entry.name)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _workload_offsets(parts: list[tuple[Path, dict]]) -> list[int]:
    """Where each release's workloads start in the database of the workspace made of them."""
    counts = [sum(1 for _ in D.nonblank_lines(D.database_file(folder, DATABASE_FILES[0]))) for folder, _ in parts]
    return [sum(counts[:i]) for i in range(len(parts))]


def _write_database(parts: list[tuple[Path, dict]], offsets: list[int], dest: Path) -> None:
    """The MetaSchedule database of the releases `parts` in `dest` (unzipped, as a workspace
    keeps it): one release's as released, byte for byte; several concatenated, each record
    pointing at its workload's new index."""
    if len(parts) == 1:
        D.unpack_database(parts[0][0], dest)
        return
    with open(dest / DATABASE_FILES[0], "wb") as workloads, open(dest / DATABASE_FILES[1], "wb") as records:
        for (folder, _), offset in zip(parts, offsets):
            lines = [line for _, line in D.nonblank_lines(D.database_file(folder, DATABASE_FILES[0]))]
            workloads.writelines(line + b"\n" for line in lines)
            shift = {i: i + offset for i in range(len(lines))}
            records.writelines((line if not offset else D.shift_record_line(line.decode(), shift).encode()) + b"\n"
                               for _, line in D.nonblank_lines(D.database_file(folder, DATABASE_FILES[1])))


def visible_entries(root: Path) -> list[Path]:
    """What a folder holds, hidden entries (locks, staging folders) left out."""
    return [p for p in Path(root).iterdir() if not p.name.startswith(".")] if Path(root).is_dir() else []


def _section_table(name: str) -> Table:
    section = name[len("ncu_"):].removesuffix("_kernels")
    records, kernels = ncu_tables(section)
    return kernels if name.endswith("_kernels") else records


def workspace_release(root: Path) -> dict | None:
    """The manifest of the release a workspace was made from (None: not made from one)."""
    try:
        return json.loads((Path(root) / "release.json").read_text())
    except (OSError, ValueError):
        return None


# The kept tuning runs imported into a workspace made from a release (pipeline/tuning/imported.py):
# their networks, run folders and counts.
TUNING_RUNS = "tuning_runs.json"


def workspace_tuning_networks(root: Path) -> list[str]:
    """The networks whose kept tuning runs joined a workspace ([] for none)."""
    path = Path(root) / TUNING_RUNS
    return list(json.loads(path.read_text())["networks"]) if path.exists() else []


# ---------------------------------------------------------------------- cards


def _stage_times(commands: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in commands:
        out[c.get("stage", "?")] = out.get(c.get("stage", "?"), 0.0) + float(c.get("seconds") or 0.0)
    return out


def _command(c: dict) -> str:
    if c.get("command"):
        return str(c["command"])
    over = " ".join(o for o in (c.get("overrides") or []) if not o.startswith("stage="))
    return f"python -m pipeline stage={c.get('stage')} {over}".strip()


def dataset_card(m: dict) -> str:
    """DATASET.md: what the release holds, how it was timed, its noise, failures, licence."""
    counts, hw = m["counts"], m["hardware"]
    nets = ", ".join(counts["networks"]) or "none"
    lines = [
        f"# {m['name']}", "",
        f"A dataset of MetaSchedule schedule candidates for the `{m['dataset']}` workloads on target "
        f"`{m['target']['name']}` ({m['target']['kind']}), each built and timed on {hw.get('hardware')}: "
        f"{counts['records']:,} records of {counts['tasks']} tasks{_timed_ok(counts)}; "
        f"networks: {nets}.", "",
    ]
    if m.get("description"):
        lines += [str(m["description"]), ""]
    if m.get("extends"):
        e, total = m["extends"], m["extends"]["total"]
        lines += [f"Extends release `{e['name']}` (pinned by the sha256 of its manifest) and holds only the tasks it "
                  f"does not. `dataset=release dataset.release={m['name']}` makes one workspace of both: "
                  f"{total['records']:,} records of {total['tasks']} tasks{_timed_ok(total)}; networks: "
                  f"{', '.join(total['networks'])}.",
                  ""]
    if m.get("derived_from"):
        lines += [_card_origin(m["derived_from"], counts["measured_ok"]), ""]
    lines += ["## Tables", "", "| table | rows |", "|---|---|"]
    lines += [f"| `{t}` | {n:,} |" for t, n in m["tables"].items()]
    lines += ["", "`tables/*.parquet` are the workspace's tables (pipeline/core/schema.py, schema version "
              f"{m['schema_version']}); `database_workload.json.gz` and `database_tuning_record.json.gz` are a "
              "MetaSchedule JSON database (`ms.database.JSONDatabase`, once gunzipped), every record with its run "
              "times (1e10: failed). No kernel libraries: `stage=replay` builds them again from the traces.", ""]
    lines += _card_timing(m) + _card_noise_and_failures(m) + _card_provenance(m)
    return "\n".join(lines)


def _card_origin(origin: dict, measured_ok: int) -> str:
    """Where a release made from a release's workspace came from: its programs timed again
    (`dataset.labels=false`), or its programs and labels with more of them timed here."""
    name, hw = origin["name"], (origin.get("hardware") or {}).get("hardware")
    if not origin.get("labels"):
        return f"The programs of release `{name}` (timed there on {hw}), timed again here."
    before = origin.get("measured_ok") or 0
    more = (f"with {measured_ok - before:,} more of its programs timed here" if measured_ok > before
            else "nothing more timed here")
    return f"The programs and labels of release `{name}` ({before:,} timed without error there, on {hw}), {more}."


def _card_timing(m: dict) -> list[str]:
    """The card's 'How it was timed': repeats, cache flushes and the host's load while timing."""
    hw, timing = m["hardware"], m.get("timing") or {}
    lines = ["## How it was timed", ""]
    if timing:
        busy = timing.get("timed_while_busy")
        def shown(v):
            return ", ".join(map(str, v)) if isinstance(v, list) else str(v)

        lines += [f"- repeats per kernel: {shown(timing.get('repeats'))}, calls per repeat: "
                  f"{shown(timing.get('number'))}, CPU cache flushed before each repeat: "
                  f"{shown(timing.get('cache_flush'))}, interleaved rounds: {shown(timing.get('rounds'))}",
                  f"- the host's 1-minute load average while timing: {timing.get('load_avg_min')} to "
                  f"{timing.get('load_avg_max')} on {hw.get('cpu_count')} CPUs"
                  + (f"; {busy} kernel(s) timed while it was above the CPU count" if busy else
                     "; no kernel timed while it was above the CPU count" if busy == 0 else "")]
    else:
        lines += ["- not timed (no measurements)"]
    return lines


def _card_noise_and_failures(m: dict) -> list[str]:
    """The card's label noise (what no model can beat) and its failure counts."""
    noise, fail = m.get("label_noise"), m["failures"]
    lines = ["", "## Label noise", ""]
    if noise:
        lines += [f"`benchmarks/measurement_noise.py` re-timed {noise.get('tasks')} tasks x {noise.get('records')} "
                  f"kernels in {noise.get('rounds')} interleaved rounds: the stored labels agree with the "
                  f"re-measurement on pairwise accuracy {noise.get('stored_pair'):.3f} (top-1 score "
                  f"{noise.get('stored_top1'):.3f}); one pass against the next {noise.get('one_pass_pair'):.3f}. "
                  f"No cost model can be expected to order pairs better than the stored labels do."]
    else:
        lines += ["Not measured for this release (`benchmarks/measurement_noise.py` writes it)."]
    lines += ["", "## Failures", "",
              f"- sampling errors: {fail['sample_errors']}, build errors: {fail['build_errors']}, "
              f"measurement errors: {fail['measure_errors']}"
              + (" (" + ", ".join(f"{k}: {v}" for k, v in (fail.get("measure_error_kinds") or {}).items()) + ")"
                 if fail.get("measure_error_kinds") else ""),
              f"- outputs checked against the unscheduled reference: {fail['checked']}, incorrect: "
              f"{fail['incorrect']}",
              ""]
    return lines


def _card_provenance(m: dict) -> list[str]:
    """The card's commands, versions, use and licence."""
    lines = ["## How it was made", ""]
    times = _stage_times(m.get("commands") or [])
    if times:
        lines += ["The runs made on this task table (`history.jsonl` from the run that built it on; runs on a "
                  "table the workspace held before, for an earlier release, are left out); stage wall times summed "
                  "over them (s): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in times.items()), "", "```"]
        lines += [_command(c) for c in m["commands"]]
        lines += ["```"]
    v = m.get("versions", {})
    lines += ["", f"TVM {v.get('apache-tvm')}, apache-tvm-ffi {v.get('apache-tvm-ffi')}, Python {v.get('python')}, "
              f"pipeline {v.get('tensor-cost-pipeline')}; made {m.get('created')}.", "",
              "## Use", "", "```bash",
              f"python -m pipeline stage=train dataset=release dataset.release={m['name']} target={m['target']['name']}",
              "```", "",
              "To label the same programs on another machine: `dataset=release dataset.labels=false`, then "
              "`stage=replay`, `stage=measure` and `stage=release` there.", "",
              "## Licence", "", f"{m.get('licence')}. The workloads come from the MetaSchedule operator suite and "
              "network definitions in this repository (random weights).", ""]
    return lines


def model_card(m: dict) -> str:
    """MODEL.md: the model, what it was trained on, what it was held out from, its figures."""
    ev = m.get("evaluation") or {}
    lines = [
        f"# {m['name']}", "",
        f"A `{m['model']}` cost model on `{m['features']}` features for target kind `{m['target_kind']}`, trained "
        f"on release `{m.get('training_release')}` (hardware: {m.get('hardware')})"
        + (f" and the schedules measured by its kept tuning runs of {', '.join(m['tuning_networks'])} (training "
           f"records only: `dataset.tuning_networks`)" if m.get("tuning_networks") else "") + ".", "",
        (f"- split: `{m.get('split')}`; held-out networks: {', '.join(m.get('test_networks') or []) or 'none'} "
         f"({len(m.get('test_tasks') or [])} held-out tasks, never trained on)") if m.get("test_tasks") else
        f"- split: `{m.get('split')}`: trained on every task of the release (a share of each task's records held "
        f"out for validation and test)",
        f"- MLflow run {m.get('run_id')} (seed {m.get('seed')}), TVM {m.get('versions', {}).get('apache-tvm')}",
    ]
    own = m.get("metrics") or {}
    if own:
        shown = [f"{label} {own[k]:.3f}" for k, label in (("test_top1_score", "test top-1"), ("test_top5_score", "top-5"),
                                                          ("test_pair_acc", "pairwise accuracy"),
                                                          ("val_top1_score", "validation top-1"),
                                                          ("val_pair_acc", "validation pairwise accuracy"))
                 if own.get(k) is not None]
        lines += [f"- this run: {', '.join(shown)}"]
    lines += [""]
    if ev.get("rows"):
        cols = ev["columns"]
        lines += ["## Evaluation", "", ev.get("caption", ""), "", "| | " + " | ".join(cols) + " |",
                  "|---|" + "---|" * len(cols)]
        lines += [f"| {r['row']} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in ev["rows"]]
        lines += [""]
    lines += ["## Use", "", "```python", "from pipeline.compute.builder import PersistentBuilder",
              "from pipeline.tuning.cost_model import PipelineCostModel",
              f"cost_model = PipelineCostModel.from_pretrained(\"{m['name']}\")",
              "ms.tune_tir(mod, target, work_dir, max_trials_global=64, cost_model=cost_model,",
              "            builder=PersistentBuilder())  # not the default LocalBuilder: docs/tuning.md", "```", "",
              f"or `python -m pipeline stage=tune tune.model_uri=pretrained:{m['name']}`. The model refuses "
              f"candidates of a target kind other than `{m['target_kind']}`.", "",
              f"Licence: {m.get('licence')}.", ""]
    return "\n".join(lines)
