"""Static features of a record: MetaSchedule's PerStoreFeature, from its trace alone.

The schedule is rebuilt from the workload and the record's trace (postprocessors kept, as
MetaSchedule measured it) and handed to the same `PerStoreFeature.extract_from` that
MetaSchedule's own XGBoost cost model calls, so a model trained here sees exactly the
features a tuning run produces. Each buffer store gives one row of 164 values; the
program-level aggregate (sum/mean/max over stores) serves record-level models.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from features import cuda_resources
from pipeline.core import schema as S
from pipeline.core.database import load_workload_mod
from pipeline.device.harness import short_error
from pipeline.shims.targets import make_target
from pipeline.core.workspace import Workspace

N_FEATURES = len(S.PER_STORE_FEATURE_NAMES)


@dataclass
class StoreFeatures:
    """The per-store matrix of one record, or the reason it could not be extracted."""

    record_id: str
    task_id: str
    values: np.ndarray | None  # float32 [n_stores, 164]
    error: str | None = None
    sch: object = None  # the replayed tvm.s_tir.Schedule (for build-time resources)


def schedule_from_trace(mod, trace_json: str):
    """A Schedule of `mod` with the record's trace replayed (postprocessors included)."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    sch = Schedule(mod)
    Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch


def extract(mod, target, records: list[tuple[str, str, str]], extractor=None) -> list[StoreFeatures]:
    """PerStoreFeature of every (record_id, task_id, trace_json) of one workload `mod`.

    One `extract_from` call per task (MetaSchedule parallelises it over candidates); a
    record whose trace does not replay gets an error and does not stop the others.
    """
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    extractor = extractor or ms.feature_extractor.PerStoreFeature()
    if int(extractor.feature_vector_length) != N_FEATURES:
        raise ValueError(f"PerStoreFeature gives {extractor.feature_vector_length} values per store; "
                         f"pipeline/core/schema.py names {N_FEATURES}: update PER_STORE_FEATURE_NAMES")
    args_info = ArgInfo.from_prim_func(mod["main"])
    out: list[StoreFeatures] = []
    cands, slots = [], []
    for rid, tid, trace in records:
        try:
            sch = schedule_from_trace(mod, trace)
        except Exception as e:  # noqa: BLE001 - a bad trace is an error row
            out.append(StoreFeatures(rid, tid, None, short_error("replay", e)))
            continue
        slots.append(len(out))
        out.append(StoreFeatures(rid, tid, None, sch=sch))
        cands.append(ms.MeasureCandidate(sch, args_info))
    if cands:
        ctx = ms.TuneContext(mod=mod, target=target, num_threads=1)
        try:
            arrays = extractor.extract_from(ctx, cands)
            for slot, arr in zip(slots, arrays):
                out[slot].values = arr.numpy().astype(np.float32, copy=False).reshape(-1, N_FEATURES)
        except Exception:  # noqa: BLE001 - find the culprit one candidate at a time
            for slot, cand in zip(slots, cands):
                try:
                    arr = extractor.extract_from(ctx, [cand])[0]
                    out[slot].values = arr.numpy().astype(np.float32, copy=False).reshape(-1, N_FEATURES)
                except Exception as e:  # noqa: BLE001
                    out[slot].error = short_error("features", e)
    return out


def aggregate(values: np.ndarray | None) -> dict[str, float]:
    """Program-level columns `<agg>.<feature>` (sum, mean, max over the stores)."""
    names = S.PER_STORE_FEATURE_NAMES
    if values is None or len(values) == 0:
        return {}
    v = values.astype(np.float64)
    aggs = {"sum": v.sum(axis=0), "mean": v.mean(axis=0), "max": v.max(axis=0)}
    return {f"{a}.{n}": float(aggs[a][i]) for a in S.STATIC_AGGREGATES for i, n in enumerate(names)}


def store_rows(f: StoreFeatures) -> list[dict]:
    if f.values is None:
        return []
    names = S.PER_STORE_FEATURE_NAMES
    return [{"record_id": f.record_id, "task_id": f.task_id, "store_index": i, **dict(zip(names, row.tolist()))}
            for i, row in enumerate(f.values)]


def program_row(f: StoreFeatures, cuda_summary: dict | None = None) -> dict:
    row = {"record_id": f.record_id, "task_id": f.task_id, "error": f.error}
    if f.values is not None:
        row["n_stores"] = int(len(f.values))
        row.update(aggregate(f.values))
    row.update(cuda_summary or {})
    return row


def task_rows(workload: list, target: dict, records: list[tuple[str, str, str | None, str | None]], *,
              cuda: bool = False, nvcc: str | None = None, nvcc_error: str | None = None,
              workers: int = 1) -> dict[str, list[dict]]:
    """Rows of one task's records for the tables `static`, `static_stores` and, with `cuda`,
    `cuda_resources` (ptxas with `nvcc`, or `nvcc_error` as every record's reason when it is
    missing): the collect stage's per-task work, on plain data (the task's
    database_workload.json line, its target as a dict, and per record: record_id, task_id,
    trace_json or None, the candidate's error)."""
    out: dict[str, list[dict]] = {"static": [], "static_stores": [], "cuda_resources": []}
    good = []
    for rid, tid, trace, error in records:
        if trace is None:
            out["static"].append(dict(record_id=rid, task_id=tid, error=f"candidate: {error or 'no trace'}"))
        else:
            good.append((rid, tid, trace))
    if not good:
        return out
    mod, target = load_workload_mod(workload), make_target(target)
    feats = extract(mod, target, good)
    summaries: dict[str, dict] = {}
    if cuda:
        def resources(f: StoreFeatures) -> list[dict]:
            if f.sch is None:
                return []
            if nvcc is None:
                return [dict(record_id=f.record_id, task_id=f.task_id, error=nvcc_error)]
            try:
                return cuda_resources.record_rows(f.record_id, f.task_id, f.sch.mod, target, nvcc)
            except Exception as e:  # noqa: BLE001 - one record's failure is its row
                return [dict(record_id=f.record_id, task_id=f.task_id, error=short_error("cuda resources", e))]

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for f, krows in zip(feats, pool.map(resources, feats)):
                out["cuda_resources"] += krows
                summaries[f.record_id] = cuda_resources.summary(krows)
    for f in feats:
        out["static_stores"] += store_rows(f)
        out["static"].append(program_row(f, summaries.get(f.record_id)))
    return out


def load(ws: Workspace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(program table, per-store table) of a workspace, error rows left out."""
    program = ws.read("static")
    stores = ws.read("static_stores")
    program = program[program["error"].isna()].drop(columns=["error"]).drop_duplicates("record_id", keep="last")
    stores = stores.drop_duplicates(["record_id", "store_index"], keep="last")
    return program.reset_index(drop=True), stores.sort_values(["record_id", "store_index"]).reset_index(drop=True)
