"""Measure modes (`measure.mode`), chosen with `create(kind, settings, ws, executor)`.

`local` runs the kernels under the kernel harness's supervisor (timer instrument) on the
executor's devices: this machine (`executor=local`) or the measuring nodes of a Ray
cluster (`executor=ray`); `export` writes a bundle for a device host; `import` reads back
the results that host wrote. Each turns the measure stage's jobs into the harness's
`done` events.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterator

from pipeline.device import harness
from pipeline.core.errors import PipelineError
from pipeline.compute.executor import Executor
from pipeline.core.registry import choose
from pipeline.core.workspace import Workspace
from pipeline.runner.bundle import export_bundle, read_results, results_folders

log = logging.getLogger(__name__)


@dataclass
class MeasureSettings:
    """The `measure` group as the modes read it (a stage makes it once from its config,
    pipeline/stages/options.py): where kernels run (`device`: cpu | cuda, the harness's
    device kind), MetaSchedule's runner semantics for the timer, the harness's limits, and
    the shard (its events file and bundle are its own)."""

    device: str = "cpu"
    number: int = 1
    repeat: int = 3
    min_repeat_ms: int = 20
    rtol: float = 1e-3
    atol: float = 1e-3
    cache_flush: bool = True
    rounds: int = 1
    timeout_s: float = 30.0
    batch_size: int = 64
    bundle_runtime: bool = True
    results: list[str] = field(default_factory=list)
    shard_index: int = 0
    shard_count: int = 1
    force: bool = False

    def timer_options(self) -> dict:
        """The timer instrument's options (MetaSchedule runner semantics)."""
        return dict(number=int(self.number), repeat=int(self.repeat), min_repeat_ms=int(self.min_repeat_ms),
                    rtol=float(self.rtol), atol=float(self.atol), cache_flush=int(bool(self.cache_flush)))

    def harness_options(self) -> dict:
        """The harness command line's timing options on a device host: the timer's, and the
        interleaved rounds."""
        return dict(self.timer_options(), rounds=int(self.rounds))


class MeasureMode:
    """Jobs (record_id, task_id, artifact, args, reference) -> batches of `done` events."""

    # False: nothing is measured now (the rows come later, by `import`).
    measures = True
    # True: the workspace's kernel libraries are read (to run them, or to ship them).
    reads_libraries = True

    def results(self, jobs: list[dict]) -> Iterator[list[dict]]:
        raise NotImplementedError

    def summary(self) -> dict:
        return {}


class Local(MeasureMode):
    """The kernels run on the executor's devices, `batch_size` per job (one harness child
    process each, shipped with their libraries and references where the workspace is not).

    Here, the harness's events file outlives an interrupted run: the next run takes the
    results it already holds instead of timing those kernels again. It is emptied once the
    stage has written a batch's rows (and by force=true)."""

    def __init__(self, root: Path, device: str, options: dict, timeout_s: float, batch_size: int, events: str,
                 executor: Executor, rounds: int = 1):
        self.root, self.device, self.options = root, device, options
        self.timeout_s, self.batch_size, self.events = timeout_s, max(1, int(batch_size)), events
        self.executor, self.rounds = executor, max(1, int(rounds))

    @classmethod
    def from_settings(cls, s: MeasureSettings, ws: Workspace, executor: Executor) -> "Local":
        # one file per shard of one sharding: runs of other shardings never share it
        count = s.shard_count
        events = "runner/results.jsonl" if count <= 1 else f"runner/results-{s.shard_index}-of-{count}.jsonl"
        mode = cls(ws.root, s.device, s.timer_options(), float(s.timeout_s), int(s.batch_size), events, executor,
                   int(s.rounds))
        if executor.runs_here:
            ensure_device(s.device)
            if s.force:
                mode.forget_events()
        return mode

    def forget_events(self) -> None:
        """Delete the harness's events files (the written rows hold their results)."""
        for f in [self.events, *(harness.round_events(self.events, r) for r in range(self.rounds))]:
            (self.root / f).unlink(missing_ok=True)

    def batches(self, jobs: list[dict]) -> list[dict]:
        return harness.batch_jobs(jobs, self.batch_size, self.events, device=self.device, instrument="timer",
                                  options=self.options, timeout_s=self.timeout_s, rounds=self.rounds)

    def results(self, jobs):
        for done in self.executor.map(harness.supervise_job, self.batches(jobs), root=self.root,
                                      failed=harness.failed_job, device=True):
            yield [ev for events in done for ev in events]
            if self.executor.runs_here:  # resumed here: the stage has written the batch's rows
                self.forget_events()


