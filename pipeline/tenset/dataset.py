"""Where a TenSet copy lives, how an archive is verified and unpacked, and its task files.

A TenSet archive (`dataset_gpu_v3.3.zip`, `dataset_cpu_v3.3.zip`) unpacks to
`dataset_gpu/` or `dataset_cpu/` with `network_info/` (task pickles) and
`measure_records/<device>/` (Ansor records). The pipeline unpacks archives under
`<paths.data>/tenset/`; `dataset.path` may instead name a zip or a folder the user has.
"""

from __future__ import annotations

import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

# `((resnet_18,[(1,3,224,224)]),cuda).task.pkl`: network, input shapes, target kind.
_TASK_FILE = re.compile(r"^\(\((?P<net>[^,]+),(?P<shapes>\[.*\])\),(?P<target>[^)]+)\)\.task\.pkl$")


class DatasetError(PipelineError, ValueError):
    """The TenSet copy is missing or malformed; the message says what to do."""


@dataclass(frozen=True)
class TaskFile:
    path: Path
    network: str
    shapes: str
    target: str  # the target kind TenSet wrote in the name ("cuda", "llvm")


def tenset_root(data: Path | str) -> Path:
    """`<paths.data>/tenset`: where archives are downloaded to and unpacked."""
    return Path(data).expanduser().resolve() / "tenset"


