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

`local` (this module) runs cpu jobs on a pool of long-lived worker processes (TVM's
PopenPoolExecutor, as MetaSchedule's LocalBuilder; a job past `timeout_s` or whose worker
dies becomes the caller's error result) and device jobs one after another in this
process. `ray` (pipeline/core/ray_executor.py) runs both on a Ray cluster.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import psutil
from hydra.utils import instantiate

from pipeline.core.harness import die_with_parent
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
            timeout_s: float | None = None) -> Iterator[list]:
        """`fn(job, root)` for every job; `failed(job, reason)` is the result of a job that
        ran past `timeout_s`, whose process died or whose machine was lost."""
        raise NotImplementedError

    def describe(self, device: bool = False) -> str:
        return type(self).__name__

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalExecutor(Executor):
    """Process pools on this machine: `workers` processes for cpu jobs (0 = all cores);
    device jobs one at a time in this process."""

    def __init__(self, workers: int = 0, gpu: bool = False, recycle_after: int = RECYCLE_AFTER):
        self.workers = int(workers) or os.cpu_count() or 1
        self.recycle_after = int(recycle_after)
        self.pools: dict[float | None, Any] = {}
        # pool futures of the jobs in flight (map's caller stopped early when close finds some)
        self.running: dict[cf.Future, Job] = {}

    def describe(self, device: bool = False) -> str:
        return "this machine, one at a time" if device else f"{self.workers} local worker processes"

    def _pool(self, timeout_s: float | None):
        if timeout_s not in self.pools:
            # TVM takes seconds to import: loaded when there is work for a pool.
            from tvm.support.popen_pool import PopenPoolExecutor

            # Workers die with this process, however it ends (SIGKILL included).
            self.pools[timeout_s] = PopenPoolExecutor(max_workers=self.workers, timeout=timeout_s,
                                                      maximum_process_uses=self.recycle_after,
                                                      initializer=die_with_parent, initargs=(os.getpid(),))
        return self.pools[timeout_s]

    def map(self, fn, jobs, *, root, failed, device=False, timeout_s=None):
        if device:
            for job in jobs:
                yield [call_safely(fn, job, str(root), failed)]
            return
        pool, queue, running = self._pool(timeout_s), list(reversed(jobs)), self.running
        while queue or running:
            # At most one job per worker in flight: close() then stops promptly.
            while queue and len(running) < self.workers:
                job = queue.pop()
                running[pool.submit(fn, job, str(root))] = job
            finished, _ = cf.wait(list(running), timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
            out = []
            for fut in finished:
                job = running.pop(fut)
                ok, value = outcome(fut, timeout_s)
                out.append(value if ok else failed(job, value))
            yield out

    def close(self) -> None:
        if self.running:
            # Stopped with jobs in flight (Ctrl-C, an error of the caller). TVM's shutdown kills
            # each worker while the pool thread waiting on that worker kills it too once its
            # pipe closes (or once Ctrl-C has ended it): the two race, one raises, the pool's
            # lock stays held and the process hangs at exit. So the workers go first, each
            # thread reaps its own, and the shutdown finds them idle.
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if "tvm.exec.popen_worker" in child.cmdline():
                        child.kill()
            cf.wait(list(self.running), timeout=30)
            self.running.clear()
        for pool in self.pools.values():
            pool.shutdown()
        self.pools.clear()


def call_safely(fn: WorkFn, job: Job, root: str, failed: FailFn):
    try:
        return fn(job, root)
    except Exception as e:  # noqa: BLE001 - a job that raises is the caller's error result
        return failed(job, f"{type(e).__name__}: {str(e).strip()[-300:]}")


def outcome(fut: cf.Future, timeout_s: float | None) -> tuple[bool, Any]:
    """(True, result) of a pool job, or (False, why it has none)."""
    try:
        return True, fut.result()
    except TimeoutError:
        return False, f"timeout: not finished within {timeout_s:g} s"
    except ChildProcessError as e:
        return False, f"worker process crashed ({e})"
    except Exception as e:  # noqa: BLE001 - e.g. an exception raised by fn, or a job that could not be unpickled
        return False, f"{type(e).__name__}: {str(e).strip()[-300:]}"


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


_TIMED_POOLS: dict[float, Any] = {}


def timed_pool(timeout_s: float):
    """A one-worker pool of this process that runs a job with a time limit (kept for the
    process's next jobs, as a Ray worker runs many)."""
    if timeout_s not in _TIMED_POOLS:
        from tvm.support.popen_pool import PopenPoolExecutor  # seconds to import: only on a worker

        # The child dies with this process (a Ray worker killed with its node takes its build along).
        _TIMED_POOLS[timeout_s] = PopenPoolExecutor(max_workers=1, timeout=timeout_s,
                                                    maximum_process_uses=RECYCLE_AFTER,
                                                    initializer=die_with_parent, initargs=(os.getpid(),))
    return _TIMED_POOLS[timeout_s]


def run_shipped(fn: WorkFn, job: Job, files: dict[str, bytes], timeout_s: float | None) -> tuple:
    """One job on a machine without the workspace: its `reads` written into a fresh folder,
    `fn` run there (in a child process when it has a time limit, so that a build past the
    limit is killed and this process lives on), and its `writes` read back.

    Returns ("done", result, {path: bytes}) or ("failed", reason, {})."""
    with tempfile.TemporaryDirectory(prefix="pipeline-job-") as tmp:
        put_files(tmp, files)
        for rel in job.get("writes", ()):
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
        if timeout_s is None:
            try:
                result = fn(job, tmp)
            except Exception as e:  # noqa: BLE001 - reported as the job's failure
                return "failed", f"{type(e).__name__}: {str(e).strip()[-300:]}", {}
        else:
            ok, result = outcome(timed_pool(timeout_s).submit(fn, job, tmp), timeout_s)
            if not ok:
                return "failed", result, {}
        back = {rel: (Path(tmp) / rel).read_bytes() for rel in job.get("writes", ()) if (Path(tmp) / rel).is_file()}
        return "done", result, back


def create(cfg) -> Executor:
    """The executor of `cfg.executor` (`_target_`: its class; the other keys are its
    keyword arguments), told whether the target's device is a GPU."""
    return instantiate(cfg.executor, gpu=str(cfg.target.kind) == "cuda", _convert_="all")
