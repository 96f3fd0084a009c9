"""stage=collect: every record of a workspace as feature rows.

Static features need only the trace (MetaSchedule PerStoreFeature per buffer store and
its program-level aggregate; on CUDA targets also ptxas resources and the launch
configuration of each kernel: features/static.py, one task at a time). Profiler features
run the built kernels (`collect.profiler`, features/profilers.py): `perf stat` counters
on CPU targets, Nsight Compute metrics on CUDA targets (`auto` chooses by target kind).
Tables, all under <workspace>/features/ (pipeline/core/catalog.py):

  static/                       one row per record: sum/mean/max over stores (+ cuda.*)
  static_stores/                one row per buffer store of a record
  cuda_resources/               one row per CUDA kernel of a record
  cpu/device=<d>/               one row per record: perf + getrusage counters per call
  ncu/device=<d>/               one row per record: ncu metrics over its kernels
  ncu_kernels/device=<d>/       one row per profiled kernel launch

Every record of the shard gets one row per table it belongs to, with `error` when its
features could not be had. Finished records are skipped on the next run; force=true
redoes the shard.
"""

from __future__ import annotations

import json
import logging

import pandas as pd
from tqdm import tqdm

from features import cuda_resources, profilers, static
from pipeline.core import database as D
from pipeline.core import executor as E
from pipeline.core.catalog import table
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace

log = logging.getLogger(__name__)


def static_job(job: dict, root: str) -> dict[str, list[dict]]:
    """One task's static feature rows per table (the executor's per-item work)."""
    nvcc, nvcc_error = None, None
    if job["cuda"]:
        try:
            nvcc = cuda_resources.find_nvcc(job["nvcc"])
        except cuda_resources.NvccMissing as e:
            nvcc_error = str(e)
    static.preload_tensor_intrinsics()
    return static.task_rows(job["workload"], job["target"], job["records"], cuda=job["cuda"], nvcc=nvcc,
                            nvcc_error=nvcc_error)


def failed_static(job: dict, reason: str) -> dict[str, list[dict]]:
    return {"static": [dict(record_id=rid, task_id=tid, error=f"features: {reason}")
                       for rid, tid, _, _ in job["records"]]}


def collect_static(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, executor: E.Executor) -> dict:
    todo = ws.todo("static", cands, shard=shard, force=bool(cfg.force), clears=("static_stores", "cuda_resources"))
    counts = {"static": 0, "static_errors": 0}
    if todo.empty:
        return counts
    cuda = str(cfg.target.kind) == "cuda" and bool(cfg.collect.cuda_resources)
    if cuda:
        if executor.runs_here:
            try:
                cuda_resources.find_nvcc(str(cfg.collect.nvcc))
            except cuda_resources.NvccMissing as e:
                log.warning("%s", e)
        counts["cuda_kernels"] = 0
    workloads = D.read_workload_lines(ws)
    tasks = D.usable_tasks(ws.read("tasks"), workloads, "collect").set_index("task_id")
    todo = todo[todo["task_id"].isin(set(tasks.index))]
    jobs = [dict(workload=workloads[int(tasks.loc[task_id, "workload_index"])],
                 target=json.loads(tasks.loc[task_id, "target"]), cuda=cuda, nvcc=str(cfg.collect.nvcc),
                 records=[(r.record_id, r.task_id, None if pd.isna(r.trace_json) else r.trace_json, r.error)
                          for r in group.itertuples()])
            for task_id, group in todo.groupby("task_id", sort=True)]
    bar = tqdm(total=len(todo), desc="collect static", unit="record")
    with ws.sink(shard) as write:
        for results in executor.map(static_job, jobs, root=ws.root, failed=failed_static):
            for rows in results:
                for name, table_rows in rows.items():
                    write(name, table_rows)
                for r in rows["static"]:
                    counts["static_errors" if r.get("error") else "static"] += 1
                if cuda:
                    counts["cuda_kernels"] += sum(1 for r in rows.get("cuda_resources", ()) if not r.get("error"))
                bar.update(len(rows["static"]))
    bar.close()
    return counts


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
    table = job["profiler"].tables()[0]
    rows = [dict(record_id=j["record_id"], task_id=j["task_id"], error=f"run: {reason}") for j in job["jobs"]]
    return {"writes": [(table, rows + job["errors"], None)], "counts": {"lost": len(rows)}}


def collect_profiler(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, profiler, executor: E.Executor) -> dict:
    tables = profiler.tables()
    if not tables:
        return {}
    device = str(cfg.target.device)
    todo = ws.todo(tables[0], cands, shard=shard, force=bool(cfg.force), device=device, clears=tables[1:])
    jobs, errors, waiting = profiler_jobs(ws, todo)
    size = max(1, int(profiler.batch_size))
    # One executor job per batch of the profiler; the records that cannot be profiled ride with the first.
    batches = [dict(profiler=profiler, jobs=jobs[i:i + size], errors=[], reads=sorted({j["artifact"] for j in
                                                                                        jobs[i:i + size]}))
               for i in range(0, len(jobs), size)] or ([dict(profiler=profiler, jobs=[], errors=[], reads=[])]
                                                      if errors else [])
    if batches:
        batches[0]["errors"] = errors
    counts: dict = {profiler.name: 0, f"{profiler.name}_errors": 0}  # also when nothing was left to do
    bar = tqdm(total=len(jobs) + len(errors), desc=f"collect {tables[0].name}", unit="kernel")
    try:
        with ws.sink(shard, device) as write:
            for results in executor.map(profile_job, batches, root=ws.root, failed=failed_profile, device=True):
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


def run(cfg) -> dict:
    ws = Workspace.from_cfg(cfg)
    shard = Shard.from_cfg(cfg)
    cands = ws.read("candidates", require=True)
    profiler = profilers.create(str(cfg.collect.profiler), cfg)
    counts: dict = {"records": len(shard.of(cands))}
    with E.create(cfg) as executor:
        if bool(cfg.collect.static):
            counts.update(collect_static(cfg, ws, cands, shard, executor))
        counts.update(collect_profiler(cfg, ws, cands, shard, profiler, executor))
    return counts
