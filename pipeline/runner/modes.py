"""Run modes (`measure.mode`, `collect.mode`): where a stage's kernels run, one family for
both stages, chosen with `create(kind, settings, ws, executor)`.

`local` runs them on the executor's devices (this machine with `executor=local`, the
measuring nodes of a Ray cluster with `executor=ray`) under the kernel harness's
supervisor; `export` writes a bundle for a device host that has only Python; `import` reads
back the results that host wrote. Every mode serves both stages: `results(jobs)` gives
stage=measure the timer's `done` events of the jobs, `profile(cands, shard, profiler)`
gives stage=collect a profiler's rows of the shard's built kernels.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterator

import pandas as pd

from pipeline.device import harness
from pipeline.core.catalog import table
from pipeline.core.errors import PipelineError
from pipeline.compute.executor import Executor
from pipeline.compute.progress import progress
from pipeline.core.components import create_kind
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace
from pipeline.runner import bundle, wheels
from pipeline.runner.jobs import kernel_jobs
from pipeline.runner.measurements import measure

log = logging.getLogger(__name__)


@dataclass
class BundleSettings:
    """The `bundle` group: the Python and platform of a device host's wheels, their cache
    (None: ~/.cache/tcp-pipeline/wheels), the size of collect's parts, and ncu's chunk and
    per-kernel time limit on the host."""

    python: str = "3.12"
    platform: str = "manylinux2014_x86_64"
    part_mib: float = 64
    part_kernels: int = 128
    wheel_cache: str | None = None
    ncu_chunk: int = 16
    ncu_timeout_s: float = 300

@dataclass
class MeasureSettings:
    """The `measure` group as the modes read it (a stage makes it once from its config,
    pipeline/options.py): where kernels run (`device`: cpu | cuda, the harness's
    device kind), MetaSchedule's runner semantics for the timer, the harness's limits, and
    the shard (its events file and bundle are its own); the rows' device name, the kernels
    checked per task, where `import` reads results (`results`, named `results_option` in
    errors) and the `bundle` group."""

    device: str = "cpu"
    number: int = 1
    repeat: int = 3
    min_repeat_ms: int = 20
    rtol: float = 1e-3
    atol: float = 1e-3
    cache_flush: bool = True
    rounds: int = 1
    timeout_s: float = 30.0
    settle_s: float = 120.0  # wait at most this long for a quiet host before timing here
    settle_load: float = 0.5  # quiet: a 1-minute load average at most this x the CPU count
    batch_size: int = 64
    bundle_runtime: bool = True
    results: list[str] = field(default_factory=list)
    shard_index: int = 0
    shard_count: int = 1
    force: bool = False
    device_name: str = "cpu"
    check_per_task: int = 2
    results_option: str = "measure.results"
    bundle: BundleSettings = field(default_factory=BundleSettings)
    cuda_arch: str | None = None  # the CUDA target's arch: exported source is compiled for it on the host

    def timer_options(self) -> dict:
        """The timer instrument's options (MetaSchedule runner semantics)."""
        return dict(number=int(self.number), repeat=int(self.repeat), min_repeat_ms=int(self.min_repeat_ms),
                    rtol=float(self.rtol), atol=float(self.atol), cache_flush=int(bool(self.cache_flush)))

    def harness_options(self) -> dict:
        """The harness command line's timing options on a device host: the timer's, and the
        interleaved rounds."""
        return dict(self.timer_options(), rounds=int(self.rounds))


class Mode:
    """Where the kernels run: jobs (record_id, task_id, artifact, args, reference) -> batches of
    `done` events for stage=measure; a profiler's rows of the shard's kernels for stage=collect."""

    # False: nothing is measured now (the rows come later, by `import`).
    measures = True
    # True: the workspace's kernel libraries are read (to run them, or to ship them).
    reads_libraries = True

    def __init__(self, settings: MeasureSettings, ws: Workspace, executor: Executor):
        self.settings, self.ws, self.executor = settings, ws, executor
        self.root = ws.root

    def prepare(self) -> None:
        """Before measuring (pipeline/runner/measurements.py): what the mode checks or clears."""

    def results(self, jobs: list[dict]) -> Iterator[list[dict]]:
        raise NotImplementedError

    def summary(self) -> dict:
        return {}

    def profile(self, cands: pd.DataFrame, shard: Shard, profiler) -> dict:
        raise NotImplementedError


