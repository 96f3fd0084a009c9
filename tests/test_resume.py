"""Interrupted runs lose nothing and leave nothing behind; a second run at once is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from pipeline.device import harness
from pipeline.core import schema as S
from pipeline.core.workspace import read_table

from conftest import ROOT, copy_workspace


def start_stage(stage: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline", f"stage={stage}", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_for(condition, timeout_s: float = 300.0, what: str = "") -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def sigkill_alone(proc: subprocess.Popen) -> list[psutil.Process]:
    """SIGKILL the stage process alone (not its process group: its children must go by
    themselves); returns those that are still alive 10 s later."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the stage should have started worker processes"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    return alive


def cleanup(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_killed_replay_leaves_no_worker_and_resumes_without_loss(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    ws, over = copy_workspace(root, overrides, tmp_path / "data", "kernels", "lib", "measurements", "runner")
    args = [*over, "jobs=2", "replay.flush_rows=2"]
    proc = start_stage("replay", args)
    try:
        wait_for(lambda: list((ws / "kernels").glob("part-*.parquet")), what="the first kernels")
        # Paused, so that it is still running (and halfway) however slowly the second starts.
        os.kill(proc.pid, signal.SIGSTOP)
        # A second replay of the workspace while the first runs: refused, naming the first.
        second = subprocess.run([sys.executable, "-m", "pipeline", "stage=replay", *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 2
        assert f"stage=replay on workspace {ws.name} is already running: pid {proc.pid}" in \
            second.stdout + second.stderr
        assert sigkill_alone(proc) == [], "build workers outlived a SIGKILLed replay"
    finally:
        cleanup(proc)
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


# A process whose two build workers are busy for ten minutes (a build that hangs), once
# both have started (a first job each: their initializer has run).
BUSY_BUILDER = """
import time
from pipeline.compute.builder import PersistentBuilder
pool = PersistentBuilder(max_workers=2, timeout_sec=600, preload_intrinsics=False)._pool()
for f in [pool.submit(time.sleep, 2) for _ in range(2)]:
    f.result()
futures = [pool.submit(time.sleep, 600) for _ in range(2)]
print("busy", flush=True)
time.sleep(600)
"""


def test_build_workers_die_with_their_process_even_mid_build():
    """What the replay test above cannot catch with builds of a second: a worker killed
    mid-build, which TVM's worker only notices once its build returns."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY_BUILDER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "busy"
        assert len(psutil.Process(proc.pid).children()) == 2
        assert sigkill_alone(proc) == [], "build workers outlived their SIGKILLed process"
    finally:
        cleanup(proc)


def test_killed_measure_leaves_no_runner_and_keeps_its_finished_results(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    ws, over = copy_workspace(root, overrides, tmp_path / "data", "measurements", "runner")
    args = [*over, "measure.min_repeat_ms=100", "measure.check_per_task=0"]
    events = ws / "runner" / "results.jsonl"
    proc = start_stage("measure", args)
    try:
        wait_for(lambda: len(harness.done_events(events)) >= 2, what="two measured kernels")
        alive = sigkill_alone(proc)
        assert alive == [], f"a runner outlived a SIGKILLed measure: {[p.cmdline() for p in alive]}"
    finally:
        cleanup(proc)
    finished = harness.done_events(events)
    written = read_table(ws / "measurements", S.MEASUREMENTS) if (ws / "measurements").exists() else None
    assert len(finished) >= 2 and (written is None or not set(finished) & set(written["record_id"]))
    out = subprocess.run([sys.executable, "-m", "pipeline", "stage=measure", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    meas = read_table(ws / "measurements", S.MEASUREMENTS).set_index("record_id")
    kernels = read_table(ws / "kernels", S.KERNELS)
    assert set(meas.index) == set(kernels["record_id"]) and meas.index.is_unique
    # The kernels timed before the kill were not timed again: their rows are those results.
    for rid, ev in finished.items():
        assert list(meas.loc[rid, "run_secs"]) == ev["run_secs"]
