"""stage=sample: distinct schedule candidates per task, as MetaSchedule tuning records.

Candidates are drawn from MetaSchedule's own design spaces (post-order-apply) by its
own search strategies, so the dataset covers the space MetaSchedule actually searches.
Each (task, strategy) is a job of the executor (`executor=local`: worker processes here;
`ray`: a Ray cluster) that returns its records serialized by MetaSchedule (in a scratch
database: a bad line in the record files never blocks sampling). The driver writes each
task's candidates to `candidates/` first, then appends them to the workspace's
MetaSchedule tuning records without run times; the stage ends by making the record files
agree with the tables (`database.sync_records`). A task that failed to sample (a bad
setting, a space that could not be generated, a draw past `sample.timeout_s`) is an error
row, tried again by the next run.
"""

from __future__ import annotations

import logging

import pandas as pd

from pipeline.core import database as D
from pipeline.core import release as R
from pipeline.compute.progress import progress
from pipeline.core.sharding import Shard
from pipeline.shims.targets import make_target
from pipeline.shims.tvm_compat import preload_tensor_intrin
from pipeline.tenset.candidates import add_records
from pipeline.options import executor_of, release_named, shard_of, target_of, tenset_copy, workspace_of

log = logging.getLogger(__name__)

STRATEGIES = ("replay-trace", "evolutionary")


def draw_candidates(mod, target, n: int, strategy: str, seed: int, num_threads: int) -> list:
    """Up to `n` schedules with distinct traces, drawn by a MetaSchedule search strategy."""
    from tvm.s_tir import meta_schedule as ms  # seconds to import: only when sampling

    preload_tensor_intrin()

    if strategy not in STRATEGIES:
        raise ValueError(f"sample strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")

    def context(search_strategy: str):
        return ms.TuneContext(
            mod=mod, target=target, space_generator="post-order-apply", search_strategy=search_strategy,
            task_name="sample", num_threads=num_threads, rand_state=seed,
        )

    ctx = context(strategy)
    spaces = ctx.generate_design_space()
    if strategy_for(spaces, strategy) != strategy:
        ctx = context("replay-trace")
    database = ms.database.MemoryDatabase()
    cost_model = ms.cost_model.RandomModel(seed=seed)
    per_iter = max(n, 8)
    ctx.search_strategy.pre_tuning(
        max_trials=4 * per_iter, num_trials_per_iter=per_iter, design_spaces=spaces,
        database=database, cost_model=cost_model,
    )
    seen, out = set(), []
    try:
        while len(out) < n:
            batch = ctx.search_strategy.generate_measure_candidates()
            if not batch:
                break
            for cand in batch:
                key = str(cand.sch.trace)
                if key not in seen and len(out) < n:
                    seen.add(key)
                    out.append(cand.sch)
            ctx.search_strategy.notify_runner_results(
                batch, [ms.runner.RunnerResult(run_secs=None, error_msg="not measured") for _ in batch]
            )
    finally:
        ctx.search_strategy.post_tuning()
    return out


def strategy_for(spaces: list, strategy: str) -> str:
    """The strategy that draws from `spaces`: replay where no space has a sampling decision.
    Such spaces are their own only schedules, so the evolutionary search has nothing to
    mutate, and on a large fused function it can spend many minutes failing to."""
    if strategy == "evolutionary" and not any(len(sch.trace.decisions) for sch in spaces):
        return "replay-trace"
    return strategy


def strategies_of(cfg) -> list[str]:
    """The search strategies that draw candidates (`sample.strategies`), validated."""
    names = [str(x) for x in cfg.sample.strategies]
    bad = [x for x in names if x not in STRATEGIES]
    if not names or bad:
        raise ValueError(f"sample.strategies={names}; each must be one of: {', '.join(STRATEGIES)}")
    return list(dict.fromkeys(names))


def draw_task(mod, target, n: int, strategy: str, seed: int) -> tuple[list, str | None]:
    """(schedules, error) of one task and strategy: the stage's per-item work."""
    try:
        # One thread: MetaSchedule hands candidates to its threads dynamically, each thread with
        # its own random state, so more threads draw other candidates from run to run. The
        # executor samples several tasks at once instead.
        schs = draw_candidates(mod, target, n, strategy, seed, num_threads=1)
        return schs, None if schs else "the design space produced no candidate"
    except Exception as e:  # noqa: BLE001 - a task whose space cannot be generated is a row
        return [], f"{type(e).__name__}: {e}"


def sample_job(job: dict, root: str) -> dict:
    """One task and strategy (the stage's per-item work, run by the executor): up to `n`
    distinct records as MetaSchedule's JSONDatabase writes them ([trace, run_secs, target,
    args_info], no run time yet), and the error when none could be drawn."""
    # TVM takes seconds to import: loaded in the worker that samples.
    from tvm.s_tir import meta_schedule as ms

    target = make_target(job["target"])
    workload = ms.database.Workload.from_json(job["workload"])
    schs, error = draw_task(workload.mod, target, int(job["n"]), job["strategy"], int(job["seed"]))
    # Serialized by MetaSchedule's JSONDatabase: record ids come from the lines, as every reader computes them.
    lines = D.new_record_lines(int(job["workload_index"]), workload.mod, [sch.trace for sch in schs], target)
    return {"task_id": job["task_id"], "strategy": job["strategy"], "error": error,
            "records": [[r.trace, r.run_secs, r.target, r.args_info] for r in lines]}


