"""Build here, run there: a self-contained folder of kernels for a GPU host.

The bundle holds the exported kernels, the reference inputs/outputs, the job list,
the kernel harness (pipeline/core/harness.py, as harness.py) and (optionally) a
runtime-only copy of TVM: the installed `tvm` package without its compiler library,
headers and sources (about 30 MB instead of 300). On the GPU host:

    tar xzf bundle.tar.gz && cd bundle
    TVM_USE_RUNTIME_LIB=1 PYTHONPATH=runtime python3 harness.py \\
        --jobs jobs.jsonl --out results.jsonl --device cuda --instrument timer

and back here: `python -m pipeline stage=measure measure.mode=import
measure.results=<path>/results.jsonl`. The host also needs `apache-tvm-ffi` for its
Python version (a wheel of 3 MB; `pip download apache-tvm-ffi==<pin> --python-version
3.12 --only-binary=:all:` fetches it for a Python 3.12 host).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from pipeline.core import harness

log = logging.getLogger(__name__)

# Parts of the installed `tvm` package a runtime-only host does not need.
COMPILER_ONLY = ("lib/libtvm_compiler.so", "3rdparty", "include", "src")

RUN_COMMAND = ("TVM_USE_RUNTIME_LIB=1 PYTHONPATH=runtime python3 harness.py --instrument timer "
               "--jobs jobs.jsonl --out results.jsonl --device {device} --timeout-s {timeout}")


def runtime_tree(dest: Path) -> Path:
    """Copy the installed `tvm` package into `dest/tvm` without its compiler parts."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    src = Path(tvm.__file__).resolve().parent
    skip = {src / p for p in COMPILER_ONLY}

    def ignore(folder, names):
        return [n for n in names if Path(folder) / n in skip or n == "__pycache__"]

    out = dest / "tvm"
    shutil.copytree(src, out, ignore=ignore, dirs_exist_ok=True)
    return out


def export_bundle(root: Path, jobs: list[dict], dest: Path, device: str, timing: dict, timeout_s: float,
                  with_runtime: bool) -> Path:
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
    shutil.copy2(harness.HARNESS, dest / "harness.py")
    cmd = RUN_COMMAND.format(device=device, timeout=timeout_s)
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
