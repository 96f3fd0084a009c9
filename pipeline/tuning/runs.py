"""One MetaSchedule tuning run, as the comparison makes it: a TIR task tuned on its own
(`tune_task`, tune_tir) or a network's tasks tuned jointly (`tune_network_tasks`) and the
network timed end to end (`network_latency`), every trial kept by a measure callback
(`TrialRecorder`), and a Ctrl-C that ends a run after its batch (`stop_on_interrupt`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import tvm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from pipeline.shims.tvm_compat import preload_tensor_intrin

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


def compile_with_database(db, mod, target) -> tuple[object, list[str]]:
    """The fused network `mod` (the form `extract_tasks` split into tasks) built with every
    record of `db` applied, and the names of the functions a record replaced. MetaSchedule's
    `compile_relax` legalizes and fuses the module again before it applies the database; on
    a network already fused that makes other functions, and none of the tuned tasks' records
    is found. So the database is applied here to the functions that were tuned, and the
    module is only lowered after it. A database with records of which none applies is
    refused: the network built would be the untuned one."""
    with target, db, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase()(mod)
    replaced = sorted(gv.name_hint for gv, f in mod.functions.items()
                      if not isinstance(f, relax.Function) and not applied[gv].same_as(f))
    if len(db) and not replaced:
        raise RuntimeError(f"none of the {len(db)} tuning records applies to the network's functions: the database "
                           "was tuned on another form of the network (tasks from `extract_tasks` on the fused module)")
    with target, tvm.transform.PassContext(opt_level=3):  # tvm.compile's pipeline: lowers, fuses nothing
        ex = relax.build(applied, target=target, relax_pipeline=relax.pipeline.default_build_pipeline())
    return ex, replaced


@dataclass
class NetworkTimer:
    """A network compiled once with a tuning database: calling it times one end-to-end call
    again (mean seconds); `replaced` names the functions a tuning record replaced."""

    replaced: list[str]
    time_once: Callable[[], float]  # holds the VM (and its executable) as long as the timer lives

    def __call__(self) -> float:
        return self.time_once()


def network_timer(db, mod, target, inputs: list, *, number: int = 3, repeat: int = 1,
                  min_repeat_ms: int = 100) -> NetworkTimer:
    """The network compiled once with the tuning database (tasks without a record keep their
    default schedule) and called once, as a NetworkTimer with the runner's evaluator settings
    (number, repeat, min_repeat_ms)."""
    ex, replaced = compile_with_database(db, mod, target)
    dev = tvm.cpu() if target.kind.name == "llvm" else tvm.device(target.kind.name, 0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm["main"](*args)  # warm-up
    timer = vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
    return NetworkTimer(replaced, lambda vm=vm: float(timer(*args).mean))


def network_latency(db, mod, target, inputs: list, **evaluator) -> float:
    """Mean seconds of one end-to-end call of the network compiled with the tuning database,
    timed once (`network_timer`'s evaluator settings)."""
    return network_timer(db, mod, target, inputs, **evaluator)()


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
