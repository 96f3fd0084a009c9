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
import os

import pandas as pd
from tqdm import tqdm

from features import cuda_resources, profilers, static
from pipeline.core import database as D
from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace

log = logging.getLogger(__name__)


def collect_static(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard) -> dict:
    todo = ws.todo("static", cands, shard=shard, force=bool(cfg.force), clears=("static_stores", "cuda_resources"))
    counts = {"static": 0, "static_errors": 0}
    if todo.empty:
        return counts
    cuda = str(cfg.target.kind) == "cuda" and bool(cfg.collect.cuda_resources)
    nvcc, nvcc_error = None, None
    if cuda:
        try:
            nvcc = cuda_resources.find_nvcc(str(cfg.collect.nvcc))
        except cuda_resources.NvccMissing as e:
            log.warning("%s", e)
            nvcc_error = str(e)
        counts["cuda_kernels"] = 0
    static.preload_tensor_intrinsics()
    workloads = D.read_workload_lines(ws)
    tasks = D.usable_tasks(ws.read("tasks"), workloads, "collect").set_index("task_id")
    todo = todo[todo["task_id"].isin(set(tasks.index))]
    workers = int(cfg.jobs) or os.cpu_count() or 1
    bar = tqdm(total=len(todo), desc="collect static", unit="record")
    with ws.sink(shard) as write:
        for task_id, group in todo.groupby("task_id", sort=True):
            records = [(r.record_id, r.task_id, None if pd.isna(r.trace_json) else r.trace_json, r.error)
                       for r in group.itertuples()]
            rows = static.task_rows(workloads[int(tasks.loc[task_id, "workload_index"])],
                                    json.loads(tasks.loc[task_id, "target"]), records, cuda=cuda, nvcc=nvcc,
                                    nvcc_error=nvcc_error, workers=workers)
            for name, table_rows in rows.items():
                write(name, table_rows)
            for r in rows["static"]:
                counts["static_errors" if r.get("error") else "static"] += 1
            if cuda:
                counts["cuda_kernels"] += sum(1 for r in rows["cuda_resources"] if not r.get("error"))
            bar.update(len(group))
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


def collect_profiler(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, profiler) -> dict:
    tables = profiler.tables()
    if not tables:
        return {}
    device = str(cfg.target.device)
    todo = ws.todo(tables[0], cands, shard=shard, force=bool(cfg.force), device=device, clears=tables[1:])
    jobs, errors, waiting = profiler_jobs(ws, todo)
    bar = tqdm(total=len(jobs) + len(errors), desc=f"collect {tables[0].name}", unit="kernel")
    try:
        with ws.sink(shard, device) as write:
            counts = profiler.profile(jobs, errors, root=ws.root, write=write, progress=bar.update)
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
    if bool(cfg.collect.static):
        counts.update(collect_static(cfg, ws, cands, shard))
    counts.update(collect_profiler(cfg, ws, cands, shard, profiler))
    return counts
