"""stage=measure: run every built kernel on the device, time it, check a sample.

Kernels run one at a time in a child process (pipeline/runner/kernel_runner.py, TVM
runtime only), so a kernel that crashes or hangs becomes an error row and the rest go
on. Run times are written back into the workspace's MetaSchedule JSON database, which
makes the workspace a TenSet-style dataset that `ms.database.JSONDatabase` loads.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from pipeline.core import schema as S
from pipeline.core import database as D
from pipeline.core.errors import PipelineError
from pipeline.reference import make_reference
from pipeline.runner.bundle import export_bundle, read_results
from pipeline.runner.kernel_runner import run_jobs
from pipeline.core.sharding import shard_of
from pipeline.core.workspace import Workspace, read_table, write_part

log = logging.getLogger(__name__)


def device_kind(cfg) -> str:
    return "cuda" if str(cfg.target.kind) == "cuda" else "cpu"


def ensure_device(kind: str) -> None:
    import tvm

    dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    if not dev.exist:
        raise PipelineError(
            "stage=measure: this machine has no CUDA device. Kernels for CUDA targets build "
            "anywhere but run on a GPU host: copy the workspace (lib/, references/, "
            "kernels/, tasks.parquet) and pipeline/runner/kernel_runner.py there and run the "
            "pipeline's measure stage on that host, or run this stage on the GPU host itself."
        )


def check_sample(kernels: pd.DataFrame, per_task: int) -> set:
    """Record ids whose outputs are compared with the reference (first few per task)."""
    if per_task <= 0:
        return set()
    ok = kernels[kernels["error"].isna()].sort_values("record_id")
    return set(ok.groupby("task_id").head(per_task)["record_id"])


def write_back(ws: Workspace, measured: pd.DataFrame) -> int:
    """Put run times into every tuning-record file; failed runs get MetaSchedule's 1e10."""
    tasks = read_table(ws.tasks)
    task_of_index = dict(zip(tasks["workload_index"], tasks["task_id"]))
    by_id = {r.record_id: r for r in measured.itertuples()}
    n = 0
    for f in D.record_files(ws):
        lines, bad = D.read_record_lines([f])
        for rec in lines:
            m = by_id.get(rec.record_id(task_of_index.get(rec.workload_index, "")))
            if m is None:
                continue
            rec.run_secs = list(m.run_secs) if pd.isna(m.error) and m.run_secs is not None else [D.FAILED_RUN_SECS]
            n += 1
        if bad:
            log.warning("%s: %d corrupted line(s) dropped while writing run times back", f, len(bad))
        D.rewrite_records(f, lines)
    return n


MODES = ("local", "export", "import")


def run(cfg) -> dict:
    ws = Workspace.from_cfg(cfg)
    kind = device_kind(cfg)
    mode = str(cfg.measure.mode)
    if mode not in MODES:
        raise PipelineError(f"measure.mode={mode!r}; valid: {', '.join(MODES)}")
    if mode == "local":
        ensure_device(kind)
    kernels = shard_of(read_table(ws.require(ws.kernels, "replay"), S.KERNELS), cfg)
    if cfg.force and ws.measurements.exists():
        for p in ws.measurements.glob(f"part-{int(cfg.shard.index):04d}-*.parquet"):
            p.unlink()
    done = set(read_table(ws.measurements, S.MEASUREMENTS)["record_id"]) if ws.measurements.exists() else set()
    todo = kernels[~kernels["record_id"].isin(done)]
    device = str(cfg.target.device)
    m = cfg.measure
    # Build failures carry over as error rows: every record appears once in measurements.
    failed = todo[todo["error"].notna()]
    write_part([dict(record_id=r.record_id, task_id=r.task_id, device=device, error=r.error) for r in failed.itertuples()],
               S.MEASUREMENTS, ws.measurements, int(cfg.shard.index))
    todo = todo[todo["error"].isna()]
    to_check = check_sample(todo, int(m.check_per_task))
    tasks = read_table(ws.tasks).set_index("task_id")
    workloads = D.read_workload_lines(ws)
    refs = {}
    for tid in sorted({t for t in todo[todo["record_id"].isin(to_check)]["task_id"]}):
        path = ws.references / f"{tid}.npz"
        if not path.exists():
            make_reference(D.load_workload_mod(workloads[int(tasks.loc[tid, "workload_index"])]),
                           json.loads(tasks.loc[tid, "args_json"]), path)
        refs[tid] = os.path.relpath(path, ws.root)
    jobs = [dict(record_id=r.record_id, task_id=r.task_id, artifact=r.artifact,
                 args=json.loads(tasks.loc[r.task_id, "args_json"]),
                 reference=refs.get(r.task_id) if r.record_id in to_check else None)
            for r in todo.itertuples()]
    opts = dict(number=int(m.number), repeat=int(m.repeat), min_repeat_ms=int(m.min_repeat_ms),
                rtol=float(m.rtol), atol=float(m.atol))
    counts = {"measured": 0, "failed": len(failed), "checked": 0, "incorrect": 0}
    if mode == "export":
        dest = ws.root / f"bundle-{int(cfg.shard.index)}"
        archive = export_bundle(ws.root, jobs, dest, kind, opts, float(m.timeout_s), bool(m.bundle_runtime))
        log.info("wrote %s (%d kernels); run RUN.txt's command on the device host, then "
                 "`python -m pipeline stage=measure measure.mode=import measure.results=<results.jsonl>`",
                 archive, len(jobs))
        return {"exported": len(jobs), "bundle": str(archive)}
    if mode == "import":
        if not m.results:
            raise PipelineError("measure.mode=import needs measure.results=<path to results.jsonl from the device host>")
        try:
            imported = read_results(Path(str(m.results)))
        except FileNotFoundError as e:
            raise PipelineError(f"measure.results={m.results}: no such file") from e
        wanted = {j["record_id"] for j in jobs}
        batches = [[r for r in imported if r["record_id"] in wanted]]
        missing = len(wanted) - len(batches[0])
        if missing:
            log.warning("%d kernel(s) have no result in %s; they stay unmeasured", missing, m.results)
    else:
        batches = None
    bar = tqdm(total=len(jobs), desc="measure", unit="kernel")
    size = max(1, int(m.batch_size))
    results_file = ws.root / "runner" / f"results-{int(cfg.shard.index)}.jsonl"
    task_of = {j["record_id"]: j["task_id"] for j in jobs}
    for start in range(0, len(jobs), size) if batches is None else range(len(batches)):
        if batches is None:
            batch = jobs[start:start + size]
            results_file.unlink(missing_ok=True)
            results = run_jobs(batch, results_file, ws.root, kind, opts, float(m.timeout_s))
        else:
            results = batch = batches[start]
        rows = []
        for res in results:
            row = {k: v for k, v in res.items() if k != "event"}
            row.update(task_id=task_of[res["record_id"]], device=device)
            row.setdefault("checked", False)
            if row.get("error"):
                counts["failed"] += 1
            else:
                counts["measured"] += 1
                counts["checked"] += int(bool(row["checked"]))
                counts["incorrect"] += int(row.get("correct") is False)
            rows.append(row)
        write_part(rows, S.MEASUREMENTS, ws.measurements, int(cfg.shard.index))
        bar.update(len(batch))
    bar.close()
    if counts["incorrect"]:
        log.warning("%d checked kernel(s) disagree with the unscheduled reference", counts["incorrect"])
    counts["written_back"] = write_back(ws, read_table(ws.measurements, S.MEASUREMENTS))
    return counts
