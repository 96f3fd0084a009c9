"""stage=collect: every record of a workspace as feature rows.

Static features need only the trace (MetaSchedule PerStoreFeature per buffer store and
its program-level aggregate; on CUDA targets also ptxas resources and the launch
configuration of each kernel). Profiler features run the built kernels: `perf stat`
counters on CPU targets, Nsight Compute metrics on CUDA targets (`collect=` picks;
`auto` chooses by target kind). Tables, all under <workspace>/features/:

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.core.errors import PipelineError
from pipeline.core.sharding import shard_of
from pipeline.core.targets import make_target
from pipeline.core.workspace import Workspace, read_table, write_part

log = logging.getLogger(__name__)

PROFILERS = ("perf", "ncu", "none", "auto")
# Rows buffered before a part file is written (bounds what a kill can lose).
FLUSH_ROWS = 16


def profiler_of(cfg) -> str:
    p = str(cfg.collect.profiler)
    if p not in PROFILERS:
        raise PipelineError(f"collect.profiler={p!r}; valid: {', '.join(PROFILERS)}")
    if p == "auto":
        return "ncu" if str(cfg.target.kind) == "cuda" else "perf"
    return p


def _drop_shard_parts(folder: Path, shard: int) -> None:
    if folder.exists():
        for p in folder.glob(f"part-{shard:04d}-*.parquet"):
            p.unlink()


def _done(folder: Path, schema) -> set:
    return set(read_table(folder, schema)["record_id"]) if folder.exists() else set()


class _Writer:
    """Buffers rows of one table and writes them as part files of this shard."""

    def __init__(self, schema, folder: Path, shard: int):
        self.schema, self.folder, self.shard, self.rows = schema, folder, shard, []

    def add(self, rows: list[dict]) -> None:
        self.rows += rows
        if len(self.rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            write_part(self.rows, self.schema, self.folder, self.shard)
            self.rows = []


# ----------------------------------------------------------------------------- static


def collect_static(cfg, ws: Workspace, cands: pd.DataFrame) -> dict:
    from features import cuda_resources, static

    shard = int(cfg.shard.index)
    folders = {"static": ws.features / "static", "stores": ws.features / "static_stores",
               "cuda": ws.features / "cuda_resources"}
    if cfg.force:
        for f in folders.values():
            _drop_shard_parts(f, shard)
    todo = cands[~cands["record_id"].isin(_done(folders["static"], S.STATIC))]
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
    tasks = read_table(ws.tasks).set_index("task_id")
    workloads = D.read_workload_lines(ws)
    out = {k: _Writer(schema, folders[k], shard) for k, schema in
           (("static", S.STATIC), ("stores", S.STATIC_STORES), ("cuda", S.CUDA_RESOURCES))}
    workers = int(cfg.jobs) or os.cpu_count() or 1
    bar = tqdm(total=len(todo), desc="collect static", unit="record")
    for task_id, group in todo.groupby("task_id", sort=True):
        bad = group[group["trace_json"].isna()]
        rows = [dict(record_id=r.record_id, task_id=r.task_id, error=f"candidate: {r.error or 'no trace'}")
                for r in bad.itertuples()]
        good = group[group["trace_json"].notna()]
        if len(good):
            mod = D.load_workload_mod(workloads[int(tasks.loc[task_id, "workload_index"])])
            target = make_target(json.loads(tasks.loc[task_id, "target"]))
            feats = static.extract(mod, target, list(zip(good["record_id"], good["task_id"], good["trace_json"])))
            summaries: dict[str, dict] = {}
            if cuda:
                def resources(f):
                    if f.sch is None:
                        return f, []
                    if nvcc is None:
                        return f, [dict(record_id=f.record_id, task_id=f.task_id, error=nvcc_error)]
                    try:
                        return f, cuda_resources.record_rows(f.record_id, f.task_id, f.sch.mod, target, nvcc)
                    except Exception as e:  # noqa: BLE001 - one record's failure is its row
                        return f, [dict(record_id=f.record_id, task_id=f.task_id,
                                        error=static.short_error("cuda resources", e))]

                with ThreadPoolExecutor(max_workers=workers) as pool:
                    for f, krows in pool.map(resources, feats):
                        out["cuda"].add(krows)
                        summaries[f.record_id] = cuda_resources.summary(krows)
                        counts["cuda_kernels"] += sum(1 for r in krows if not r.get("error"))
            for f in feats:
                out["stores"].add(static.store_rows(f))
                rows.append(static.program_row(f, summaries.get(f.record_id)))
        for r in rows:
            counts["static_errors" if r.get("error") else "static"] += 1
        out["static"].add(rows)
        bar.update(len(group))
    bar.close()
    for w in out.values():
        w.flush()
    return counts


# ----------------------------------------------------------------------------- profilers


def profiler_jobs(cfg, ws: Workspace, cands: pd.DataFrame, done: set) -> tuple[list[dict], list[dict], int]:
    """(kernels to profile, error rows for records that cannot be, records not built yet)."""
    kernels = read_table(ws.require(ws.kernels, "replay"), S.KERNELS).drop_duplicates("record_id", keep="last")
    kernels = kernels.set_index("record_id")
    meas = read_table(ws.measurements, S.MEASUREMENTS).drop_duplicates("record_id", keep="last").set_index(
        "record_id") if ws.measurements.exists() else pd.DataFrame()
    tasks = read_table(ws.tasks).set_index("task_id")
    jobs, errors, waiting = [], [], 0
    for c in cands.itertuples():
        if c.record_id in done:
            continue
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
        if c.record_id in meas.index and pd.notna(meas.loc[c.record_id, "error"]):
            errors.append(dict(record_id=c.record_id, task_id=c.task_id,
                               error=f"not profiled: the measurement failed ({meas.loc[c.record_id, 'error']})"))
            continue
        jobs.append(dict(record_id=c.record_id, task_id=c.task_id, artifact=k["artifact"],
                         args=json.loads(tasks.loc[c.task_id, "args_json"])))
    return jobs, errors, waiting


def collect_cpu(cfg, ws: Workspace, cands: pd.DataFrame) -> dict:
    from features import cpu_counters

    shard = int(cfg.shard.index)
    folder = ws.features / "cpu" / f"device={cfg.target.device}"
    if cfg.force:
        _drop_shard_parts(folder, shard)
    jobs, errors, waiting = profiler_jobs(cfg, ws, cands, _done(folder, S.CPU_COUNTERS))
    out = _Writer(S.CPU_COUNTERS, folder, shard)
    out.add(errors)
    counts = {"cpu": 0, "cpu_errors": len(errors)}
    if waiting:
        counts["cpu_not_built"] = waiting
        log.warning("%d records have no kernel yet: run stage=replay, then stage=collect again", waiting)
    p = cfg.collect.perf
    opts = dict(perf=str(p.executable), events=list(p.events), min_time_s=float(p.min_time_s),
                max_calls=int(p.max_calls), timeout_s=float(p.timeout_s), batch_size=int(p.batch_size))
    bar = tqdm(total=len(jobs), desc="collect cpu counters", unit="kernel")

    def on_row(row):
        counts["cpu_errors" if row.get("error") else "cpu"] += 1
        out.add([row])

    if jobs:
        cpu_counters.collect(jobs, str(ws.root), opts, on_row=on_row, progress=bar.update)
    bar.close()
    out.flush()
    return counts


def collect_ncu(cfg, ws: Workspace, cands: pd.DataFrame) -> dict:
    from features.ncu import metrics as M
    from features.ncu import profile

    n = cfg.collect.ncu
    section_set = str(n.set) if n.get("set") else None
    name = f"ncu_{section_set}" if section_set else "ncu"
    device = str(cfg.target.device)
    shard = int(cfg.shard.index)
    rec_folder = ws.features / name / f"device={device}"
    ker_folder = ws.features / f"{name}_kernels" / f"device={device}"
    if cfg.force:
        _drop_shard_parts(rec_folder, shard)
        _drop_shard_parts(ker_folder, shard)
    jobs, errors, waiting = profiler_jobs(cfg, ws, cands, _done(rec_folder, None))
    counts = {"ncu": 0, "ncu_errors": 0}
    if waiting:
        counts["ncu_not_built"] = waiting
    if not profile.gpu_present():
        log.warning("no NVIDIA GPU on this machine: Nsight Compute features are not collected. Run "
                    "`python -m pipeline stage=collect target=%s` on the GPU host (collect.static=false "
                    "skips what is already here), or set collect.profiler=none.", cfg.target.name)
        counts["ncu_skipped_no_gpu"] = len(jobs)
        return counts
    metrics = None if section_set else M.resolve(_plain(n.metrics))
    opts = profile.Options(ncu=str(n.executable), metrics=metrics, section_set=section_set,
                           clock_control=str(n.clock_control), cache_control=str(n.cache_control),
                           replay_mode=str(n.replay_mode), batch_size=int(n.batch_size),
                           timeout_s=float(n.timeout_s), warmup=int(n.warmup), extra_args=list(n.extra_args))
    report_dir = Path(cfg.paths.ncu_profiles).expanduser().resolve() / ws.name / f"device={device}"

    def write(part, settled_jobs):
        ok, bad = write_ncu_part(part, settled_jobs, name, metrics, rec_folder, ker_folder, shard)
        counts["ncu"] += ok
        counts["ncu_errors"] += bad
        bar.update(len(settled_jobs))

    bar = tqdm(total=len(jobs) + len(errors), desc=f"collect {name}", unit="kernel")
    if errors:
        write(profile.Outcome(kernels=[], errors={e["record_id"]: e["error"] for e in errors}), errors)
    if jobs:
        try:
            outcome = profile.profile(jobs, ws.root, report_dir, opts, on_batch=write, tag=f"shard{shard}")
        except profile.NcuError as e:
            raise PipelineError(f"stage=collect: {e}") from e
        counts["ncu_invocations"] = outcome.invocations
        if outcome.dropped_metrics:
            log.warning("metrics unknown to ncu on this device (null columns): %s", sorted(outcome.dropped_metrics))
    bar.close()
    return counts


def write_ncu_part(part, settled_jobs: list[dict], name: str, metrics: list[str] | None, rec_folder: Path,
                   ker_folder: Path, shard: int) -> tuple[int, int]:
    """Write one profiling outcome: kernel rows, per-record aggregates, error rows in both.

    Columns: the requested metric list, or (for a section set) every metric of the
    reports so far. ncu's units and the reasons for metrics left null go into the file
    metadata (`pipeline.units`, `pipeline.null_reasons`, JSON)."""
    from features.ncu import report

    cols = list(metrics) if metrics else list(part.metrics)
    meta = {b"pipeline.units": json.dumps(part.units).encode(),
            b"pipeline.null_reasons": json.dumps(part.dropped_metrics).encode()}
    ks, rs = (S.ncu_schema(f"{name}_kernels" if per_kernel else name, cols, frozenset(part.string_metrics), per_kernel)
              for per_kernel in (True, False))
    ks, rs = (s.with_metadata({**s.metadata, **meta}) for s in (ks, rs))
    task_of = {j["record_id"]: j["task_id"] for j in settled_jobs}
    krows = [dict(r, task_id=task_of[r["record_id"]]) for r in part.kernels]
    rrows = [dict(r, task_id=task_of[r["record_id"]]) for r in report.aggregate(part.kernels, cols, part.string_metrics)]
    err = [dict(record_id=rid, task_id=task_of[rid], error=e) for rid, e in part.errors.items()]
    write_part(krows + err, ks, ker_folder, shard)
    write_part(rrows + err, rs, rec_folder, shard)
    return len(rrows), len(err)


def _plain(value):
    """A config value as plain Python (ListConfig -> list)."""
    from omegaconf import ListConfig, OmegaConf

    return OmegaConf.to_container(value) if isinstance(value, ListConfig) else value


# ----------------------------------------------------------------------------- stage


def run(cfg) -> dict:
    ws = Workspace.from_cfg(cfg)
    cands = shard_of(read_table(ws.require(ws.candidates, "sample"), S.CANDIDATES), cfg)
    profiler = profiler_of(cfg)
    counts: dict = {"records": len(cands)}
    if bool(cfg.collect.static):
        counts.update(collect_static(cfg, ws, cands))
    if profiler == "perf":
        counts.update(collect_cpu(cfg, ws, cands))
    elif profiler == "ncu":
        counts.update(collect_ncu(cfg, ws, cands))
    return counts
