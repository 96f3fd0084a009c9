"""Wheels a device host lacks, fetched once for its Python and platform and kept in a cache.

A GPU host without a package registry gets its Python packages as wheels inside the
bundle. They are downloaded here with pip (`pip download --only-binary=:all:
--python-version <v> --platform <p> --no-deps`) into `<cache>/<python>-<platform>/` (the
user's cache folder by default, `bundle.wheel_cache` otherwise) and taken from there on
the next export, so only the first export needs the registry.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError

# Folder under the user's cache folder that holds the wheels.
CACHE_NAME = "tcp-pipeline/wheels"
# Packages the harness needs on every host, at the version installed here (the runtime-only
# TVM shipped in the bundle is the one installed here, and speaks to this tvm-ffi).
ALWAYS = ("apache-tvm-ffi", "typing-extensions")
# For the NVTX instrument (the ncu step).
NVTX = ("nvtx",)
# libcudart.so.13, which TVM's CUDA runtime library (libtvm_runtime_cuda.so) links against.
CUDA_RUNTIME = ("nvidia-cuda-runtime==13.0.96",)


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / CACHE_NAME


def pinned(name: str) -> str:
    """`name==<version installed here>`, or `name` as given when it already pins one."""
    if "==" in name:
        return name
    try:
        return f"{name}=={importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError as e:
        raise PipelineError(f"bundle: {name} is not installed here, so its version for the device host is "
                            f"unknown; install it (pip install {name}) or pin it") from e


def wheel_name(requirement: str) -> str:
    """How a distribution's name begins in its wheel's file name (PEP 427: `-`/`.` -> `_`)."""
    return re.sub(r"[-_.]+", "_", requirement.split("==")[0]).lower()


def find(folder: Path, requirement: str) -> Path | None:
    name, _, version = requirement.partition("==")
    for w in sorted(folder.glob("*.whl")):
        parts = w.name.split("-")
        if parts[0].lower() == wheel_name(name) and (not version or parts[1] == version):
            return w
    return None


def download_command(requirement: str, python: str, platform: str, dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps",
            "--python-version", python, "--implementation", "cp", "--platform", platform,
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64",
            "--disable-pip-version-check", "-d", str(dest), requirement]


def fetch(requirements: list[str], python: str, platform: str, cache: Path | None = None) -> list[Path]:
    """A wheel of each requirement (`name` = the version installed here, or `name==v`) for
    Python `python` on `platform`, from the cache, else downloaded into it."""
    folder = (Path(cache).expanduser() if cache else default_cache()) / f"cp{python.replace('.', '')}-{platform}"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for req in map(pinned, requirements):
        wheel = find(folder, req)
        if wheel is None:
            cmd = download_command(req, python, platform, folder)
            run = subprocess.run(cmd, capture_output=True, text=True)
            wheel = find(folder, req)
            if run.returncode != 0 or wheel is None:
                tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-2:])[:600]
                raise PipelineError(
                    f"bundle: no wheel of {req} for Python {python} on {platform} in {folder}, and pip could not "
                    f"download it ({tail}). On a machine with the registry run `{' '.join(cmd)}` and copy the "
                    f"wheel into {folder} (or set bundle.wheel_cache to a folder that holds it)")
        out.append(wheel)
    return out
