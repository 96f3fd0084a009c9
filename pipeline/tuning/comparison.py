"""The comparison: every item (a TIR task or a network) tuned with every cost-model kind and
seed, on one shared builder (`PersistentBuilder`, pipeline/compute/builder.py) and runner.

What is tuned is a `TirTask` (tune_tir) or a `Network`: some of its tasks (the heaviest)
tuned jointly as the network calls them (MetaSchedule's task scheduler, weights = calls),
then the whole network compiled with the tuning database and timed end to end. `compare`
returns the trial, run and end-to-end tables (pipeline/tuning/report.py turns them into the
report). Each finished run is kept in its work folder (`result.json`): a comparison cut
short (hours of tuning) is run again with the same command and only its missing runs are
tuned. On a cluster the runs go out as jobs (pipeline/tuning/remote.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from tvm.s_tir import meta_schedule as ms

from pipeline.compute.builder import PersistentBuilder
from pipeline.compute.progress import progress
from pipeline.core.database import DATABASE_FILES, read_record_lines, write_gzipped
from pipeline.core.database import unpack_database as unpack_database_files
from pipeline.core.workspace import atomic_write_bytes
from pipeline.device.harness import cpu_model, cpu_signature
from pipeline.tuning import kinds as tuning_kinds
from pipeline.tuning.runs import (INTERRUPTED, StrategyConfig, network_latency, network_timer, stop_on_interrupt,
                                  tune_network_tasks, tune_task, warm_up)

log = logging.getLogger(__name__)


def run_folder(name: str, kind: str, seed: int) -> str:
    """A run's work folder under the comparison's (`Setup.work`)."""
    return f"{name}/{kind}-s{seed}"


@dataclass
class Setup:
    """What every tuning run of a comparison shares."""

    target: object  # tvm.target.Target
    trials: int  # per task
    per_iter: int
    strategy: StrategyConfig
    builder: object
    runner: object
    threads: int
    work: Path  # MetaSchedule work dirs go to <work>/<name>/<cost model>-s<seed>
    evaluator: dict = field(default_factory=dict)  # number, repeat, min_repeat_ms of the runner (end to end)
    scheduler: str = "gradient"  # a network's task scheduler
    # a kind's folder name where it is not the kind (the pipeline's model: kind and model, so
    # that the runs of MetaSchedule's own models are reused whichever model `ours` is)
    labels: dict = field(default_factory=dict)
    # a second home for each finished run's result.json (<results>/<run folder>/result.json)
    # and its database (keep_database), which a repository can keep: a run found there is not
    # tuned again
    results: Path | None = None

    def folder(self, name: str, kind: str, seed: int) -> str:
        return run_folder(name, self.labels.get(kind, kind), seed)


def setup_spec(tune, target, threads: int) -> dict:
    """The settings of a comparison's builder, runner and search, as plain data (`tune`: the
    `tune` config), from which this machine or a cluster node makes its `Setup`; `threads`
    0 = the cores of the machine that tunes."""
    r = tune.runner
    return {"target": target, "trials": int(tune.trials), "per_iter": int(tune.per_iter),
            "strategy": {k: (dict(v) if hasattr(v, "keys") else v) for k, v in tune.strategy.items()},
            "builder_timeout_s": float(tune.builder_timeout_s), "threads": int(threads),
            "scheduler": str(tune.task_scheduler),
            "runner": {"number": int(r.number), "repeat": int(r.repeat), "min_repeat_ms": int(r.min_repeat_ms),
                       "timeout_s": float(r.timeout_s), "cpu_cache_flush": bool(r.cpu_cache_flush)}}


def make_setup(spec: dict, work: Path) -> Setup:
    """This machine's builder (its cores) and runner for the settings of `setup_spec`."""
    threads = int(spec["threads"]) or os.cpu_count() or 1
    r = spec["runner"]
    evaluator = {"number": r["number"], "repeat": r["repeat"], "min_repeat_ms": r["min_repeat_ms"]}
    builder = PersistentBuilder(max_workers=threads, timeout_sec=float(spec["builder_timeout_s"]))
    runner = ms.runner.LocalRunner(timeout_sec=float(r["timeout_s"]), evaluator_config=ms.runner.EvaluatorConfig(
        **evaluator, enable_cpu_cache_flush=bool(r["cpu_cache_flush"])))
    return Setup(spec["target"], int(spec["trials"]), int(spec["per_iter"]), StrategyConfig(**spec["strategy"]),
                 builder, runner, threads, Path(work), evaluator, str(spec["scheduler"]))


