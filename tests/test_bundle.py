"""collect.mode=export/import: bundle parts run in a fresh virtual environment, as on a bare GPU host."""

from __future__ import annotations

import json
import os
import subprocess
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from features.ncu import sections
from pipeline.config import compose, run_stage
from pipeline.core import schema as S
from pipeline.core.errors import PipelineError
from pipeline.core.workspace import read_table
from pipeline.runner import bundle, wheels
from pipeline.options import workspace_of

HERE_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def gpu_host_python() -> tuple[str, str]:
    """(interpreter, "X.Y") for the rehearsal: Python 3.12, the GPU host's, where this machine
    has one (pyenv's or on PATH; a pyenv shim of a version that is not selected does not
    run), else this interpreter (the same mechanics)."""
    for exe in [*sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12")), shutil.which("python3.12")]:
        if exe and subprocess.run([str(exe), "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                  capture_output=True).returncode == 0:
            return str(exe), "3.12"
    return sys.executable, HERE_PYTHON


def test_jobs_split_by_size_and_count(tmp_path):
    for i, size in enumerate([400, 400, 300, 100, 50]):
        (tmp_path / f"k{i}.so").write_bytes(b"x" * size)
    (tmp_path / "ref.npz").write_bytes(b"r" * 100)
    jobs = [dict(record_id=f"r{i}", artifact=f"k{i}.so", reference="ref.npz" if i < 2 else None) for i in range(5)]
    parts = bundle.split_jobs(tmp_path, jobs, budget_bytes=1000, max_kernels=3)
    # A reference counts once per part; a new part starts when the bytes or the count would overflow.
    assert [[j["record_id"] for j in p] for p in parts] == [["r0", "r1"], ["r2", "r3", "r4"]]
    assert [len(p) for p in bundle.split_jobs(tmp_path, jobs, budget_bytes=10**6, max_kernels=2)] == [2, 2, 1]


def test_a_missing_wheel_offline_names_the_package_and_the_command(tmp_path):
    with pytest.raises(PipelineError) as e:
        wheels.fetch(["no-such-package-for-bundles==0.0.1"], HERE_PYTHON, "manylinux2014_x86_64", tmp_path)
    msg = str(e.value)
    assert "no-such-package-for-bundles==0.0.1" in msg and "pip download" in msg and str(tmp_path) in msg


def test_results_that_are_not_there_are_named(tmp_path):
    with pytest.raises(PipelineError, match="no results of a bundle part"):
        bundle.results_folders([tmp_path], tmp_path)
    with pytest.raises(PipelineError, match="no such results folder"):
        bundle.results_folders([tmp_path / "nope.tar.gz"], tmp_path)


def test_collect_bundle_runs_in_a_fresh_venv_and_imports_back(measured_workspace, tmp_path):
    """Export (ncu profiler, llvm kernels, wheels for the host's Python: 3.12 where this
    machine has it), run the part with a fresh venv of that Python holding only NumPy and no
    ncu, import measurements (and no ncu rows) back."""
    from conftest import copy_workspace

    host_python, version = gpu_host_python()
    root, over = copy_workspace(*measured_workspace, tmp_path / "data", "measurements", "runner", "features")
    over += ["collect=ncu", "collect.static=false", f"bundle.python={version}",
             f"paths.ncu_profiles={tmp_path / 'ncu'}"]
    try:
        numpy = wheels.fetch(["numpy"], version, "manylinux2014_x86_64")
        out = run_stage("collect", [*over, "collect.mode=export"])
    except PipelineError as e:
        if "could not download" in str(e):
            pytest.skip(f"wheels not in the cache and no registry: {e}")
        raise
    built = read_table(root / "kernels", S.KERNELS).dropna(subset=["artifact"])
    assert out["exported"] == len(built) and out["parts"] == 1 and max(out["part_mib"]) <= 64
    part_file = root / "bundle-collect-0" / "part-0.tar.gz"
    host = tmp_path / "host"
    with tarfile.open(part_file) as tar:
        tar.extractall(host, filter="data")
    part = host / "part-0"
    names = sorted(p.name for p in part.iterdir())
    assert names == ["RUN.txt", "harness", "jobs.jsonl", "lib", "ncu_profiles", "part.json", "references",
                     "run_part.py", "runtime", "wheels"]
    # the curated list's section files travel with the part, and its ncu command names them
    assert {p.name: p.read_text() for p in (part / "ncu_profiles").iterdir()} == sections.files()
    assert not (part / "runtime" / "tvm" / "lib" / "libtvm_compiler.so").exists()
    spec = json.loads((part / "part.json").read_text())
    assert spec["ncu"]["args"][:4] == ["--export", "{report}.ncu-rep", "--force-overwrite", "--nvtx"]
    args = spec["ncu"]["args"]
    assert args[args.index("--section-folder") + 1] == "{part}/ncu_profiles" and "--metrics" not in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--section"] == sections.identifiers()

    venv = tmp_path / "venv"
    subprocess.run([host_python, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    assert subprocess.run([py, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                          check=True).stdout.startswith(version)
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check", *numpy],
                   check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"  # no ncu, nothing of the project
    cmd = (part / "RUN.txt").read_text().replace("python3", str(py))
    run = subprocess.run(["sh", "-c", cmd], cwd=part, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sum("ncu: not found on PATH" in line for line in run.stdout.splitlines()) == 1
    assert f"measure: {len(built)}/{len(built)} kernels done (0 failed)" in run.stdout
    packed = host / "results-part-0.tar.gz"
    # A time limit already passed: no chunk starts, the results say why, and the same
    # command without the limit goes on from there.
    cut = subprocess.run([str(py), "run_part.py", "--results", "cut", "--time-limit-s", "0"], cwd=part, env=env,
                         capture_output=True, text=True, timeout=600)
    assert cut.returncode == 0 and "time limit of 0 s reached" in cut.stdout
    assert json.loads((part / "cut" / "status.json").read_text())["stopped"] == "time limit"
    assert not (part / "cut" / "measure.jsonl").exists()
    # Run again: everything is done, nothing is timed twice.
    again = subprocess.run(["sh", "-c", cmd], cwd=part, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "install:" not in again.stdout
    assert sum(1 for line in (part / "results" / "measure.jsonl").read_text().splitlines()
               if '"start"' in line) == len(built)

    back = run_stage("collect", [*over, "collect.mode=import", f"collect.results={packed}"])
    assert back["measure_measured"] == len(built) and back["measure_incorrect"] == 0
    assert back["measure_checked"] >= 3 and back["ncu_not_run"] == 1 and back["ncu"] == 0
    ws = workspace_of(compose(over))
    meas = ws.read("measurements")
    assert set(meas["record_id"]) == set(read_table(root / "kernels", S.KERNELS)["record_id"])
    assert (meas.dropna(subset=["mean_s"])["mean_s"] > 0).all()
    # measure.mode=import reads the same results.
    assert run_stage("measure", [*over, "measure.mode=import", f"measure.results={host}"])["measured"] == 0
