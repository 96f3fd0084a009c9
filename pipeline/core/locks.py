"""One run at a time per stage and shard of a workspace, and one writer at a time per file.

A lock is `flock` on a file under `<workspace>/.locks/`: the kernel releases it when the
process that holds it ends, however it ends (SIGKILL included), so a killed run never
leaves a stale lock behind. The lock file names its holder (pid, host, start time,
command) for the message that a second run gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import PipelineError

# Seconds between two tries while waiting for a lock.
POLL_S = 0.2


class LockHeld(PipelineError):
    """Another process holds the lock; the message names it and what to do."""


def holder(path: Path) -> dict:
    """What the lock file says of the process that holds it ({} when it says nothing)."""
    try:
        return json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def describe(info: dict) -> str:
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} since {started} (`{info.get('command', '?')}`)"


@contextlib.contextmanager
def exclusive(path: Path, *, what: str, wait_s: float | None = 0.0, advice: str = "") -> Iterator[None]:
    """Hold the lock `path` for the `with` block. Another holder: wait up to `wait_s`
    seconds (None: as long as it takes), then raise LockHeld naming it and `what` it guards."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = None if wait_s is None else time.monotonic() + max(0.0, float(wait_s))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeld(f"{what} is already running: {describe(holder(path))}. {advice}".strip()) from None
                time.sleep(POLL_S)
        info = dict(pid=os.getpid(), host=socket.gethostname(), started=time.time(), command=" ".join(sys.argv))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


# Stages that time kernels: two of their runs on one host (whatever their shards) would
# share its cores and time each other's load, so they hold one lock per host and workspace.
TIMING_STAGES = ("measure", "collect")


def stage_lock(root: Path, stage: str, shard_index: int = 0, shard_count: int = 1,
               wait_s: float | None = 0.0) -> contextlib.AbstractContextManager:
    """The lock of one stage and shard of the workspace at `root`: two runs of it at once
    would do the same work twice (every kernel built and timed twice, on a shared machine).
    A timing stage's lock is the host's, whatever the shard (TIMING_STAGES)."""
    shard = "" if shard_count <= 1 else f" (shard {shard_index} of {shard_count})"
    if stage in TIMING_STAGES:
        name = f"{stage}@{socket.gethostname()}"
        what = f"stage={stage} on workspace {Path(root).name} on this host"
        advice = ("Two timing runs on one host, of any shards, time each other's load. Wait for it to end "
                  "(lock.wait_s=<seconds> waits), or stop it; a run that was killed holds no lock.")
    else:
        name = stage if shard_count <= 1 else f"{stage}.shard-{shard_index}-of-{shard_count}"
        what = f"stage={stage}{shard} on workspace {Path(root).name}"
        advice = ("Two runs at once would do the same work twice. Wait for it to end (lock.wait_s=<seconds> "
                  "waits), or stop it; a run that was killed holds no lock.")
    return exclusive(Path(root) / ".locks" / f"{name}.lock", what=what, wait_s=wait_s, advice=advice)


def file_lock(path: Path) -> contextlib.AbstractContextManager:
    """Wait for, then hold, the right to rewrite `path` (short read-modify-write sections)."""
    path = Path(path)
    return exclusive(path.parent / ".locks" / f"{path.name}.lock", what=f"a writer of {path}", wait_s=None)