def warm_up_for(setup: "Setup", tasks: list) -> None:
    """`warm_up` with the lightest of `tasks` (an unknown FLOP count counts as heaviest), logged."""
    lightest = min(tasks, key=lambda x: x.flops if x.flops == x.flops else float("inf"))  # NaN: unknown
    log.info("warm-up (imports, build and run workers): %.1f s",
             warm_up(setup.builder, setup.runner, lightest.mod, setup.target))


def cost_models(*, ours, threads: int, xgb_warmup: int) -> Callable[[str, int], object]:
    """`make_cost_model(kind, seed)` for `compare`: a fresh model of each kind per run."""
    def make(kind: str, seed: int):
        return tuning_kinds.create(kind, seed=seed, threads=threads, ours=ours, xgb_warmup=xgb_warmup)
    return make


#: a network run's end-to-end row counts the network's functions its records replaced when it
#: compiled (runs.compile_with_database); a row kept without the count was compiled by a path
#: that applied no record, so its latency is the untuned network's (`read_result`)
RECORDS_APPLIED = "records_applied"


def read_result(path: Path) -> dict:
    """A finished run's RESULT_FILE as every reader takes it: an end-to-end row kept before the
    network compiled with the run's records (no RECORDS_APPLIED) timed the untuned network, so
    its latency moves to `e2e_unapplied_ms` and reads as missing; `tune.retime.enabled=true`
    times it again with its records."""
    done = json.loads(Path(path).read_text())
    e2e = done.get("end_to_end")
    if e2e and RECORDS_APPLIED not in e2e and "e2e_latency_ms" in e2e:
        done["end_to_end"] = {**e2e, "e2e_latency_ms": float("nan"), "e2e_unapplied_ms": e2e["e2e_latency_ms"]}
    return done


@dataclass
class RunResult:
    trials: list[dict]  # Trial rows, `task` naming the tuned task
    wall_s: float
    end_to_end: dict | None = None  # a network's e2e_latency_ms, tuning_min, trials


@dataclass
class TirTask:
    """One TIR task, tuned on its own (tune_tir)."""

    name: str
    mod: object  # tvm.IRModule with a `main` PrimFunc
    flops: float = float("nan")
    weight: int = 1

    @property
    def tasks(self) -> list["TirTask"]:
        return [self]

    def tune(self, cost_model, seed: int, setup: Setup, work_dir: str) -> RunResult:
        got, wall, _ = tune_task(self.mod, setup.target, work_dir, cost_model=cost_model, trials=setup.trials,
                                 per_iter=setup.per_iter, seed=seed, strategy=setup.strategy, builder=setup.builder,
                                 runner=setup.runner, num_threads=setup.threads)
        return RunResult([{**asdict(t), "task": self.name} for t in got], wall)


