"""Tuning with MetaSchedule: a trial recorder, the comparison loop.

What is tuned is a `TirTask` (tune_tir) or a `Network`: some of its tasks (the heaviest)
tuned jointly as the network calls them (MetaSchedule's task scheduler, weights = calls),
then the whole network compiled with the tuning database and timed end to end. `compare`
tunes each with every cost model and seed, on one shared builder (`PersistentBuilder`,
pipeline/core/builder.py) and runner, and returns the trial, run and end-to-end tables
(models/tuning_report.py turns them into the report). Each finished run is kept in its
work folder (`result.json`): a comparison cut short (hours of tuning) is run again with the
same command and only its missing runs are tuned.

On a cluster (`Remote`, executor=ray) every run is one job that holds a machine's
`measure` slot (a GPU on CUDA targets): each machine builds with its own cores and times on
its own device, so N machines tune N runs at once. A node makes its builder and runner from
the comparison's settings (`setup_spec`), once per worker process (`tune_job`), and sends
back the run's row, trials and tuning database; the untuned network is timed there too, so
that every latency of a report comes from the same kind of machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import tvm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from models import tuning_models
from models.adapter import PipelineCostModel
from pipeline.core.builder import PersistentBuilder
from pipeline.core.progress import progress
from pipeline.core.tvm_compat import preload_tensor_intrin
from pipeline.core.workspace import atomic_write_bytes

log = logging.getLogger(__name__)


@dataclass
class Trial:
    task: str  # task name in the tuning run
    index: int  # 1-based trial number within the task
    batch: int  # 1-based batch (search iteration) number within the task
    latency_s: float | None  # mean of the runner's repeats; None when it failed
    error: str | None
    elapsed_s: float  # seconds since the recorder started


@derived_object
class TrialRecorder(PyMeasureCallback):
    """Measure callback that keeps every trial's latency, in order, per task."""

    def __init__(self):
        super().__init__()
        self.t0 = time.perf_counter()
        self.trials: list[Trial] = []
        self.batches: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        name = str(task_scheduler.tasks_[task_id].ctx.task_name)
        self.batches[name] = self.batches.get(name, 0) + 1
        now = time.perf_counter() - self.t0
        for b, r in zip(builder_results, runner_results):
            self.counts[name] = self.counts.get(name, 0) + 1
            err = b.error_msg or r.error_msg
            secs = [float(s) for s in (r.run_secs or [])]
            lat = sum(secs) / len(secs) if secs and not err else None
            self.trials.append(Trial(name, self.counts[name], self.batches[name], lat,
                                     (str(err).strip().splitlines() or [""])[-1][:300] if err else None, now))
        if INTERRUPTED.is_set():  # after the batch a Ctrl-C came in: stop this run (see stop_on_interrupt)
            raise TuneInterrupted("interrupted (Ctrl-C)")


@dataclass
class StrategyConfig:
    """EvolutionarySearch settings (MetaSchedule's defaults unless the config says otherwise)."""

    population_size: int = 512
    init_measured_ratio: float = 0.2
    init_min_unmeasured: int = 50
    genetic_num_iters: int = 4
    genetic_mutate_prob: float = 0.85
    genetic_max_fail_count: int = 10
    eps_greedy: float = 0.05
    extra: dict = field(default_factory=dict)

    def make(self):
        return ms.search_strategy.EvolutionarySearch(
            population_size=self.population_size, init_measured_ratio=self.init_measured_ratio,
            init_min_unmeasured=self.init_min_unmeasured, genetic_num_iters=self.genetic_num_iters,
            genetic_mutate_prob=self.genetic_mutate_prob, genetic_max_fail_count=self.genetic_max_fail_count,
            eps_greedy=self.eps_greedy)


def measure_callbacks(recorder: TrialRecorder) -> list:
    """MetaSchedule's default callbacks (database, artifact removal, cost-model update) + the recorder."""
    return [*ms.measure_callback.MeasureCallback.create("default"), recorder]