def check_zip(path: Path) -> int:
    """Verifies every member's CRC; returns the member count."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            n = len(z.infolist())
    except zipfile.BadZipFile as e:
        raise DatasetError(f"{path} is not a valid zip archive ({e}); delete it and download it again") from e
    if bad is not None:
        raise DatasetError(f"{path}: member {bad!r} fails its CRC check; delete the archive and download it again")
    return n


# Bounds on what an untrusted archive may unpack to: TenSet's largest archive unpacks to a few
# GB of JSON at a ratio of about 10; a zip bomb declares gigabytes per compressed kilobyte.
MAX_UNPACKED_BYTES = 64 << 30
MAX_RATIO = 200  # uncompressed / compressed size of one member (members over 1 MiB)
_S_IFLNK = 0o120000


def check_members(archive: Path, members: list[zipfile.ZipInfo], root: Path, *, max_bytes: int = MAX_UNPACKED_BYTES,
                  max_ratio: float = MAX_RATIO) -> None:
    """Refuse an archive before anything is unpacked: a member outside `root`, a symbolic
    link, two members that clash (a file where another needs a folder, or a name twice),
    a member that inflates more than `max_ratio` times, or more than `max_bytes` in all
    (the declared sizes: zipfile stops a member at its declared size)."""
    total, files, dirs = 0, set(), set()
    for m in members:
        name = m.filename.rstrip("/")
        if not (root / m.filename).resolve().is_relative_to(root):  # an untrusted archive must not escape dest
            raise DatasetError(f"{archive}: member {m.filename!r} points outside {root}; refusing to unpack")
        if (m.external_attr >> 16) & 0o170000 == _S_IFLNK:
            raise DatasetError(f"{archive}: member {m.filename!r} is a symbolic link; refusing to unpack (TenSet's "
                               f"archives hold none): use the archive as published")
        parents = {str(Path(name).parents[i]) for i in range(len(Path(name).parts) - 1)}
        if m.is_dir():
            dirs.add(name)
        elif name in files or name in dirs:
            raise DatasetError(f"{archive}: member {m.filename!r} appears twice or clashes with a folder; refusing "
                               f"to unpack: use the archive as published")
        else:
            files.add(name)
        dirs |= parents
        if files & parents or dirs & files:
            raise DatasetError(f"{archive}: member {m.filename!r} needs a folder where another member is a file; "
                               f"refusing to unpack: use the archive as published")
        if m.file_size > (1 << 20) and m.file_size > max_ratio * max(m.compress_size, 1):
            raise DatasetError(f"{archive}: member {m.filename!r} inflates {m.file_size / max(m.compress_size, 1):.0f}"
                               f"-fold ({m.compress_size} -> {m.file_size} bytes), over the bound of {max_ratio:g}; "
                               f"refusing to unpack (a zip bomb?): use the archive as published")
        total += m.file_size
    if total > max_bytes:
        raise DatasetError(f"{archive}: its members unpack to {total / 2**30:.1f} GiB, over the bound of "
                           f"{max_bytes / 2**30:.0f} GiB; refusing to unpack: use the archive as published")


def unpack(archive: Path, dest: Path, *, max_bytes: int = MAX_UNPACKED_BYTES, max_ratio: float = MAX_RATIO) -> Path:
    """Unpacks `archive` into `dest` once (a marker file records completion), within the
    bounds of `check_members`."""
    marker = dest / f".unpacked-{archive.name}"
    if marker.exists():
        return dest
    root = dest.resolve()
    try:
        with zipfile.ZipFile(archive) as z:  # the declared members first: a bomb is never inflated
            check_members(archive, z.infolist(), root, max_bytes=max_bytes, max_ratio=max_ratio)
    except zipfile.BadZipFile as e:
        raise DatasetError(f"{archive} is not a valid zip archive ({e}); delete it and download it again") from e
    check_zip(archive)
    with zipfile.ZipFile(archive) as z:
        dest.mkdir(parents=True, exist_ok=True)
        log.info("unpacking %s into %s", archive, dest)
        z.extractall(root)
    marker.write_text(archive.name + "\n")
    return dest


def resolve(path: str | Path | None, data: Path | str) -> Path:
    """The folder holding the TenSet copy to read: `path` (`dataset.path`; a zip is unpacked),
    else the copy under `data` (`paths.data`) that stage=download made."""
    if path:
        p = Path(str(path)).expanduser().resolve()
        if not p.exists():
            raise DatasetError(f"dataset.path={path} does not exist: point it at a TenSet zip or unpacked folder")
        if p.is_file():
            if not zipfile.is_zipfile(p):
                raise DatasetError(f"dataset.path={path} is a file but not a zip archive")
            return unpack(p, tenset_root(data))
        return p
    root = tenset_root(data)
    if not root.exists():
        raise DatasetError(
            f"no TenSet copy under {root}: run `python -m pipeline stage=download dataset=tenset` "
            f"or pass dataset.path=<zip or folder>"
        )
    return root


def network_info_dirs(root: Path) -> list[Path]:
    """`network_info` folders at `root` or up to two levels below it."""
    found = [p for p in [root / "network_info", *root.glob("*/network_info"), *root.glob("*/*/network_info")]
             if p.is_dir()]
    return sorted(set(found))


def task_files(root: Path) -> list[TaskFile]:
    dirs = network_info_dirs(root)
    if not dirs:
        raise DatasetError(f"no network_info/ folder under {root}: is it an unpacked TenSet dataset?")
    out, seen = [], set()
    for d in dirs:
        for p in sorted(d.glob("*.task.pkl")):
            m = _TASK_FILE.match(p.name)
            if not m:
                log.warning("skipping %s: not named ((<network>,[shapes]),<target>).task.pkl", p)
                continue
            if p.name in seen:
                continue
            seen.add(p.name)
            out.append(TaskFile(p, m["net"], m["shapes"], m["target"]))
    return out


def record_files(root: Path, target_kind: str, devices=None) -> list[Path]:
    """`measure_records/<device>/*.json` under `root` whose name ends with the target kind."""
    out = []
    for d in sorted([*root.glob("measure_records"), *root.glob("*/measure_records")]):
        for dev in sorted(p for p in d.iterdir() if p.is_dir()):
            if devices and dev.name not in devices:
                continue
            out += [p for p in sorted(dev.glob("*.json")) if p.name.endswith(f",{target_kind}).json")]
    return out