@dataclass
class Network:
    """A Relax network (weights bound): `tasks` (some of its extracted tasks, `extracted` in the
    same order) are tuned jointly as the network calls them, then the whole network is
    compiled with the tuning database and timed on its example inputs."""

    name: str
    mod: object  # tvm.IRModule (Relax)
    inputs: list  # numpy arrays
    tasks: list[TirTask]  # the tuned tasks (name, flops, weight = calls; mod = the first dispatched)
    extracted: list = field(default_factory=list)  # their ms.ExtractedTask
    n_tasks: int = 0  # tasks of the whole network

    def tune(self, cost_model, seed: int, setup: Setup, work_dir: str) -> RunResult:
        got, wall, db = tune_network_tasks(self.extracted, setup.target, work_dir, cost_model=cost_model,
                                           trials_per_task=setup.trials, per_iter=setup.per_iter, seed=seed,
                                           strategy=setup.strategy, builder=setup.builder, runner=setup.runner,
                                           num_threads=setup.threads, scheduler=setup.scheduler)
        t0 = time.perf_counter()
        timer = network_timer(db, self.mod, setup.target, self.inputs, **setup.evaluator)
        latency = timer()
        e2e_s = time.perf_counter() - t0
        # the untuned network timed beside it: the machine's reference, so that runs kept from
        # another machine (or a slower day of a shared one) are seen as such (report.machine_note)
        return RunResult([asdict(t) for t in got], wall,
                         {"e2e_latency_ms": latency * 1e3, "tuning_min": wall / 60.0, "trials": len(got),
                          "tuned_tasks": len(self.tasks), "e2e_s": e2e_s, RECORDS_APPLIED: len(timer.replaced),
                          "untuned_ms": self.untuned_latency(setup) * 1e3})

    def untuned_latency(self, setup: Setup) -> float:
        """Seconds of one call of the network without any tuning record (default schedules)."""
        return network_latency(ms.database.MemoryDatabase(), self.mod, setup.target, self.inputs, **setup.evaluator)

    def untuned(self, setup: Setup) -> dict:
        """The end-to-end row of the network without any tuning record."""
        return {"network": self.name, "cost_model": "untuned", "seed": -1,
                "e2e_latency_ms": self.untuned_latency(setup) * 1e3, "tuning_min": 0.0, "trials": 0, "tuned_tasks": 0}


@dataclass
class Comparison:
    trials: pd.DataFrame  # one row per trial: Trial's columns, cost_model, seed
    runs: pd.DataFrame  # one row per tuning run: task (or network), cost_model, seed, wall_s, refits, error
    end_to_end: pd.DataFrame  # networks: network, cost_model, seed, e2e_latency_ms, tuning_min, trials, ...
    reused: int = 0  # runs taken from an earlier, interrupted invocation


def _save_run(path: Path, run: dict) -> None:
    atomic_write_bytes(path, json.dumps(run, default=lambda o: o.item() if hasattr(o, "item") else str(o)).encode())


#: a run's MetaSchedule database (its work folder's JSONDatabase, DATABASE_FILES) is kept
#: gzipped beside its result.json in the results folder: the schedules a run measured outlive
#: the machine, as training data for later models (about 50 KB for 640 records)
RESULT_FILE = "result.json"  # a finished run: its row, trials and end-to-end latency


def keep_database(work: Path, results: Path) -> None:
    """The database files of the run in `work`, gzipped into `results`."""
    for name in DATABASE_FILES:
        if (work / name).exists():
            write_gzipped(results / f"{name}.gz", (work / name).read_bytes())


def unpack_database(results: Path, folder: Path) -> list[Path]:
    """The database files (DATABASE_FILES) of a run kept by `keep_database`, unpacked into `folder`."""
    for name in DATABASE_FILES:
        packed = results / f"{name}.gz"
        if not packed.exists():
            raise FileNotFoundError(f"{packed}: no kept database for this run (runs kept before databases were "
                                    f"kept have their result.json only)")
    return unpack_database_files(results, folder)


def open_database(results: Path, scratch: Path):
    """The MetaSchedule JSONDatabase of a run kept by `keep_database`, unpacked into `scratch`."""
    workloads, records = unpack_database(results, scratch)
    return ms.database.JSONDatabase(str(workloads), str(records))


