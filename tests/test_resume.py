"""An interrupted replay loses nothing: the next run builds exactly what is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from pipeline.core import schema as S
from pipeline.core.workspace import read_table

from conftest import ROOT


def test_killed_replay_resumes_without_loss(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    data = tmp_path / "data"
    ws = data / root.name
    shutil.copytree(root, ws, ignore=shutil.ignore_patterns("kernels", "lib", "measurements", "runner"))
    args = [a for a in overrides if not a.startswith("paths.data=")] + [f"paths.data={data}", "jobs=1",
                                                                          "replay.flush_rows=2"]
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "stage=replay", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list((ws / "kernels").glob("part-*.parquet")):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = read_table(ws / "kernels", S.KERNELS)
    cands = read_table(ws / "candidates", S.CANDIDATES).dropna(subset=["trace_json"])
    assert 0 < len(first) < len(cands), "the kill should land halfway"
    out = subprocess.run([sys.executable, "-m", "pipeline", "stage=replay", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    kernels = read_table(ws / "kernels", S.KERNELS)
    assert kernels["record_id"].is_unique
    assert set(kernels["record_id"]) == set(cands["record_id"])
    assert set(first["record_id"]) <= set(kernels["record_id"])
    assert f"new {len(cands) - len(first)}," in out.stdout