def warm_up(builder, runner, mod, target) -> float:
    """Pay the one-time costs before the timed runs, so the first cost model's tuning time is
    not charged with them: the tensor-intrinsic import in this process, the builder's workers
    (one build each of the unscheduled task) and the runner's worker (one run). Returns seconds."""
    t0 = time.perf_counter()
    preload_tensor_intrin()
    n = getattr(builder, "max_workers", 1)
    results = builder.build([ms.builder.BuilderInput(mod, target)] * n)
    ok = [r.artifact_path for r in results if r.artifact_path]
    if ok:
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        for f in runner.run([ms.runner.RunnerInput(ok[0], target.kind.name, args)]):
            f.result()
    return time.perf_counter() - t0


def warm_up_for(setup: "Setup", tasks: list) -> None:
    """`warm_up` with the lightest of `tasks` (an unknown FLOP count counts as heaviest), logged."""
    lightest = min(tasks, key=lambda x: x.flops if x.flops == x.flops else float("inf"))  # NaN: unknown
    log.info("warm-up (imports, build and run workers): %.1f s",
             warm_up(setup.builder, setup.runner, lightest.mod, setup.target))


def cost_models(*, ours, threads: int, xgb_warmup: int) -> Callable[[str, int], object]:
    """`make_cost_model(kind, seed)` for `compare`: a fresh model of each kind per run."""
    def make(kind: str, seed: int):
        return tuning_models.create(kind, seed=seed, threads=threads, ours=ours, xgb_warmup=xgb_warmup)
    return make


def run_folder(name: str, kind: str, seed: int) -> str:
    """A run's work folder under the comparison's (`Setup.work`)."""
    return f"{name}/{kind}-s{seed}"


def quiet_console() -> None:
    """MetaSchedule's console handler takes its logger's level at each tuning call (it resets
    that level to DEBUG afterwards): keep the console to warnings; its log files keep everything.

    Its logger config (create_loggers, run at each tuning call) re-declares every handler of
    its logger by name, so a handler attached there by anyone else (pytest's log capture
    attaches to every non-propagating logger) makes the call fail ("'NoneType' object has no
    attribute 'format'"): those are detached first."""
    ms_log = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(ms_log.handlers):
        if not (handler.get_name() or "").startswith(ms_log.name):
            ms_log.removeHandler(handler)
    ms_log.setLevel(logging.WARNING)
    logging.getLogger("mlp_model").setLevel(logging.WARNING)  # MLPModel logs every epoch at INFO


def tune_task(mod, target, work_dir: str, *, cost_model, trials: int, per_iter: int, seed: int,
              strategy: StrategyConfig, builder, runner, num_threads: int) -> tuple[list[Trial], float, object]:
    """One MetaSchedule tuning run of one TIR task: (trials in order, wall seconds, database)."""
    recorder = TrialRecorder()
    quiet_console()
    t0 = time.perf_counter()
    db = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=per_iter,
                     builder=builder, runner=runner, database="json", cost_model=cost_model,
                     measure_callbacks=measure_callbacks(recorder), strategy=strategy.make(),
                     num_tuning_cores=num_threads, seed=seed)
    return recorder.trials, time.perf_counter() - t0, db


SCHEDULERS = ("gradient", "round-robin")


def task_scheduler(kind: str, seed: int):
    """MetaSchedule's task scheduler of `kind` (tune_relax's default: gradient)."""
    if kind == "gradient":
        return ms.task_scheduler.GradientBased(seed=seed)
    if kind == "round-robin":
        return ms.task_scheduler.RoundRobin()
    raise ValueError(f"tune.task_scheduler={kind!r}; valid: {', '.join(SCHEDULERS)}")


def tune_network_tasks(extracted: list, target, work_dir: str, *, cost_model, trials_per_task: int, per_iter: int,
                       seed: int, strategy: StrategyConfig, builder, runner, num_threads: int,
                       scheduler: str = "gradient") -> tuple[list[Trial], float, object]:
    """One MetaSchedule tuning run of some extracted tasks of a network, jointly: the task
    scheduler shares the budget (trials_per_task x tasks, at most trials_per_task each) by the
    tasks' weights, and one cost model serves every task, as tune_relax does."""
    recorder = TrialRecorder()
    quiet_console()
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted, work_dir, strategy=strategy.make(), num_threads=num_threads, seed=seed)
    t0 = time.perf_counter()
    db = ms.tune_tasks(tasks=contexts, task_weights=weights, work_dir=work_dir,
                       max_trials_global=trials_per_task * len(contexts), max_trials_per_task=trials_per_task,
                       num_trials_per_iter=per_iter, builder=builder, runner=runner, database="json",
                       cost_model=cost_model, measure_callbacks=measure_callbacks(recorder),
                       task_scheduler=task_scheduler(scheduler, seed))
    return recorder.trials, time.perf_counter() - t0, db


