"""Build here, run there: a self-contained folder of kernels for a GPU host.

The bundle holds the exported kernels, the reference inputs/outputs, the job list,
the kernel harness (the package pipeline/device/harness, as harness/) and (optionally) a
runtime-only copy of TVM: the installed `tvm` package without its compiler library,
headers and sources (about 30 MB instead of 300). On the GPU host:

    tar xzf bundle.tar.gz && cd bundle
    TVM_USE_RUNTIME_LIB=1 PYTHONPATH=runtime python3 -m harness \\
        --jobs jobs.jsonl --out results.jsonl --device cuda --instrument timer

and back here: `python -m pipeline stage=measure measure.mode=import
measure.results=<path>/results.jsonl`. The host also needs `apache-tvm-ffi` for its
Python version (a wheel of 3 MB; `pip download apache-tvm-ffi==<pin> --python-version
3.12 --only-binary=:all:` fetches it for a Python 3.12 host).
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tarfile
import tempfile
from pathlib import Path

from features.ncu import sections
from pipeline.device import harness
from pipeline.core.errors import PipelineError
from pipeline.runner import part as host_part

log = logging.getLogger(__name__)

# Parts of the installed `tvm` package a runtime-only host does not need.
COMPILER_ONLY = ("lib/libtvm_compiler.so", "3rdparty", "include", "src")

RUN_COMMAND = ("TVM_USE_RUNTIME_LIB=1 PYTHONPATH=runtime python3 -m harness --instrument timer "
               "--jobs jobs.jsonl --out results.jsonl --device {device} --timeout-s {timeout}")


def tvm_package() -> Path:
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    return Path(tvm.__file__).resolve().parent


def runtime_tree(dest: Path) -> Path:
    """Copy the installed `tvm` package into `dest/tvm` without its compiler parts."""
    src = tvm_package()
    skip = {src / p for p in COMPILER_ONLY}

    def ignore(folder, names):
        return [n for n in names if Path(folder) / n in skip or n == "__pycache__"]

    out = dest / "tvm"
    shutil.copytree(src, out, ignore=ignore, dirs_exist_ok=True)
    return out


def export_bundle(root: Path, jobs: list[dict], dest: Path, device: str, timing: dict, timeout_s: float,
                  with_runtime: bool, cuda_arch: str | None = None) -> Path:
    """Write the bundle folder and its .tar.gz; returns the archive's path."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for j in jobs:
        for key in ("artifact", "reference"):
            if j.get(key):
                target = dest / j[key]
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    shutil.copy2(root / j[key], target)
    (dest / "jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    shutil.copytree(harness.HARNESS, dest / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    cmd = RUN_COMMAND.format(device=device, timeout=timeout_s)
    if cuda_arch:  # the exported CUDA source is compiled for it when the host loads a kernel
        cmd = f"{harness.CUDA_ARCH_ENV}={cuda_arch} {cmd}"
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in timing.items())
    (dest / "RUN.txt").write_text(f"{cmd} {flags}\n")
    if with_runtime:
        runtime_tree(dest / "runtime")
    return Path(shutil.make_archive(str(dest), "gztar", root_dir=dest.parent, base_dir=dest.name))


def read_results(path: Path) -> list[dict]:
    """The `done` events of a results.jsonl written by the harness on the device host; a
    line that cannot be read is named with its line number and skipped."""
    if not path.exists():
        raise FileNotFoundError(path)
    bad: list = []
    done = harness.done_events(path, bad)
    for line_no, reason in bad:
        log.warning("%s:%d: skipped, not a harness event (%s)", path, line_no, reason)
    return list(done.values())


# ----------------------------------------------------------------------------- parts

MIB = 1 << 20
# What a part's command is, run from inside the unpacked part.
PART_COMMAND = "python3 run_part.py --pack ../results-part-{k}.tar.gz"
# The curated list's section files in a part, and the ncu argument that names them (run_part.py
# puts the part's folder in place of `{part}` on the host).
SECTIONS = "ncu_profiles"
SECTIONS_ARG = "{part}/" + SECTIONS


def runtime_filter(src: Path):
    """tarfile filter that leaves out the compiler-only parts of the `tvm` package at `src`."""
    skip = tuple(f"tvm/{p}" for p in COMPILER_ONLY)

    def keep(info: tarfile.TarInfo):
        rel = info.name.split("/", 2)[-1] if info.name.count("/") >= 2 else ""
        if "__pycache__" in info.name.split("/") or any(rel == s or rel.startswith(s + "/") for s in skip):
            return None
        return info

    return keep


