"""One run at a time per stage and shard of a workspace, one writer at a time per file, and
stages that may overlap among themselves but not with another stage (train and compare).

A lock is `flock` on a file under `<workspace>/.locks/`: the kernel releases it when the
process that holds it ends, however it ends (SIGKILL included), so a killed run never
leaves a stale lock behind. The lock file names its holder (pid, host, start time,
command) for the message that a second run gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

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


def me() -> dict:
    """This process as a lock file names it."""
    return dict(pid=os.getpid(), host=socket.gethostname(), started=time.time(), command=" ".join(sys.argv))


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
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me()).encode(), 0)
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


@dataclass
class Joined:
    """How a run joined its group (`group`): the seconds it waited and every run it waited for."""
    waited_s: float = 0.0
    waited_for: list[dict] = field(default_factory=list)


def live_holders(folder: Path) -> list[dict]:
    """What the holder files in `folder` say of the processes that still hold them; the files
    of runs that ended without removing theirs (killed) are removed."""
    out = []
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue  # its run ended while we looked
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                out.append(holder(path))
                continue
            path.unlink(missing_ok=True)  # nobody holds it: its run was killed
        finally:
            os.close(fd)
    return out


@contextlib.contextmanager
def group(root: Path, mine: str, against: str, *, what: str, wait_s: float | None = 0.0,
          advice: str = "") -> Iterator[Joined]:
    """Hold a place among the runs of `mine` on the workspace at `root` for the `with` block:
    any number of them may run at once, never while a run of `against` holds a place. Runs of
    `against`: wait up to `wait_s` seconds (None: as long as it takes), then raise LockHeld
    naming them as `what` (e.g. "stage=train on workspace w").

    Each run holds `flock` on a file of its own in `.locks/<mine>.holders/`, naming it; a
    check of the other side and the joining are one step under `.locks/groups.lock`, so two
    runs of both sides that start at once cannot both go on."""
    locks = Path(root) / ".locks"
    mine_dir, their_dir = locks / f"{mine}.holders", locks / f"{against}.holders"
    t0 = time.monotonic()
    deadline = None if wait_s is None else t0 + max(0.0, float(wait_s))
    seen: list[dict] = []
    while True:
        with exclusive(locks / "groups.lock", what=f"a check of {locks}", wait_s=None):
            others = live_holders(their_dir)
            if not others:
                mine_dir.mkdir(parents=True, exist_ok=True)
                path = mine_dir / f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
                fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else holds it
                os.pwrite(fd, json.dumps(me()).encode(), 0)
                break
        if deadline is not None and time.monotonic() >= deadline:
            raise LockHeld(f"{what} is running: {'; '.join(map(describe, others))}. {advice}".strip())
        if not seen:
            log.warning("%s is running (%s): waiting for it to end", what, "; ".join(map(describe, others)))
        seen += [h for h in others if h not in seen]
        time.sleep(POLL_S)
    try:
        yield Joined(time.monotonic() - t0 if seen else 0.0, seen)
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


# Stages that may run alongside runs of their own kind (a sweep trains several models at once)
# but never alongside the other: stage=compare reading the MLflow runs while a train still adds
# some would mix a finished training session with parts of an unfinished one.
RUNS_GROUPS = {"train": "compare", "compare": "train"}
# Seconds a train waits for a compare that reads the runs (that takes seconds).
TRAIN_WAITS_S = 600.0


def runs_lock(root: Path, stage: str, wait_s: float | None = 0.0) -> contextlib.AbstractContextManager:
    """stage=train's or stage=compare's place on the workspace at `root` (RUNS_GROUPS): each
    waits `wait_s` seconds for runs of the other (a compare: lock.wait_s; a train: at least
    TRAIN_WAITS_S), then stops naming them."""
    against = RUNS_GROUPS[stage]
    if stage == "compare":
        advice = ("Its MLflow runs are not all logged yet, and a comparison now would mix them with those of "
                  "earlier trainings. Wait for it to end (lock.wait_s=<seconds> waits), or stop it; a run that "
                  "was killed holds no lock.")
    else:
        advice = (f"stage=train waited {wait_s or 0:.0f} s for it to read the training runs; stop it, or run "
                  f"stage=train again once it has ended.")
    return group(root, stage, against, what=f"stage={against} on workspace {Path(root).name}", wait_s=wait_s,
                 advice=advice)
