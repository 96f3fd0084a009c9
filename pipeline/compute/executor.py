"""Executors: where the per-item work of a stage runs (`executor=local` or `executor=ray`).

The per-item stages (sample, replay, measure, collect) describe their work as jobs (plain
dicts) and one plain module-level function `fn(job, root) -> result` that does one job,
reading and writing the workspace files the job names under the folder `root`. An
executor runs the jobs and yields their results as they finish; the stage (the driver)
writes them into the workspace exactly as before, so resume, keys and part files mean the
same under every executor.

Two kinds of work:
  cpu     any core will do: sampling, building, static features.
  device  the measuring device alone: timing and profiling, one job at a time per machine
          (a job is a batch of kernels under the kernel harness's supervisor).

A job's `reads` (paths relative to the workspace) are the files `fn` opens and its
`writes` the files it makes: an executor whose workers do not see the workspace ships the
first to them and brings the second back, and writes them before it hands over the
result, so a row never names a file that is not there.

`local` (this module) runs cpu jobs on long-lived worker processes forked from this one
(`ForkedWorker`: they start with what this process has imported, TVM included; a job past
`timeout_s` or whose worker dies becomes the caller's error result) and device jobs one
after another in this process. `ray` (pipeline/compute/ray_executor.py) runs both on a Ray
cluster, with the same workers forked from each Ray worker.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import cloudpickle

from pipeline.device.harness import die_with_parent
from pipeline.core import components
from pipeline.core.workspace import atomic_write_bytes

# Seconds between two looks at jobs in flight: map() yields (possibly nothing) at least
# this often, so that callers can flush their part files by time.
POLL_S = 1.0
# Jobs a pool worker process serves before it is replaced (the memory growth of long-lived
# TVM processes that makes MetaSchedule's LocalBuilder restart its pool every batch).
RECYCLE_AFTER = 1024

Job = dict
WorkFn = Callable[[Job, str], Any]
FailFn = Callable[[Job, str], Any]


class Executor:
    """Runs a stage's jobs; `map` yields lists of results (one per job, in finishing order)."""

    # True when the jobs run on this machine, on the workspace itself (nothing is shipped).
    runs_here = True

    def map(self, fn: WorkFn, jobs: Sequence[Job], *, root: Path | str, failed: FailFn, device: bool = False,
            timeout_s: float | None = None, shared: Job | None = None) -> Iterator[list]:
        """`fn(job, root)` for every job; `failed(job, reason)` is the result of a job that
        ran past `timeout_s`, whose process died or whose machine was lost. `shared`: entries
        every job has (`fn` sees `{**shared, **job}`), sent to other machines once, not once
        per job (a network's weights, a model)."""
        raise NotImplementedError

    def describe(self, device: bool = False) -> str:
        return type(self).__name__

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def job_error(e: BaseException) -> str:
    """A job's exception as its error result's reason: the type and the end of the message."""
    return f"{type(e).__name__}: {str(e).strip()[-300:]}"


def _serve_forked(conn, parent: int) -> None:
    """The forked child's loop: (fn, job, root) in, (ok, result or reason) out, until the pipe closes."""
    die_with_parent(parent)
    # Ctrl-C reaches the whole process group: the driver stops this child (close()), and a
    # KeyboardInterrupt here would only print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            fn, job, root = cloudpickle.loads(conn.recv_bytes())
        except EOFError:
            return
        try:
            conn.send((True, fn(job, root)))
        except Exception as e:  # noqa: BLE001 - sent back as the job's failure
            conn.send((False, job_error(e)))


_FORKING = threading.Lock()


class ForkedWorker:
    """Runs jobs one at a time in a child forked from this process: a child past a job's
    time limit is killed, one that dies is reported, and the next job forks a new one.

    Why fork: the process that hands out the jobs (the driver, or a Ray worker receiving
    one) has imported the job function's module, TVM with it, so a forked child starts at
    once with all of it loaded, where a fresh process (TVM's PopenPoolExecutor) imports TVM
    again: seconds per worker and per stage. Why one child for many jobs: what the first
    build loads lazily (TVM's passes, LLVM's targets) stays loaded for the next; it is
    replaced after `recycle_after` jobs (the memory growth of long-lived TVM processes)."""

    def __init__(self, recycle_after: int = RECYCLE_AFTER):
        self.recycle_after = int(recycle_after)
        self.child = None
        self.conn = None
        self.served = 0

    def kill(self) -> None:
        """Kill the child (from another thread too): the job it runs becomes a crash result."""
        child = self.child
        if child is not None and child.is_alive():
            child.kill()

    def stop(self) -> None:
        if self.child is not None:
            self.conn.close()
            if self.child.is_alive():
                self.child.kill()
            self.child.join()
        self.child = self.conn = None

    def run(self, fn: WorkFn, job: Job, root: str, timeout_s: float | None) -> tuple[bool, Any]:
        """(True, fn(job, root)), or (False, why there is no result)."""
        if self.child is None or not self.child.is_alive() or self.served >= self.recycle_after:
            self.stop()
            ctx = multiprocessing.get_context("fork")
            # One fork at a time: a child forked while another worker's end of its pipe is
            # open here would hold that end, and that worker's crash would never be seen.
            with _FORKING:
                self.conn, theirs = ctx.Pipe()
                for stream in (sys.stdout, sys.stderr):  # or the child's exit writes their buffers again
                    stream.flush()
                self.child = ctx.Process(target=_serve_forked, args=(theirs, os.getpid()), daemon=True)
                self.child.start()
                theirs.close()
            self.served = 0
        self.served += 1
        try:
            self.conn.send_bytes(cloudpickle.dumps((fn, job, root)))
            if not self.conn.poll(timeout_s):
                self.stop()
                return False, f"timeout: not finished within {timeout_s:g} s"
            return self.conn.recv()
        except (EOFError, OSError):
            self.child.join(5)
            code = self.child.exitcode
            self.stop()
            return False, f"worker process crashed (exit code {code})"