def no_bytecode(info: tarfile.TarInfo):
    """tarfile filter that leaves out Python's bytecode caches."""
    return None if "__pycache__" in info.name.split("/") else info


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _write_part(path: Path, name: str, root: Path, jobs: list[dict], spec: dict, wheels: list[Path],
                runtime: Path | None) -> Path:
    with tarfile.open(path, "w:gz", compresslevel=6) as tar:
        files = sorted({j[k] for j in jobs for k in ("artifact", "reference") if j.get(k)})
        for f in files:
            tar.add(root / f, arcname=f"{name}/{f}")
        _add_bytes(tar, f"{name}/jobs.jsonl", "".join(json.dumps(j) + "\n" for j in jobs).encode())
        _add_bytes(tar, f"{name}/part.json", (json.dumps(spec, indent=1) + "\n").encode())
        _add_bytes(tar, f"{name}/RUN.txt", (PART_COMMAND.format(k=spec["part"]) + "\n").encode())
        if spec.get("ncu") and SECTIONS_ARG in spec["ncu"]["args"]:  # the curated list's section files
            for file, text in sections.files().items():
                _add_bytes(tar, f"{name}/{SECTIONS}/{file}", text.encode())
        tar.add(harness.HARNESS, arcname=f"{name}/harness", filter=no_bytecode)
        tar.add(host_part.HERE / "part.py", arcname=f"{name}/run_part.py")
        for w in wheels:
            tar.add(w, arcname=f"{name}/wheels/{w.name}")
        if runtime is not None:
            tar.add(runtime, arcname=f"{name}/runtime/tvm", filter=runtime_filter(runtime))
    return path


def split_jobs(root: Path, jobs: list[dict], budget_bytes: int, max_kernels: int) -> list[list[dict]]:
    """Consecutive groups of jobs whose files (libraries, references) fit `budget_bytes`
    (uncompressed: an upper bound) and count at most `max_kernels`."""
    parts: list[list[dict]] = [[]]
    used: int = 0
    seen: set = set()
    for j in jobs:
        files = [j[k] for k in ("artifact", "reference") if j.get(k)]
        size = sum((root / f).stat().st_size for f in files if f not in seen)
        if parts[-1] and (len(parts[-1]) >= max_kernels or used + size > budget_bytes):
            parts.append([])
            used, seen = 0, set()
            size = sum((root / f).stat().st_size for f in files)
        parts[-1].append(j)
        used += size
        seen.update(files)
    return [p for p in parts if p]


def export_parts(root: Path, jobs: list[dict], dest: Path, *, spec: dict, wheels: list[Path], with_runtime: bool,
                 part_mib: float, part_kernels: int) -> list[Path]:
    """Write the bundle `dest/` as parts `part-<k>.tar.gz`, each at most `part_mib` MiB and
    `part_kernels` kernels and self-contained: its kernels, jobs, the harness, the host
    runner (run_part.py), the wheels and the runtime-only TVM. `spec` (part.json): device,
    python, measure {options, timeout_s}, ncu {args, options, timeout_s, chunk} or None."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    runtime = tvm_package() if with_runtime else None
    limit = int(part_mib * MIB)
    base = _write_part(dest / ".base.tar.gz", "part-0", root, [], dict(spec, part=0, parts=1), wheels, runtime)
    base_bytes = base.stat().st_size
    base.unlink()
    if base_bytes >= limit:
        raise PipelineError(f"bundle: the wheels and runtime alone take {base_bytes / MIB:.1f} MiB, more than "
                            f"bundle.part_mib={part_mib:g}")
    groups = split_jobs(root, jobs, limit - base_bytes, max(1, int(part_kernels)))
    out = []
    for k, group in enumerate(groups):
        name = f"part-{k}"
        path = _write_part(dest / f"{name}.tar.gz", name, root, group, dict(spec, part=k, parts=len(groups)),
                           wheels, runtime)
        if path.stat().st_size > limit:
            raise PipelineError(f"bundle: {path} takes {path.stat().st_size / MIB:.1f} MiB, more than "
                                f"bundle.part_mib={part_mib:g}; lower bundle.part_kernels")
        out.append(path)
    sizes = {p.name: p.stat().st_size for p in out}
    (dest / "parts.json").write_text(json.dumps({"parts": sizes, "kernels": len(jobs), "base_bytes": base_bytes,
                                                 "wheels": [w.name for w in wheels]}, indent=1) + "\n")
    return out


def results_folders(paths, tmp: Path) -> list[Path]:
    """The results folders named by `paths`: a results folder (it holds measure.jsonl), a
    packed one (`results-part-<k>.tar.gz`, unpacked under `tmp`), or a folder holding several."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file() and p.name.endswith((".tar.gz", ".tgz")):
            into = Path(tempfile.mkdtemp(prefix=p.name.split(".")[0] + "-", dir=tmp))
            with tarfile.open(p) as tar:
                tar.extractall(into, filter="data")
            out.append(into)
        elif p.is_dir() and (p / "measure.jsonl").exists():
            out.append(p)
        elif p.is_dir():
            inner = sorted(p.glob("results-part-*.tar.gz")) + sorted(
                d for d in p.iterdir() if d.is_dir() and (d / "measure.jsonl").exists())
            found = results_folders(inner, tmp) if inner else []
            if not found:
                raise PipelineError(f"{p}: no results of a bundle part in this folder (measure.jsonl, or "
                                    "results-part-<k>.tar.gz)")
            out += found
        else:
            raise PipelineError(f"{p}: no such results folder or results-part-<k>.tar.gz")
    return out
