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

`collect.mode` says where the profiler runs, with the run modes stage=measure uses
(pipeline/runner/modes.py): `local` (here, or on the executor's nodes), `export` (a bundle
of parts for a GPU host that has only Python: each part measures its kernels with the timer
and profiles them under ncu, pipeline/runner/part.py), `import` (that bundle's results,
`collect.results`: the measurements table and the ncu tables, the reports read here).
Static features are computed here in every mode.
"""

from __future__ import annotations

import json
import logging

import pandas as pd

from features import cuda_resources, profilers, static
from pipeline.core import database as D
from pipeline.compute import executor as E
from pipeline.compute.progress import progress
from pipeline.core.sharding import Shard
from pipeline.shims.tvm_compat import preload_tensor_intrin
from pipeline.core.workspace import Workspace
from pipeline.runner import modes
from pipeline.options import executor_of, measure_settings, profiler_settings, shard_of, workspace_of

log = logging.getLogger(__name__)


def static_job(job: dict, root: str) -> dict[str, list[dict]]:
    """One task's static feature rows per table (the executor's per-item work)."""
    nvcc, nvcc_error = None, None
    if job["cuda"]:
        try:
            nvcc = cuda_resources.find_nvcc(job["nvcc"])
        except cuda_resources.NvccMissing as e:
            nvcc_error = str(e)
    preload_tensor_intrin()
    return static.task_rows(job["workload"], job["target"], job["records"], cuda=job["cuda"], nvcc=nvcc,
                            nvcc_error=nvcc_error)


def failed_static(job: dict, reason: str) -> dict[str, list[dict]]:
    return {"static": [dict(record_id=rid, task_id=tid, error=f"features: {reason}")
                       for rid, tid, _, _ in job["records"]]}


def collect_static(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, executor: E.Executor) -> dict:
    workloads = D.read_workload_lines(ws)
    tasks = D.usable_tasks(ws.read("tasks"), workloads, "collect").set_index("task_id")
    # A task whose workload line is corrupt is skipped, and force=true leaves its rows alone.
    cands = shard.of(cands)
    cands = cands[cands["task_id"].isin(set(tasks.index))]
    todo = ws.todo("static", cands, shard=Shard(), force=bool(cfg.force), clears=("static_stores", "cuda_resources"))
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
    jobs = [dict(workload=workloads[int(tasks.loc[task_id, "workload_index"])],
                 target=json.loads(tasks.loc[task_id, "target"]), cuda=cuda, nvcc=str(cfg.collect.nvcc),
                 records=[(r.record_id, r.task_id, None if pd.isna(r.trace_json) else r.trace_json, r.error)
                          for r in group.itertuples()])
            for task_id, group in todo.groupby("task_id", sort=True)]
    bar = progress(total=len(todo), desc="collect static", unit="record")
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


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    shard = shard_of(cfg)
    cands = ws.read("candidates", require=True)
    profiler = profilers.create(str(cfg.collect.profiler), profiler_settings(cfg))
    counts: dict = {"records": len(shard.of(cands))}
    with executor_of(cfg) as executor:
        mode = modes.create(str(cfg.collect.get("mode", "local")), measure_settings(cfg, results_of="collect"), ws,
                            executor, option="collect.mode")
        if bool(cfg.collect.static):
            counts.update(collect_static(cfg, ws, cands, shard, executor))
        counts.update(mode.profile(cands, shard, profiler))
    from models import dataset_figures  # matplotlib: imported when the figures are drawn

    counts["figures"] = len(dataset_figures.write(ws))
    return counts