class Export(MeasureMode):
    """A bundle of the jobs for a device host (`bundle-<shard>.tar.gz` in the workspace)."""

    measures = False

    def __init__(self, root: Path, dest: Path, device: str, options: dict, timeout_s: float, with_runtime: bool):
        self.root, self.dest, self.device, self.options = root, dest, device, options
        self.timeout_s, self.with_runtime = timeout_s, with_runtime
        self.written: dict = {}

    @classmethod
    def from_settings(cls, s: MeasureSettings, ws: Workspace, executor: Executor) -> "Export":
        return cls(ws.root, ws.root / f"bundle-{s.shard_index}", s.device, s.harness_options(), float(s.timeout_s),
                   bool(s.bundle_runtime))

    def results(self, jobs):
        archive = export_bundle(self.root, jobs, self.dest, self.device, self.options, self.timeout_s,
                                self.with_runtime)
        log.info("wrote %s (%d kernels); run RUN.txt's command on the device host, then "
                 "`python -m pipeline stage=measure measure.mode=import measure.results=<results.jsonl>`",
                 archive, len(jobs))
        self.written = {"exported": len(jobs), "bundle": str(archive)}
        return iter(())

    def summary(self) -> dict:
        return self.written


class Import(MeasureMode):
    """The results a device host wrote: the harness's results.jsonl (measure's bundle), or the
    results of collect's bundle parts (folders or `results-part-<k>.tar.gz`, their measure.jsonl)."""

    reads_libraries = False

    def __init__(self, results, key: str = "measure.results"):
        self.paths = [Path(str(p)) for p in (results if isinstance(results, (list, tuple)) else [results])]
        self.key = key

    @classmethod
    def from_settings(cls, s: MeasureSettings, ws: Workspace, executor: Executor) -> "Import":
        if not s.results:
            raise PipelineError("measure.mode=import needs measure.results=<results.jsonl, or the results folder or "
                                "results-part-<k>.tar.gz of a bundle part, from the device host>")
        return cls(list(s.results))

    def events(self) -> list[dict]:
        """Every `done` event of the results."""
        out: list[dict] = []
        with tempfile.TemporaryDirectory(prefix="results-") as tmp:
            for p in self.paths:
                files = [p] if p.suffix == ".jsonl" else [d / "measure.jsonl" for d in results_folders([p], Path(tmp))]
                for f in files:
                    try:
                        out += read_results(f)
                    except FileNotFoundError as e:
                        raise PipelineError(f"{self.key}={p}: no such file") from e
        return out

    def results(self, jobs):
        imported = self.events()
        wanted = {j["record_id"] for j in jobs}
        batch = list({r["record_id"]: r for r in imported if r["record_id"] in wanted}.values())
        if len(wanted) > len(batch):
            log.warning("%d kernel(s) have no result in %s; they stay unmeasured", len(wanted) - len(batch),
                        ", ".join(map(str, self.paths)))
        yield batch


MODES = {"local": Local, "export": Export, "import": Import}


def create(kind: str, settings: MeasureSettings, ws: Workspace, executor: Executor) -> MeasureMode:
    """The measure mode `kind` with `settings` (local on this machine checks for its device)."""
    return choose("measure.mode", MODES, kind).from_settings(settings, ws, executor)


def ensure_device(kind: str) -> None:
    import tvm  # seconds to import; only the local mode needs it

    dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    if not dev.exist:
        raise PipelineError(
            "stage=measure: this machine has no CUDA device. Kernels for CUDA targets build "
            "anywhere but run on a GPU host: `stage=measure measure.mode=export` writes a bundle "
            "(kernels, references, the harness, a runtime-only TVM) to run there, and "
            "`measure.mode=import` reads its results back; or run this stage on the GPU host itself."
        )
