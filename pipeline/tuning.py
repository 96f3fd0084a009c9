"""Tuning with MetaSchedule: a trial recorder, the comparison loop.

What is tuned is a `TirTask` (tune_tir) or a `Network`: some of its tasks (the heaviest)
tuned jointly as the network calls them (MetaSchedule's task scheduler, weights = calls),
then the whole network compiled with the tuning database and timed end to end. `compare`
tunes each with every cost model and seed, on one shared builder (`PersistentBuilder`,
pipeline/core/builder.py) and runner, and returns the trial, run and end-to-end tables
(models/tuning_report.py turns them into the report). Each finished run is kept in its
work folder (`result.json`): a comparison cut short (hours of tuning) is run again with the
same command and only its missing runs are tuned.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import tvm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from pipeline.core.builder import PersistentBuilder  # noqa: F401 - stage=tune builds with it
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
    new_trials: pd.DataFrame = field(default_factory=pd.DataFrame)  # the trials tuned now (not reused)
    reused: int = 0  # runs taken from an earlier, interrupted invocation


def _save_run(path: Path, row: dict, trials: list[dict], end_to_end: dict | None) -> None:
    data = {"row": row, "trials": trials, "end_to_end": end_to_end}
    atomic_write_bytes(path, json.dumps(data, default=lambda o: o.item() if hasattr(o, "item") else str(o)).encode())


def _error_text(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]


def compare(items: list, kinds: list[str], seeds: list[int], make_cost_model: Callable[[str, int], object],
            setup: Setup, *, drop_on_failure: tuple[str, ...] = (), reuse: bool = True,
            before_first: Callable[[], None] | None = None) -> Comparison:
    """Tune every item (TirTask or Network) with every cost model kind and seed.

    A failing run is a row with its error; a kind in `drop_on_failure` is not run again after
    its first failure. A run whose `result.json` is in its work folder under `setup.work`
    (finished by an earlier invocation with the same settings) is reused when `reuse`; a run
    without one starts from an empty folder (a run cut short leaves a partial database that
    would seed its search). `before_first()` runs once, before the first run that tunes (none
    when every run is reused)."""
    trials, runs, e2e, dropped, new_trials, reused = [], [], [], {}, [], 0
    jobs = [(item, seed, kind) for item in items for seed in seeds for kind in kinds]
    for item, seed, kind in progress(jobs, desc="tune", unit="run"):
        if kind in dropped:
            continue
        work_dir = setup.work / item.name / f"{kind}-s{seed}"
        saved = work_dir / "result.json"
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
        if before_first is not None:
            before_first()
            before_first = None
        log.info("tune %s with %s (seed %d): %d trials per task", item.name, kind, seed, setup.trials)
        row = {"task": item.name, "cost_model": kind, "seed": seed, "wall_s": float("nan"), "refits": None,
               "error": None}
        try:
            np.random.seed(seed)  # XGBModel's warm-up predictions draw from numpy's global generator
            cost_model = make_cost_model(kind, seed)
            result = item.tune(cost_model, seed, setup, str(work_dir))
            row["wall_s"] = result.wall_s
            row["refits"] = getattr(cost_model, "n_refits", None)  # online refits (PipelineCostModel keeps a count)
            run_trials = [{**t, "cost_model": kind, "seed": seed} for t in result.trials]
            trials += run_trials
            new_trials += run_trials
            net = None
            if result.end_to_end is not None:
                net = {"network": item.name, "cost_model": kind, "seed": seed, **result.end_to_end}
                e2e.append(net)
            _save_run(saved, row, run_trials, net)
        except Exception as e:  # noqa: BLE001 - one failing cost model is a row, not a crash
            row["error"] = _error_text(e)
            log.error("tune %s with %s failed: %s", item.name, kind, row["error"], exc_info=True)
            if kind in drop_on_failure:
                dropped[kind] = row["error"]
                log.warning("cost model %s dropped for the rest of this run: %s", kind, row["error"])
        runs.append(row)
    return Comparison(pd.DataFrame(trials), pd.DataFrame(runs), pd.DataFrame(e2e), dropped, pd.DataFrame(new_trials),
                      reused)
