"""Workspace locks: one run per stage and shard, the holder named, nothing stale after a kill."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipeline.core import locks

from conftest import ROOT


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