class Local(Mode):
    """The kernels run on the executor's devices, `batch_size` per job (one harness child
    process each, shipped with their libraries and references where the workspace is not).

    Here, the harness's events file outlives an interrupted run: the next run takes the
    results it already holds instead of timing those kernels again. It is emptied once the
    stage has written a batch's rows (and by force=true)."""

    def __init__(self, settings: MeasureSettings, ws: Workspace, executor: Executor):
        super().__init__(settings, ws, executor)
        s = settings
        self.device, self.options, self.timeout_s = s.device, s.timer_options(), float(s.timeout_s)
        self.batch_size, self.rounds = max(1, int(s.batch_size)), max(1, int(s.rounds))
        # one file per shard of one sharding: runs of other shardings never share it
        self.events = ("runner/results.jsonl" if s.shard_count <= 1
                       else f"runner/results-{s.shard_index}-of-{s.shard_count}.jsonl")

    def prepare(self) -> None:
        """Measuring here: check for the device; force=true forgets the events of an earlier run."""
        if self.executor.runs_here:
            ensure_device(self.device)
            if self.settings.force:
                self.forget_events()

    def settle(self) -> None:
        """Before kernels are timed here: wait (at most `settle_s`) until the load average falls
        to `settle_load` x the CPU count, so that the first ones are not timed against what ran
        just before."""
        s, cpus = self.settings, os.cpu_count() or 1
        below, load = float(s.settle_load) * cpus, harness.load_average()
        if s.settle_s <= 0 or load is None or load <= below:
            return
        log.info("waiting for the 1-minute load average (%.2f) to fall to %.2f (measure.settle_load x %d CPUs) "
                 "before timing, at most %.0f s (measure.settle_s)", load, below, cpus, s.settle_s)
        load, waited = harness.settle(below, float(s.settle_s))
        if load is not None and load > below:
            log.warning("the load average is still %.2f after %.0f s: other processes share the cores, and the "
                        "kernels timed now carry them (`load_avg` column). Stop them, or raise measure.settle_s",
                        load, waited)
        else:
            log.info("the load average fell to %.2f after %.0f s", load, waited)

    def forget_events(self) -> None:
        """Delete the harness's events files (the written rows hold their results)."""
        for f in [self.events, *(harness.round_events(self.events, r) for r in range(self.rounds))]:
            (self.root / f).unlink(missing_ok=True)

    def batches(self, jobs: list[dict]) -> list[dict]:
        return harness.batch_jobs(jobs, self.batch_size, self.events, device=self.device, instrument="timer",
                                  options=self.options, timeout_s=self.timeout_s, rounds=self.rounds)

    def results(self, jobs):
        if jobs and self.executor.runs_here:
            self.settle()
        for done in self.executor.map(harness.supervise_job, self.batches(jobs), root=self.root,
                                      failed=harness.failed_job, device=True):
            yield [ev for events in done for ev in events]
            if self.executor.runs_here:  # resumed here: the stage has written the batch's rows
                self.forget_events()

    def profile(self, cands, shard, profiler):
        """The profiler over the shard's built kernels, one executor job per batch of it."""
        tables = profiler.tables()
        if not tables:
            return {}
        s, ws = self.settings, self.ws
        todo = ws.todo(tables[0], cands, shard=shard, force=s.force, device=s.device_name, clears=tables[1:])
        jobs, errors, waiting = profiler_jobs(ws, todo)
        size = max(1, int(profiler.batch_size))
        # One executor job per batch of the profiler; the records that cannot be profiled ride with the first.
        batches = [dict(profiler=profiler, jobs=jobs[i:i + size], errors=[],
                        reads=sorted({j["artifact"] for j in jobs[i:i + size]})) for i in range(0, len(jobs), size)]
        if errors and not batches:
            batches = [dict(profiler=profiler, jobs=[], errors=[], reads=[])]
        if batches:
            batches[0]["errors"] = errors
        counts: dict = {profiler.name: 0, f"{profiler.name}_errors": 0}  # also when nothing was left to do
        bar = progress(total=len(jobs) + len(errors), desc=f"collect {tables[0].name}", unit="kernel")
        try:
            with ws.sink(shard, s.device_name) as write:
                for results in self.executor.map(profile_job, batches, root=ws.root, failed=failed_profile,
                                                 device=True):
                    for res in results:
                        for t, rows, schema in res["writes"]:
                            write(t, rows, schema)
                        for k, v in res["counts"].items():
                            counts[k] = counts.get(k, 0) + v if isinstance(v, (int, float)) else v
                        bar.update(sum(len(rows) for t, rows, _ in res["writes"] if table(t).name == tables[0].name))
        finally:
            bar.close()
        if waiting:
            counts[f"{profiler.name}_not_built"] = waiting
            log.warning("%d records have no kernel (not built yet, or its library is lost): run stage=replay, "
                        "then stage=collect again", waiting)
        return counts