def kept_records(results: Path) -> tuple[list, list]:
    """The workload lines and the record lines (in the order the run measured them: the
    JSONDatabase sorts its records by run time) of a run kept by `keep_database`; a damaged
    record line is refused with its file and line."""
    with tempfile.TemporaryDirectory(prefix="kept-run-") as tmp:
        workloads, path = unpack_database(results, Path(tmp))
        lines = [json.loads(x) for x in workloads.read_text().splitlines() if x.strip()]
        records, bad = read_record_lines([path])
    if bad:
        raise ValueError(f"{results}: its kept database has {len(bad)} unreadable records, e.g. {bad[0]}")
    return lines, records


def _error_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]


def tune_one(item, kind: str, seed: int, make_cost_model: Callable[[str, int], object], setup: Setup,
             work_dir: Path) -> dict:
    """One tuning run of `item` with a fresh cost model of `kind`: {"row", "trials",
    "end_to_end"}; a failure is the row's `error` (with no trials), never an exception."""
    row = {"task": item.name, "cost_model": kind, "seed": seed, "wall_s": float("nan"), "refits": None,
           "error": None, "host": socket.gethostname(), "cpu_model": cpu_model(), "cpu_signature": cpu_signature()}
    run_trials, net = [], None
    log.info("tune %s with %s (seed %d): %d trials per task", item.name, kind, seed, setup.trials)
    try:
        np.random.seed(seed)  # XGBModel's warm-up predictions draw from numpy's global generator
        cost_model = make_cost_model(kind, seed)
        result = item.tune(cost_model, seed, setup, str(work_dir))
        row["wall_s"] = result.wall_s
        row["refits"] = getattr(cost_model, "n_refits", None)  # online refits (PipelineCostModel keeps a count)
        run_trials = [{**t, "cost_model": kind, "seed": seed} for t in result.trials]
        if result.end_to_end is not None:
            net = {"network": item.name, "cost_model": kind, "seed": seed, **result.end_to_end}
    except Exception as e:  # noqa: BLE001 - one failing cost model is a row, not a crash
        if INTERRUPTED.is_set():  # a Ctrl-C that MetaSchedule turned into an error: not the run's result
            raise KeyboardInterrupt from e
        row["error"] = _error_text(e)
        log.error("tune %s with %s failed: %s", item.name, kind, row["error"], exc_info=True)
    if INTERRUPTED.is_set():  # its labels may come from runner workers the Ctrl-C killed: never kept
        raise KeyboardInterrupt
    return {"row": row, "trials": run_trials, "end_to_end": net}


def pending(items: list, kinds: list[str], seeds: list[int], setup: Setup, reuse: bool) -> tuple[list, list[dict]]:
    """(the runs to tune as (item, seed, kind), the finished runs found in their work folder or
    in `setup.results`). A run to tune starts from an empty folder: a run cut short leaves a
    partial database that would seed its search."""
    todo, earlier = [], []
    for item, seed, kind in [(item, seed, kind) for item in items for seed in seeds for kind in kinds]:
        work_dir = setup.work / setup.folder(item.name, kind, seed)
        saved = work_dir / RESULT_FILE
        kept = setup.results / setup.folder(item.name, kind, seed) / RESULT_FILE if setup.results else None
        if reuse and not saved.is_file() and kept is not None and kept.is_file():
            saved = kept
        if reuse and saved.is_file():
            log.info("tune %s with %s (seed %d): finished earlier in %s, reused", item.name, kind, seed, work_dir)
            earlier.append(read_result(saved))
            continue
        shutil.rmtree(work_dir, ignore_errors=True)
        todo.append((item, seed, kind))
    return todo, earlier


