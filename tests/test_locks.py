"""Workspace locks: one run per stage and shard, the holder named, nothing stale after a kill."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from pipeline.core import locks

from conftest import ROOT
from pipeline.options import workspace_of


def test_a_second_holder_is_refused_with_the_first_named(tmp_path):
    root = tmp_path / "ops-llvm"
    with locks.stage_lock(root, "replay"):
        t0 = time.monotonic()
        with pytest.raises(locks.LockHeld) as held:
            with locks.stage_lock(root, "replay", wait_s=0.5):
                pass
        assert time.monotonic() - t0 >= 0.5  # it waited as long as it was told to
        msg = str(held.value)
        assert msg.startswith(f"stage=replay on workspace ops-llvm is already running: pid {os.getpid()} on ")
        assert "lock.wait_s" in msg
        with locks.stage_lock(root, "measure"), locks.stage_lock(root, "replay", 1, 2):
            pass  # another stage, another shard: other locks
    with locks.stage_lock(root, "replay"):
        pass  # released with the block


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    code = ("import sys, time; from pathlib import Path; from pipeline.core import locks\n"
            "with locks.stage_lock(Path(sys.argv[1]), 'sample'):\n"
            "    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(locks.LockHeld, match=f"pid {proc.pid}"):
            with locks.stage_lock(tmp_path, "sample"):
                pass
    finally:
        proc.kill()
        proc.wait()
    with locks.stage_lock(tmp_path, "sample"):
        pass


def test_timing_stages_hold_one_lock_per_host_whatever_the_shard(tmp_path):
    """A sharded and an unsharded measure (or collect) on one host would time each other's
    load and, before, wrote the same events file: one excludes the other."""
    for stage in locks.TIMING_STAGES:
        with locks.stage_lock(tmp_path, stage, 0, 2):
            for index, count in ((0, 1), (1, 2), (0, 3)):
                with pytest.raises(locks.LockHeld, match=f"stage={stage} on workspace .* on this host"):
                    with locks.stage_lock(tmp_path, stage, index, count):
                        pass


def test_a_sharded_measure_waits_for_an_unsharded_one_on_a_real_workspace(measured_workspace, tmp_path):
    from conftest import copy_workspace
    from pipeline.config import run_stage
    from pipeline.runner.modes import Local

    root, over = copy_workspace(*measured_workspace, tmp_path, "runner")
    before = sorted(p.name for p in (root / "measurements").iterdir())
    with locks.stage_lock(root, "measure", 0, 1):
        with pytest.raises(locks.LockHeld, match="stage=measure"):
            run_stage("measure", [*over, "shard.index=0", "shard.count=2", "force=true"])
    assert sorted(p.name for p in (root / "measurements").iterdir()) == before  # force deleted nothing
    from pipeline.config import compose
    from pipeline.options import executor_of, measure_settings

    names = set()
    for index, count in ((0, 1), (0, 2), (1, 2)):
        cfg = compose([*over, f"shard.index={index}", f"shard.count={count}"])
        with executor_of(cfg) as ex:
            names.add(Local(measure_settings(cfg), workspace_of(cfg), ex).events)
    assert len(names) == 3  # no two shardings share an events file


HOLD_GROUP = ("import sys, time; from pathlib import Path; from pipeline.core import locks\n"
              "with locks.runs_lock(Path(sys.argv[1]), sys.argv[2], wait_s=0):\n"
              "    print('held', flush=True); time.sleep(600)\n")


def hold_group(root, stage: str) -> subprocess.Popen:
    """Another process holding stage=`stage`'s place on the workspace at `root` (runs_lock)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_GROUP, str(root), stage], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_trains_overlap_and_a_compare_waits_for_all_of_them_or_names_them(tmp_path):
    """Trains of one workspace may run at once (a sweep); a compare that would read their runs
    meanwhile is refused naming every one, or waits for the last to end."""
    root = tmp_path / "ops-llvm"
    first = hold_group(root, "train")
    second = hold_group(root, "train")  # a second train joins the first
    try:
        with pytest.raises(locks.LockHeld) as held:
            with locks.runs_lock(root, "compare", wait_s=0.3):
                pass
        msg = str(held.value)
        assert msg.startswith("stage=train on workspace ops-llvm is running: pid ")
        assert f"pid {first.pid} " in msg and f"pid {second.pid} " in msg and "lock.wait_s" in msg
        with locks.runs_lock(root, "train"):
            pass  # this process trains too, alongside them
        first.kill()
        first.wait()
        threading.Timer(0.5, second.terminate).start()  # ends while the compare waits
        with locks.runs_lock(root, "compare", wait_s=60) as joined:
            assert [h["pid"] for h in joined.waited_for] == [second.pid] and joined.waited_s > 0
    finally:
        for p in (first, second):
            p.kill()
            p.wait()
    assert not list((root / ".locks" / "train.holders").iterdir())  # the killed one's file is gone too
    with locks.runs_lock(root, "compare", wait_s=0) as joined:
        assert joined.waited_for == []


def test_a_train_waits_for_a_compare_that_reads_the_runs(tmp_path):
    reader = hold_group(tmp_path, "compare")
    try:
        with locks.runs_lock(tmp_path, "compare"):
            pass  # compares overlap among themselves (a sweep of comparisons)
        with pytest.raises(locks.LockHeld, match=f"stage=compare on workspace {tmp_path.name} is running: pid "
                                                 f"{reader.pid} .*stage=train waited 0 s"):
            with locks.runs_lock(tmp_path, "train", wait_s=0.2):
                pass
    finally:
        reader.kill()
        reader.wait()
    with locks.runs_lock(tmp_path, "train", wait_s=0) as joined:
        assert joined.waited_for == []
