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

`collect.mode` says where the profiler runs: `local` (here, or on the executor's nodes),
`export` (a bundle of parts for a GPU host that has only Python: each part measures its
kernels with the timer and profiles them under ncu, pipeline/runner/part.py), `import`
(that bundle's results, `collect.results`: the measurements table and the ncu tables,
the reports read here). Static features are computed here in every mode.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from features import cuda_resources, profilers, static
from features.ncu import command as ncu_command
from features.ncu.profile import NcuProfiler, Outcome, read_host_results, write_outcome
from pipeline.core import database as D
from pipeline.compute import executor as E
from pipeline.core.catalog import table
from pipeline.core.errors import PipelineError
from pipeline.compute.progress import progress
from pipeline.core.registry import choose
from pipeline.core.sharding import Shard
from pipeline.shims.tvm_compat import preload_tensor_intrin
from pipeline.core.workspace import Workspace
from pipeline.runner import bundle, modes, wheels
from pipeline.runner.jobs import kernel_jobs
from pipeline.runner.measurements import measure
from pipeline.stages.options import (executor_of, measure_row_options, measure_settings, profiler_settings, shard_of,
                                     workspace_of)

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
    bar = progress(total=len(jobs) + len(errors), desc=f"collect {tables[0].name}", unit="kernel")
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


def bundle_spec(cfg, profiler) -> dict:
    """part.json of collect's bundle: where the kernels run, the timer's options and, with the
    ncu profiler, the ncu command (its report path `{report}` filled in on the host)."""
    settings = measure_settings(cfg)
    spec = dict(device=settings.device, python=str(cfg.bundle.python), ncu=None,
                measure=dict(options=settings.harness_options(), timeout_s=settings.timeout_s))
    if isinstance(profiler, NcuProfiler):
        o = profiler.options
        argv = ncu_command.build_command([], "{report}.ncu-rep", ncu="ncu", metrics=o.metrics,
                                         section_set=o.section_set, clock_control=o.clock_control,
                                         cache_control=o.cache_control, replay_mode=o.replay_mode, domain=o.domain,
                                         extra_args=o.extra_args, section_folder=bundle.SECTIONS_ARG)
        spec["ncu"] = dict(args=argv[1:], options=dict(domain=o.domain, warmup=o.warmup),
                           timeout_s=float(cfg.bundle.ncu_timeout_s), chunk=int(cfg.bundle.ncu_chunk))
    return spec


def export_profiler(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, profiler, executor: E.Executor) -> dict:
    """collect.mode=export: the shard's built kernels that have no profile yet, as bundle parts."""
    tables = profiler.tables()
    todo = ws.todo(tables[0] if tables else "measurements", cands, shard=shard, force=False,
                   device=str(cfg.target.device) if tables else None)
    kernels = ws.read("kernels", require=True).drop_duplicates("record_id", keep="last")
    kernels = kernels[kernels["record_id"].isin(set(todo["record_id"])) & kernels["error"].isna()]
    kernels = kernels[kernels["artifact"].map(lambda a: (ws.root / a).is_file())]
    jobs = kernel_jobs(ws, kernels, int(cfg.measure.check_per_task))
    spec = bundle_spec(cfg, profiler)
    need = list(wheels.ALWAYS) + (list(wheels.NVTX) if spec["ncu"] else []) + (
        list(wheels.CUDA_RUNTIME) if spec["device"] == "cuda" else [])
    b = cfg.bundle
    found = wheels.fetch(need, str(b.python), str(b.platform), Path(str(b.wheel_cache)) if b.wheel_cache else None)
    dest = ws.root / f"bundle-collect-{shard.index}"
    parts = bundle.export_parts(ws.root, jobs, dest, spec=spec, wheels=found, with_runtime=bool(
        cfg.measure.bundle_runtime), part_mib=float(b.part_mib), part_kernels=int(b.part_kernels))
    log.info("wrote %d part(s) of %d kernels in %s; on the GPU host, per part: tar xzf part-<k>.tar.gz && cd "
             "part-<k> && python3 run_part.py --pack ../results-part-<k>.tar.gz; back here: stage=collect "
             "collect.mode=import collect.results=<results-part-*.tar.gz or their folder>", len(parts), len(jobs), dest)
    return {"exported": len(jobs), "parts": len(parts), "bundle": str(dest),
            "part_mib": [round(p.stat().st_size / bundle.MIB, 1) for p in parts]}


def import_profiler(cfg, ws: Workspace, cands: pd.DataFrame, shard: Shard, profiler, executor: E.Executor) -> dict:
    """collect.mode=import: the measurements and the ncu rows of the bundle parts' results."""
    res = cfg.collect.results
    if not res:
        raise PipelineError("collect.mode=import needs collect.results=<results-part-<k>.tar.gz files, their "
                            "unpacked folders, or a folder holding them>")
    paths = [str(p) for p in res] if OmegaConf.is_list(res) else [str(res)]
    counts = {f"measure_{k}": v for k, v in
              measure(ws, shard, modes.Import(paths, key="collect.results"), **measure_row_options(cfg)).items()}
    tables = profiler.tables()
    if not isinstance(profiler, NcuProfiler):
        return counts
    device = str(cfg.target.device)
    todo = ws.todo(tables[0], cands, shard=shard, force=bool(cfg.force), device=device, clears=tables[1:])
    wanted = set(todo["record_id"])
    task_of = dict(zip(cands["record_id"], cands["task_id"]))
    o = profiler.options
    counts.update(ncu=0, ncu_errors=0, ncu_not_run=0)
    with tempfile.TemporaryDirectory(prefix="results-") as tmp, ws.sink(shard, device) as write:
        for folder in bundle.results_folders(paths, Path(tmp)):
            part = read_host_results(folder, o.domain, o.metrics)
            if part is None:
                status = folder / "status.json"
                why = json.loads(status.read_text()).get("ncu") if status.exists() else None
                log.warning("%s: ncu did not run on the host (%s): no ncu rows from it", folder, why or "unknown")
                counts["ncu_not_run"] += 1
                continue
            keep = {rid for rid in {k["record_id"] for k in part.kernels} | set(part.errors) if rid in wanted}
            part = Outcome(kernels=[k for k in part.kernels if k["record_id"] in keep],
                           errors={r: e for r, e in part.errors.items() if r in keep}, units=part.units,
                           string_metrics=part.string_metrics, metrics=part.metrics, host=part.host)
            settled = [dict(record_id=r, task_id=task_of[r]) for r in sorted(keep)]
            ok, bad = write_outcome(part, settled, tables, o.metrics, write)
            counts["ncu"] += ok
            counts["ncu_errors"] += bad
            wanted -= keep
    return counts


# collect.mode -> where the profiler's work is done.
MODES = {"local": collect_profiler, "export": export_profiler, "import": import_profiler}


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    shard = shard_of(cfg)
    cands = ws.read("candidates", require=True)
    profiler = profilers.create(str(cfg.collect.profiler), profiler_settings(cfg))
    mode = choose("collect.mode", MODES, str(cfg.collect.get("mode", "local")))
    counts: dict = {"records": len(shard.of(cands))}
    with executor_of(cfg) as executor:
        if bool(cfg.collect.static):
            counts.update(collect_static(cfg, ws, cands, shard, executor))
        counts.update(mode(cfg, ws, cands, shard, profiler, executor))
    from models import dataset_figures  # matplotlib: imported when the figures are drawn

    counts["figures"] = len(dataset_figures.write(ws))
    return counts