# The forked worker of this process (a Ray worker runs one job at a time).
FORKED = ForkedWorker()


class LocalExecutor(Executor):
    """`workers` processes on this machine for cpu jobs (0 = all cores), each forked from
    this process (`ForkedWorker`) and fed by a thread of its own; device jobs one at a time
    in this process."""

    def __init__(self, workers: int = 0, gpu: bool = False, recycle_after: int = RECYCLE_AFTER):
        self.workers = int(workers) or os.cpu_count() or 1
        self.recycle_after = int(recycle_after)
        self.threads: cf.ThreadPoolExecutor | None = None
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.forked: list[ForkedWorker] = []
        # futures of the jobs in flight (map's caller stopped early when close finds some)
        self.running: dict[cf.Future, Job] = {}

    def describe(self, device: bool = False) -> str:
        return "this machine, one at a time" if device else f"{self.workers} local worker processes"

    def _submit(self, fn: WorkFn, job: Job, root: str, timeout_s: float | None) -> cf.Future:
        if self.threads is None:
            self.threads = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="local-job")
            self.forked = [ForkedWorker(self.recycle_after) for _ in range(self.workers)]
            for worker in self.forked:
                self.idle.put(worker)
        return self.threads.submit(self._run, fn, job, root, timeout_s)

    def _run(self, fn: WorkFn, job: Job, root: str, timeout_s: float | None) -> tuple[bool, Any]:
        worker = self.idle.get()
        try:
            return worker.run(fn, job, root, timeout_s)
        except Exception as e:  # noqa: BLE001 - e.g. a job that cannot be pickled: its error result
            return False, job_error(e)
        finally:
            self.idle.put(worker)

    def map(self, fn, jobs, *, root, failed, device=False, timeout_s=None, shared=None):
        if shared:
            jobs = [{**shared, **job} for job in jobs]
        if device:
            for job in jobs:
                yield [call_safely(fn, job, str(root), failed)]
            return
        todo, running = list(reversed(jobs)), self.running
        while todo or running:
            # At most one job per worker in flight: close() then stops promptly.
            while todo and len(running) < self.workers:
                job = todo.pop()
                running[self._submit(fn, job, str(root), timeout_s)] = job
            finished, _ = cf.wait(list(running), timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
            out = []
            for fut in finished:
                job = running.pop(fut)
                ok, value = fut.result()
                out.append(value if ok else failed(job, value))
            yield out

    def close(self) -> None:
        if self.running:
            # Stopped with jobs in flight (Ctrl-C, an error of the caller): the children go, and
            # each thread returns the crash result of its job.
            for worker in self.forked:
                worker.kill()
            cf.wait(list(self.running), timeout=30)
            self.running.clear()
        if self.threads is not None:
            self.threads.shutdown()
            self.threads = None
        for worker in self.forked:
            worker.stop()
        self.forked = []
        self.idle = queue.SimpleQueue()


def call_safely(fn: WorkFn, job: Job, root: str, failed: FailFn):
    try:
        return fn(job, root)
    except Exception as e:  # noqa: BLE001 - a job that raises is the caller's error result
        return failed(job, job_error(e))


# ----------------------------------------------------------------------------- shipping jobs


def files_of(root: Path | str, paths: Sequence[str]) -> dict[str, bytes]:
    """The bytes of a job's `reads` under the workspace (a missing file is left for `fn` to report)."""
    out = {}
    for rel in paths:
        p = Path(root) / rel
        if p.is_file():
            out[rel] = p.read_bytes()
    return out


def put_files(root: Path | str, files: dict[str, bytes]) -> None:
    """Write files shipped back from a worker into the workspace, each atomically."""
    for rel, data in files.items():
        atomic_write_bytes(Path(root) / rel, data)


def run_shipped(fn: WorkFn, job: Job, files: dict[str, bytes], timeout_s: float | None,
                shared: Job | None = None) -> tuple:
    """One job on a machine without the workspace: its `reads` written into a fresh folder,
    `fn` run there (in a forked child when it has a time limit, so that a build past the
    limit is killed and this process lives on), and its `writes` read back. `shared`: the
    entries every job of the map has (see Executor.map).

    Returns ("done", result, {path: bytes}) or ("failed", reason, {})."""
    if shared:
        job = {**shared, **job}
    with tempfile.TemporaryDirectory(prefix="pipeline-job-") as tmp:
        put_files(tmp, files)
        for rel in job.get("writes", ()):
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
        if timeout_s is None:
            try:
                result = fn(job, tmp)
            except Exception as e:  # noqa: BLE001 - reported as the job's failure
                return "failed", job_error(e), {}
        else:
            ok, result = FORKED.run(fn, job, tmp, timeout_s)
            if not ok:
                return "failed", result, {}
        back = {rel: (Path(tmp) / rel).read_bytes() for rel in job.get("writes", ()) if (Path(tmp) / rel).is_file()}
        return "done", result, back


def create(config, *, gpu: bool = False) -> Executor:
    """The executor of the `executor` group's `config` (`_target_`: its class; the other keys
    are its keyword arguments), told whether the target's device is a GPU."""
    return components.create(config, gpu=bool(gpu))