class Export(Mode):
    """A bundle of the jobs for a device host: measure's `bundle-<shard>.tar.gz`, collect's
    parts in `bundle-collect-<shard>/` (each times its kernels and runs the profiler on them
    where the profiler runs on the host, pipeline/runner/part.py)."""

    measures = False

    def __init__(self, settings: MeasureSettings, ws: Workspace, executor: Executor):
        super().__init__(settings, ws, executor)
        self.written: dict = {}

    def results(self, jobs):
        s = self.settings
        archive = bundle.export_bundle(self.root, jobs, self.root / f"bundle-{s.shard_index}", s.device,
                                       s.harness_options(), float(s.timeout_s), bool(s.bundle_runtime),
                                       cuda_arch=s.cuda_arch)
        log.info("wrote %s (%d kernels); run RUN.txt's command on the device host, then "
                 "`python -m pipeline stage=measure measure.mode=import measure.results=<results.jsonl>`",
                 archive, len(jobs))
        self.written = {"exported": len(jobs), "bundle": str(archive)}
        return iter(())

    def summary(self) -> dict:
        return self.written

    def part_spec(self, profiler) -> dict:
        """part.json of collect's bundle: where the kernels run, the timer's options and, for a
        profiler that runs on the host, its command."""
        s = self.settings
        spec = dict(device=s.device, python=s.bundle.python, ncu=None, cuda_arch=s.cuda_arch,
                    measure=dict(options=s.harness_options(), timeout_s=float(s.timeout_s)))
        if profiler.on_device_host:
            spec["ncu"] = dict(profiler.host_command(bundle.SECTIONS_ARG), timeout_s=float(s.bundle.ncu_timeout_s),
                               chunk=int(s.bundle.ncu_chunk))
        return spec

    def profile(self, cands, shard, profiler):
        """The shard's built kernels that have no profile yet, as bundle parts."""
        s, ws, tables = self.settings, self.ws, profiler.tables()
        todo = ws.todo(tables[0] if tables else "measurements", cands, shard=shard, force=False,
                       device=s.device_name if tables else None)
        kernels = ws.read("kernels", require=True).drop_duplicates("record_id", keep="last")
        kernels = kernels[kernels["record_id"].isin(set(todo["record_id"])) & kernels["error"].isna()]
        kernels = kernels[kernels["artifact"].map(lambda a: (ws.root / a).is_file())]
        jobs = kernel_jobs(ws, kernels, int(s.check_per_task))
        spec = self.part_spec(profiler)
        need = list(wheels.ALWAYS) + (list(wheels.NVTX) if spec["ncu"] else []) + (
            list(wheels.CUDA_RUNTIME) if spec["device"] == "cuda" else [])
        b = s.bundle
        found = wheels.fetch(need, b.python, b.platform, Path(b.wheel_cache) if b.wheel_cache else None)
        dest = ws.root / f"bundle-collect-{shard.index}"
        parts = bundle.export_parts(ws.root, jobs, dest, spec=spec, wheels=found, with_runtime=bool(s.bundle_runtime),
                                    part_mib=float(b.part_mib), part_kernels=int(b.part_kernels))
        log.info("wrote %d part(s) of %d kernels in %s; on the GPU host, per part: tar xzf part-<k>.tar.gz && cd "
                 "part-<k> && python3 run_part.py --pack ../results-part-<k>.tar.gz; back here: stage=collect "
                 "collect.mode=import collect.results=<results-part-*.tar.gz or their folder>", len(parts), len(jobs),
                 dest)
        return {"exported": len(jobs), "parts": len(parts), "bundle": str(dest),
                "part_mib": [round(p.stat().st_size / bundle.MIB, 1) for p in parts]}