def failed_sample(job: dict, reason: str) -> dict:
    return {"task_id": job["task_id"], "strategy": job["strategy"], "error": reason, "records": []}


def _new_candidates(records: list, job: dict, out_file, known: set[str]) -> tuple[list, list[dict]]:
    """The record lines and candidate rows of a job's records that are new: a trace that
    another strategy already drew is the same record and is not added twice (`known` grows)."""
    lines, rows = [], []
    for rec in records:
        r = D.RecordLine(job["workload_index"], *rec, file=str(out_file), line_no=0)
        rid = r.record_id(job["task_id"])
        if rid in known:
            continue
        known.add(rid)
        lines.append(r)
        rows.append(dict(record_id=rid, task_id=job["task_id"], strategy=job["strategy"], trace_json=r.trace_text))
    return lines, rows


def released_tasks(cfg) -> frozenset[str]:
    """The tasks `sample.skip_released` (a dataset release) and every release under it hold:
    a release extending it would leave them out, so their candidates are neither drawn nor
    timed."""
    name = cfg.sample.get("skip_released")
    return R.chain_tasks(R.chain(release_named(cfg, name))) if name else frozenset()


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    shard = shard_of(cfg)
    tasks = ws.read("tasks", require=True)
    strategies = strategies_of(cfg)
    target = target_of(cfg)
    out_file = D.shard_record_file(ws, shard.index, shard.count)
    workloads = D.read_workload_lines(ws)
    # A task whose workload line is corrupt is skipped, and force=true leaves its rows alone.
    pairs = shard.of(tasks.merge(pd.DataFrame({"strategy": strategies}), how="cross"), by="task_id")  # task-major
    pairs = D.usable_tasks(pairs, workloads, "sample") if len(pairs) else pairs
    released = pairs["task_id"].isin(released_tasks(cfg))
    skipped = int(pairs.loc[released, "task_id"].nunique())
    if skipped:
        log.info("%d task(s) already in release %s (or one under it): not drawn", skipped, cfg.sample.skip_released)
    pairs = pairs[~released]
    if cfg.force:
        D.drop_record_lines(out_file, set(pairs["workload_index"].astype(int)))
    # A task that failed (a bad setting, a space that could not be generated) is not done.
    todo = ws.todo("candidates", pairs, shard=Shard(), force=bool(cfg.force), on=("task_id", "strategy"),
                   retry_errors=True)
    retried = ws.delete_rows("candidates", {failed_row_id(r.task_id, r.strategy) for r in todo.itertuples()})
    known = set(ws.read("candidates", columns=["record_id"])["record_id"])
    n = int(cfg.budget.candidates_per_task)
    jobs = [dict(task_id=row.task_id, name=row.name, workload_index=int(row.workload_index),
                 workload=workloads[row.workload_index], strategy=row.strategy, target=target, n=n,
                 seed=int(cfg.seed)) for row in todo.itertuples()]
    by_pair = {(j["task_id"], j["strategy"]): j for j in jobs}
    total = failed = duplicates = 0
    out = ws.writer("candidates", shard, flush_rows=1)  # a part per task: sampling a task takes seconds
    with executor_of(cfg) as executor:
        if jobs:
            log.info("sampling %d task(s) x strategy on %s", len(jobs), executor.describe())
        bar = progress(total=len(jobs), desc="sample", unit="task")
        for results in executor.map(sample_job, jobs, root=ws.root, failed=failed_sample,
                                    timeout_s=cfg.sample.get("timeout_s")):
            for res in results:
                job = by_pair[(res["task_id"], res["strategy"])]
                lines, rows = _new_candidates(res["records"], job, out_file, known)
                duplicates += len(res["records"]) - len(lines)
                if res["error"]:
                    failed += 1
                    log.warning("task %s (%s), %s: %s", job["name"], job["task_id"], job["strategy"], res["error"])
                    rows.append(dict(record_id=failed_row_id(job["task_id"], job["strategy"]), task_id=job["task_id"],
                                     strategy=job["strategy"], error=res["error"]))
                out.add(rows)  # candidates first: they are what the records are rebuilt from
                D.append_records(out_file, lines)
                total += len(rows) - bool(res["error"])
            bar.update(len(results))
        bar.close()
    counts = {"tasks": len(shard.of(tasks)), "new": total, "duplicates": duplicates, "failed_tasks": failed}
    if retried:
        counts["retried_tasks"] = retried
    if skipped:
        counts["released_tasks"] = skipped
    if cfg.dataset.source == "tenset" and cfg.dataset.records.as_candidates:
        # TenSet's own measured Ansor programs join the sampled candidates.
        counts.update(add_records(ws, shard, target, tenset_root=tenset_copy(cfg),
                                  max_per_task=cfg.dataset.records.candidates_per_task, force=bool(cfg.force)))
    synced = D.sync_records(ws)
    counts["records"] = synced.get("lines", 0)
    return {**counts, "candidates": int(ws.read("candidates")["error"].isna().sum())}


def failed_row_id(task_id: str, strategy: str) -> str:
    """The record id of the row that says a task drew no candidate with a strategy."""
    return f"{task_id}-none-{strategy}"