def network_latency(db, mod, target, inputs: list, *, number: int = 3, repeat: int = 1,
                    min_repeat_ms: int = 100) -> float:
    """Mean seconds of one end-to-end call of the network compiled with the tuning database
    (tasks without a record keep their default schedule), timed with the runner's evaluator
    settings (number, repeat, min_repeat_ms)."""
    ex = ms.relax_integration.compile_relax(db, mod, target, None)
    dev = tvm.cpu() if target.kind.name == "llvm" else tvm.device(target.kind.name, 0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm["main"](*args)  # warm-up
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return float(timer(*args).mean)


# ----------------------------------------------------------------------------- the comparison


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
    # a second home for each finished run's result.json (<results>/<run folder>/result.json),
    # which a repository can keep: a run found there is not tuned again
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
        latency = network_latency(db, self.mod, setup.target, self.inputs, **setup.evaluator)
        return RunResult([asdict(t) for t in got], wall,
                         {"e2e_latency_ms": latency * 1e3, "tuning_min": wall / 60.0, "trials": len(got),
                          "tuned_tasks": len(self.tasks), "e2e_s": time.perf_counter() - t0})

    def untuned(self, setup: Setup) -> dict:
        """The end-to-end row of the network without any tuning record (default schedules)."""
        latency = network_latency(ms.database.MemoryDatabase(), self.mod, setup.target, self.inputs,
                                  **setup.evaluator)
        return {"network": self.name, "cost_model": "untuned", "seed": -1, "e2e_latency_ms": latency * 1e3,
                "tuning_min": 0.0, "trials": 0, "tuned_tasks": 0}


@dataclass
class Comparison:
    trials: pd.DataFrame  # one row per trial: Trial's columns, cost_model, seed
    runs: pd.DataFrame  # one row per tuning run: task (or network), cost_model, seed, wall_s, refits, error
    end_to_end: pd.DataFrame  # networks: network, cost_model, seed, e2e_latency_ms, tuning_min, trials, ...
    dropped: dict  # cost model -> the error that dropped it
    reused: int = 0  # runs taken from an earlier, interrupted invocation


# Set by a Ctrl-C (SIGINT) while runs are tuned here. A KeyboardInterrupt raised at any
# point inside MetaSchedule's C++ loop can abort the process (std::terminate) or be turned
# into a failed candidate by the runner workers the Ctrl-C killed; so a Ctrl-C only sets
# this flag, the measure callback ends the run after its batch (an ordinary error, which
# MetaSchedule passes up), and the run is then neither saved nor followed by another.
INTERRUPTED = threading.Event()


class TuneInterrupted(RuntimeError):
    """Raised by the measure callback to end a run after a Ctrl-C."""


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[None]:
    """Within the block, a first SIGINT sets INTERRUPTED (the comparison stops after the
    current batch, with KeyboardInterrupt); a second one does what SIGINT did before."""
    INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if not INTERRUPTED.is_set():
            INTERRUPTED.set()
            log.warning("Ctrl-C: stopping after the current batch (Ctrl-C again to stop at once)")
            return
        if callable(before):
            before(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _save_run(path: Path, run: dict) -> None:
    atomic_write_bytes(path, json.dumps(run, default=lambda o: o.item() if hasattr(o, "item") else str(o)).encode())


def _error_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]


def tune_one(item, kind: str, seed: int, make_cost_model: Callable[[str, int], object], setup: Setup,
             work_dir: Path) -> dict:
    """One tuning run of `item` with a fresh cost model of `kind`: {"row", "trials",
    "end_to_end"}; a failure is the row's `error` (with no trials), never an exception."""
    row = {"task": item.name, "cost_model": kind, "seed": seed, "wall_s": float("nan"), "refits": None,
           "error": None, "host": socket.gethostname()}
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


# ----------------------------------------------------------------------------- runs on a cluster

#: the files of a run's MetaSchedule work folder that come back from a cluster node (its JSON database)
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")
#: the job that times a network without tuning records
UNTUNED = "untuned"


@dataclass
class Remote:
    """How a comparison runs on a cluster: the executor (its `map` with `device=True` gives
    each run a machine of its own), the settings each node makes its Setup from
    (`setup_spec`), `ours` as `PipelineCostModel.to_bytes` with its training table where a
    run refits in the union mode, and XGBModel's warm-up."""

    executor: object
    spec: dict
    ours: bytes | None = None
    ours_table: object = None
    xgb_warmup: int = 100

    @classmethod
    def create(cls, executor, spec: dict, *, ours: PipelineCostModel | None, kinds: list[str],
               xgb_warmup: int) -> "Remote":
        """`ours` as bytes, with its training table only where a run will refit in the union
        mode (ours_update, or ours with updates on, unless the mode is `continue`)."""
        if ours is None:
            return cls(executor, spec, xgb_warmup=xgb_warmup)
        refits = "ours_update" in kinds or ours.update_enabled
        table = ours.training_table() if refits and ours.update_mode not in ("continue", "residual") else None
        return cls(executor, spec, ours.to_bytes(), table, xgb_warmup)


# Per worker process of a cluster node: the Setup (builder, runner) and `ours` of the
# comparison it serves, made at its first run and kept for the next ones.
_NODE: dict = {}


def release_node() -> None:
    """Close the builder that `tune_job` keeps in this process."""
    if _NODE.get("setup") is not None:
        _NODE["setup"].builder.close()
    _NODE.clear()


def tune_job(job: dict, root: str) -> dict:
    """One run of a comparison on a cluster node (see `Remote`): `tune_one` in `root`, or the
    untuned network's end-to-end row (kind UNTUNED)."""
    item = job["items"][job["item"]]
    if _NODE.get("key") != job["key"]:
        release_node()
        setup = make_setup(job["spec"], Path(root))
        ours = PipelineCostModel.from_bytes(job["ours"], train_table=job["ours_table"]) if job["ours"] else None
        warm_up_for(setup, item.tasks)
        _NODE.update(key=job["key"], setup=setup, ours=ours)
    setup = replace(_NODE["setup"], work=Path(root))
    if job["kind"] == UNTUNED:
        return {"untuned": item.untuned(setup)}
    make_cost_model = cost_models(ours=_NODE["ours"], threads=setup.threads, xgb_warmup=int(job["xgb_warmup"]))
    return tune_one(item, job["kind"], int(job["seed"]), make_cost_model, setup, Path(root) / job["folder"])


def _run_remote(remote: Remote, todo: list[tuple], untuned: list, setup: Setup) -> Iterator[dict]:
    """The runs of `todo` ((item, seed, kind)) and the untuned networks as jobs of
    `remote.executor`, a run's database written under `setup.work`; yields each run's result
    (a lost job is a row with its error) and, for an untuned network, {"untuned": row} (None
    with its `error` when that job was lost). The items go out once, with the rest that every
    job has; a job names its item."""
    key = f"{setup.work}-{time.time_ns()}"  # a new Setup on every node for each comparison
    shared = {"key": key, "items": {item.name: item for item, _, _ in todo} | {item.name: item for item in untuned},
              "spec": remote.spec, "ours": remote.ours, "ours_table": remote.ours_table,
              "xgb_warmup": remote.xgb_warmup}
    jobs = [{"item": item.name, "kind": kind, "seed": seed, "folder": setup.folder(item.name, kind, seed),
             "writes": [f"{setup.folder(item.name, kind, seed)}/{f}" for f in DATABASE_FILES]}
            for item, seed, kind in todo]
    jobs += [{"item": item.name, "kind": UNTUNED, "seed": -1} for item in untuned]

    def failed(job: dict, reason: str) -> dict:
        if job["kind"] == UNTUNED:
            return {"untuned": None, "error": reason[:500], "network": job["item"]}
        row = {"task": job["item"], "cost_model": job["kind"], "seed": job["seed"], "wall_s": float("nan"),
               "refits": None, "error": reason[:500], "host": None}
        return {"row": row, "trials": [], "end_to_end": None}

    log.info("tuning %d runs on %s", len(todo), remote.executor.describe(device=True))
    for results in remote.executor.map(tune_job, jobs, root=setup.work, failed=failed, device=True, shared=shared):
        yield from results


def compare(items: list, kinds: list[str], seeds: list[int], make_cost_model: Callable[[str, int], object],
            setup: Setup, *, drop_on_failure: tuple[str, ...] = (), reuse: bool = True,
            before_first: Callable[[], None] | None = None, remote: Remote | None = None,
            on_finished: Callable[[dict], None] | None = None) -> Comparison:
    """Tune every item (TirTask or Network) with every cost model kind and seed, and time each
    network untuned (its `untuned` row in `end_to_end`, when a run of it was timed).

    A failing run is a row with its error; a kind in `drop_on_failure` is not run again after
    its first failure (on a cluster, where runs go out at once, its other runs still come
    back as rows). A run whose `result.json` is in its work folder under `setup.work`
    (finished by an earlier invocation with the same settings) is reused when `reuse`; a run
    without one starts from an empty folder (a run cut short leaves a partial database that
    would seed its search). `before_first()` runs once, before the first run that tunes here
    (none when every run is reused, or on a cluster). `remote`: the runs go to a cluster
    (see `Remote`), `make_cost_model` and `setup`'s builder and runner are not used.
    `on_finished(done)` is called with each run that finishes without error, once it is saved."""
    trials, runs, e2e, dropped, reused = [], [], [], {}, 0
    todo = []
    for item, seed, kind in [(item, seed, kind) for item in items for seed in seeds for kind in kinds]:
        work_dir = setup.work / setup.folder(item.name, kind, seed)
        saved = work_dir / "result.json"
        kept = setup.results / setup.folder(item.name, kind, seed) / "result.json" if setup.results else None
        if reuse and not saved.is_file() and kept is not None and kept.is_file():
            saved = kept
        if reuse and saved.is_file():
            done = json.loads(saved.read_text())
            log.info("tune %s with %s (seed %d): finished earlier in %s, reused", item.name, kind, seed, work_dir)
            runs.append(done["row"])
            trials += done["trials"]
            if done["end_to_end"] is not None:
                e2e.append(done["end_to_end"])
            reused += 1
            continue
        shutil.rmtree(work_dir, ignore_errors=True)
        todo.append((item, seed, kind))

    def keep(done: dict) -> None:
        row = done["row"]
        runs.append(row)
        if row["error"] is None:
            trials.extend(done["trials"])
            if done["end_to_end"] is not None:
                e2e.append(done["end_to_end"])
            folder = setup.folder(row["task"], row["cost_model"], row["seed"])
            _save_run(setup.work / folder / "result.json", done)
            if setup.results is not None:
                _save_run(setup.results / folder / "result.json", done)
            if on_finished is not None:
                on_finished(done)
        elif row["cost_model"] in drop_on_failure and row["cost_model"] not in dropped:
            dropped[row["cost_model"]] = row["error"]
            log.warning("cost model %s dropped for the rest of this run: %s", row["cost_model"], row["error"])

    networks = [item for item in items if isinstance(item, Network)]
    untuned_rows = []
    if remote is not None:
        with progress(total=len(todo) + len(networks), desc="tune", unit="run") as bar:
            for done in _run_remote(remote, todo, networks, setup):
                bar.update(1)
                if "untuned" not in done:
                    keep(done)
                elif done["untuned"] is not None:
                    untuned_rows.append(done["untuned"])
                else:
                    log.error("timing %s untuned failed: %s", done["network"], done["error"])
    else:
        with stop_on_interrupt():  # Ctrl-C: the finished runs are saved, the one in progress is not
            for item, seed, kind in progress(todo, desc="tune", unit="run"):
                if kind in dropped:
                    continue
                if before_first is not None:
                    before_first()
                    before_first = None
                keep(tune_one(item, kind, seed, make_cost_model, setup, setup.work / setup.folder(item.name, kind, seed)))
            timed = {row["network"] for row in e2e}
            untuned_rows = [item.untuned(setup) for item in networks if item.name in timed]
            if INTERRUPTED.is_set():
                raise KeyboardInterrupt
    if e2e:
        e2e += [row for row in untuned_rows if row["network"] in {r["network"] for r in e2e}]
    return Comparison(pd.DataFrame(trials), pd.DataFrame(runs), pd.DataFrame(e2e), dropped, reused)