def compare(items: list, kinds: list[str], seeds: list[int], make_cost_model: Callable[[str, int], object],
            setup: Setup, *, reuse: bool = True,
            before_first: Callable[[], None] | None = None, remote=None,
            on_finished: Callable[[dict], None] | None = None) -> Comparison:
    """Tune every item (TirTask or Network) with every cost model kind and seed, and time each
    network untuned (its `untuned` row in `end_to_end`, when a run of it was timed).

    A failing run is a row with its error (and is tuned again by the next invocation). A run
    whose `result.json` is in its work folder under `setup.work` (finished by an earlier
    invocation with the same settings) is reused when `reuse`; a run
    without one starts from an empty folder (a run cut short leaves a partial database that
    would seed its search). `before_first()` runs once, before the first run that tunes here
    (none when every run is reused, or on a cluster). `remote`: the runs go to a cluster
    (a `Remote` of pipeline/tuning/remote.py, which imports this module), `make_cost_model`
    and `setup`'s builder and runner are not used.
    `on_finished(done)` is called with each run that finishes without error, once it is saved."""
    got = _Collected(setup, on_finished)
    todo, earlier = pending(items, kinds, seeds, setup, reuse)
    for done in earlier:
        got.add(done)
    networks = [item for item in items if isinstance(item, Network)]
    if remote is not None:
        untuned_rows = _run_remote(remote, todo, networks, setup, got)
    else:
        untuned_rows = _run_here(todo, networks, make_cost_model, setup, got, before_first)
    e2e = got.e2e
    if e2e:
        e2e += [row for row in untuned_rows if row["network"] in {r["network"] for r in e2e}]
    return Comparison(pd.DataFrame(got.trials), pd.DataFrame(got.runs), pd.DataFrame(e2e), len(earlier))


@dataclass
class _Collected:
    """The rows of a comparison as its runs come back; a finished run is saved as it comes."""
    setup: Setup
    on_finished: Callable[[dict], None] | None
    trials: list = field(default_factory=list)
    runs: list = field(default_factory=list)
    e2e: list = field(default_factory=list)

    def add(self, done: dict) -> None:
        self.runs.append(done["row"])
        if done["row"]["error"] is None:
            self.trials.extend(done["trials"])
            if done["end_to_end"] is not None:
                self.e2e.append(done["end_to_end"])

    def keep(self, done: dict) -> None:
        """A run that finished now: its rows, saved under the work (and results) folder."""
        self.add(done)
        row = done["row"]
        if row["error"] is None:
            folder = self.setup.folder(row["task"], row["cost_model"], row["seed"])
            _save_run(self.setup.work / folder / RESULT_FILE, done)
            if self.setup.results is not None:
                keep_database(self.setup.work / folder, self.setup.results / folder)
                _save_run(self.setup.results / folder / RESULT_FILE, done)
            if self.on_finished is not None:
                self.on_finished(done)


def _run_remote(remote, todo: list, networks: list, setup: Setup, got: _Collected) -> list[dict]:
    """The runs and the untuned timings on a cluster; returns the untuned rows."""
    untuned_rows = []
    with progress(total=len(todo) + len(networks), desc="tune", unit="run") as bar:
        for done in remote.run(todo, networks, setup):
            bar.update(1)
            if "untuned" not in done:
                got.keep(done)
            elif done["untuned"] is not None:
                untuned_rows.append(done["untuned"])
            else:
                log.error("timing %s untuned failed: %s", done["network"], done["error"])
    return untuned_rows


def _run_here(todo: list, networks: list, make_cost_model: Callable[[str, int], object], setup: Setup,
              got: _Collected, before_first: Callable[[], None] | None) -> list[dict]:
    """The runs one after the other on this host, then each tuned network timed untuned; a
    Ctrl-C saves the finished runs, never the one in progress, and is raised again."""
    with stop_on_interrupt():
        for item, seed, kind in progress(todo, desc="tune", unit="run"):
            if before_first is not None:
                before_first()
                before_first = None
            got.keep(tune_one(item, kind, seed, make_cost_model, setup, setup.work / setup.folder(item.name, kind, seed)))
        timed = {row["network"] for row in got.e2e}
        untuned_rows = [item.untuned(setup) for item in networks if item.name in timed]
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
    return untuned_rows