class Import(Mode):
    """The results a device host wrote: the harness's results.jsonl (measure's bundle), or the
    results of collect's bundle parts (folders or `results-part-<k>.tar.gz`, their measure.jsonl
    and, for a profiler that ran there, its reports)."""

    reads_libraries = False

    def __init__(self, settings: MeasureSettings, ws: Workspace, executor: Executor):
        super().__init__(settings, ws, executor)
        if not settings.results:
            option = settings.results_option
            raise PipelineError(f"{option.split('.')[0]}.mode=import needs {option}=<{IMPORTS.get(option, 'results')}>")
        self.paths = [Path(str(p)) for p in settings.results]
        self.key = settings.results_option

    def events(self) -> list[dict]:
        """Every `done` event of the results."""
        out: list[dict] = []
        with tempfile.TemporaryDirectory(prefix="results-") as tmp:
            for p in self.paths:
                files = [p] if p.suffix == ".jsonl" else [d / "measure.jsonl" for d in
                                                          bundle.results_folders([p], Path(tmp))]
                for f in files:
                    try:
                        out += bundle.read_results(f)
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

    def profile(self, cands, shard, profiler):
        """The measurements of the bundle parts' results and, for a profiler that ran on the
        host, its rows from the reports they carry (read here)."""
        s, ws = self.settings, self.ws
        counts = {f"measure_{k}": v for k, v in measure(ws, shard, self).items()}
        if not profiler.on_device_host:
            return counts
        tables = profiler.tables()
        todo = ws.todo(tables[0], cands, shard=shard, force=s.force, device=s.device_name, clears=tables[1:])
        task_of = dict(zip(cands["record_id"], cands["task_id"]))
        wanted = {rid: task_of[rid] for rid in todo["record_id"]}
        counts.update({profiler.name: 0, f"{profiler.name}_errors": 0, f"{profiler.name}_not_run": 0})
        with tempfile.TemporaryDirectory(prefix="results-") as tmp, ws.sink(shard, s.device_name) as write:
            for folder in bundle.results_folders(self.paths, Path(tmp)):
                got = profiler.import_host(folder, wanted, write)
                if got is None:
                    status = folder / "status.json"
                    why = json.loads(status.read_text()).get("ncu") if status.exists() else None
                    log.warning("%s: %s did not run on the host (%s): no %s rows from it", folder, profiler.name,
                                why or "unknown", profiler.name)
                    counts[f"{profiler.name}_not_run"] += 1
                    continue
                ok, bad, settled = got
                counts[profiler.name] += ok
                counts[f"{profiler.name}_errors"] += bad
                wanted = {r: t for r, t in wanted.items() if r not in settled}
        return counts


# what import reads, per option that names it
IMPORTS = {"measure.results": "results.jsonl, or the results folder or results-part-<k>.tar.gz of a bundle part, "
                              "from the device host",
           "collect.results": "results-part-<k>.tar.gz files, their unpacked folders, or a folder holding them"}


def profiler_jobs(ws: Workspace, cands: pd.DataFrame) -> tuple[list[dict], list[dict], int]:
    """(kernels to profile, error rows for records that cannot be, records not built yet)."""
    kernels = ws.read("kernels", require=True).drop_duplicates("record_id", keep="last").set_index("record_id")
    meas = ws.read("measurements").drop_duplicates("record_id", keep="last").set_index("record_id")
    tasks = ws.read("tasks").set_index("task_id")
    jobs, errors, waiting = [], [], 0
    for c in cands.itertuples():
        if c.trace_json is None or (isinstance(c.trace_json, float) and pd.isna(c.trace_json)):
            errors.append(dict(record_id=c.record_id, task_id=c.task_id, error=f"candidate: {c.error or 'no trace'}"))
            continue
        if c.record_id not in kernels.index:
            waiting += 1
            continue
        k = kernels.loc[c.record_id]
        if pd.notna(k["error"]) or pd.isna(k["artifact"]):
            errors.append(dict(record_id=c.record_id, task_id=c.task_id, error=f"no kernel: {k['error']}"))
            continue
        if not (ws.root / k["artifact"]).is_file():  # lost since it was built: stage=replay builds it again
            waiting += 1
            continue
        if c.record_id in meas.index and pd.notna(meas.loc[c.record_id, "error"]):
            errors.append(dict(record_id=c.record_id, task_id=c.task_id,
                               error=f"not profiled: the measurement failed ({meas.loc[c.record_id, 'error']})"))
            continue
        jobs.append(dict(record_id=c.record_id, task_id=c.task_id, artifact=k["artifact"],
                         args=json.loads(tasks.loc[c.task_id, "args_json"])))
    return jobs, errors, waiting


def profile_job(job: dict, root: str) -> dict:
    """One batch of kernels under a profiler (the executor's per-item work): the rows it
    hands to `write`, in order, as (table, rows, schema), and its counts."""
    writes = []
    counts = job["profiler"].profile(job["jobs"], job["errors"], root=root,
                                     write=lambda t, rows, schema=None: writes.append((t, rows, schema)))
    return {"writes": writes, "counts": counts}


def failed_profile(job: dict, reason: str) -> dict:
    first = job["profiler"].tables()[0]
    rows = [dict(record_id=j["record_id"], task_id=j["task_id"], error=f"run: {reason}") for j in job["jobs"]]
    return {"writes": [(first, rows + job["errors"], None)], "counts": {"lost": len(rows)}}


#: kind -> `_target_` (pipeline/core/components.py)
MODES = {"local": "pipeline.runner.modes.Local", "export": "pipeline.runner.modes.Export",
         "import": "pipeline.runner.modes.Import"}


def create(kind: str, settings: MeasureSettings, ws: Workspace, executor: Executor, *,
           option: str = "measure.mode") -> Mode:
    """The run mode `kind` (named `option` in errors: measure.mode or collect.mode) with `settings`."""
    return create_kind(option, MODES, kind, settings, ws, executor)


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
