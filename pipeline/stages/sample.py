"""stage=sample: distinct schedule candidates per task, as MetaSchedule tuning records.

Candidates are drawn from MetaSchedule's own design spaces (post-order-apply) by its
own search strategies, so the dataset covers the space MetaSchedule actually searches.
Records are committed to the workspace's JSONDatabase without run times.
"""

from __future__ import annotations

import logging

from tqdm import tqdm

from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.core.sharding import shard_of
from pipeline.core.targets import make_target, target_dict
from pipeline.core.workspace import Workspace, read_table, write_part

log = logging.getLogger(__name__)

STRATEGIES = ("replay-trace", "evolutionary")


def draw_candidates(mod, target, n: int, strategy: str, seed: int, num_threads: int) -> list:
    """Up to `n` schedules with distinct traces, drawn by a MetaSchedule search strategy."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.core.tvm_compat import preload_tensor_intrin

    preload_tensor_intrin()

    if strategy not in STRATEGIES:
        raise ValueError(f"sample strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    ctx = ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply", search_strategy=strategy,
        task_name="sample", num_threads=num_threads, rand_state=seed,
    )
    spaces = ctx.generate_design_space()
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


def strategies_of(cfg) -> list[str]:
    """The search strategies that draw candidates (`sample.strategies`), validated."""
    names = [str(x) for x in cfg.sample.strategies]
    bad = [x for x in names if x not in STRATEGIES]
    if not names or bad:
        raise ValueError(f"sample.strategies={names}; each must be one of: {', '.join(STRATEGIES)}")
    return list(dict.fromkeys(names))


def run(cfg) -> dict:
    from tvm.s_tir import meta_schedule as ms

    ws = Workspace.from_cfg(cfg)
    tasks = shard_of(read_table(ws.require(ws.tasks, "tasks")), cfg)
    strategies = strategies_of(cfg)
    target = make_target(target_dict(cfg))
    out_file = D.shard_record_file(ws, int(cfg.shard.index), int(cfg.shard.count))
    if cfg.force:
        for p in [out_file, *[p for p in ws.candidates.glob(f"part-{int(cfg.shard.index):04d}-*.parquet")]]:
            p.unlink(missing_ok=True)
    existing = read_table(ws.candidates, S.CANDIDATES) if ws.candidates.exists() else S.CANDIDATES.empty_table().to_pandas()
    done = set(zip(existing["task_id"], existing["strategy"]))
    known = set(existing["record_id"])
    workloads = D.read_workload_lines(ws)
    db = ms.database.JSONDatabase(str(ws.db_workload), str(out_file), allow_missing=True)
    n = int(cfg.budget.candidates_per_task)
    total = failed = duplicates = 0
    todo = [(row, s) for row in tasks.itertuples() for s in strategies if (row.task_id, s) not in done]
    for row, strategy in tqdm(todo, desc="sample", unit="task"):
        wl_line = workloads[row.workload_index]
        workload = ms.database.Workload.from_json(wl_line)
        try:
            schs = draw_candidates(workload.mod, target, n, strategy, int(cfg.seed), target.attrs.get("num-cores", 1) or 1)
            error = None if schs else "the design space produced no candidate"
        except Exception as e:  # noqa: BLE001 - a task whose space cannot be generated is a row
            schs, error = [], f"{type(e).__name__}: {e}"
        args_info = ms.arg_info.ArgInfo.from_prim_func(workload.mod["main"])
        # Record ids come from the lines as written, so every reader computes the same id.
        # A trace that another strategy already drew is the same record: it is not added twice.
        before = len(D.read_record_lines([out_file])[0]) if out_file.exists() else 0
        for sch in schs:
            db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, None, target, args_info))
        lines, _ = D.read_record_lines([out_file])
        rows, keep = [], lines[:before]
        for r in lines[before:]:
            rid = r.record_id(row.task_id)
            if rid in known:
                duplicates += 1
                continue
            known.add(rid)
            keep.append(r)
            rows.append(dict(record_id=rid, task_id=row.task_id, strategy=strategy, trace_json=r.trace_text))
        if len(keep) != len(lines):
            D.rewrite_records(out_file, keep)
        if error:
            failed += 1
            log.warning("task %s (%s), %s: %s", row.name, row.task_id, strategy, error)
            rows.append(dict(record_id=f"{row.task_id}-none-{strategy}", task_id=row.task_id, strategy=strategy,
                             error=error))
        write_part(rows, S.CANDIDATES, ws.candidates, int(cfg.shard.index))
        total += len(rows) - bool(error)
    counts = {"tasks": len(tasks), "new": total, "duplicates": duplicates, "failed_tasks": failed}
    if cfg.dataset.source == "tenset" and cfg.dataset.records.as_candidates:
        # TenSet's own measured Ansor programs join the sampled candidates.
        from pipeline.tenset.candidates import add_records

        counts.update(add_records(cfg, cfg.dataset.records.candidates_per_task))
    all_rows = read_table(ws.candidates, S.CANDIDATES)
    return {**counts, "candidates": int(all_rows["error"].isna().sum())}
