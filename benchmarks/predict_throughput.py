"""Prediction rate inside MetaSchedule: the pipeline's model (PipelineCostModel) vs XGBModel.

Both score the same real MetaSchedule candidates (drawn from the task's design space by
MetaSchedule's own sampler) through `predict(context, candidates)`, which includes the
PerStoreFeature extraction both need. XGBModel is trained first, through its own `update`,
on the workspace's measured records (so it predicts with its booster, not at random).

    python benchmarks/predict_throughput.py --workspace data/ops-llvm \
        [--model-uri models:/ops-llvm-cost-model@best-static | --model-path <saved model folder>] \
        [--tracking-uri sqlite:///mlflow.db] [--task 0] [--candidates 512] [--repeat 5]

Prints candidates per second for each, the ratio, and the extraction-only rate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path



def measured_xgb(ws, threads: int, seed: int):
    """MetaSchedule's XGBModel, updated task by task with the workspace's measured records."""
    import pandas as pd
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    from pipeline.core import schema as S
    from features.static import schedule_from_trace
    from models.tables import successful_measurements
    from pipeline.core import database as D
    from pipeline.shims.targets import make_target
    from pipeline.core.workspace import read_table

    tasks = read_table(ws.tasks, S.TASKS).set_index("task_id")
    cands = read_table(ws.candidates, S.CANDIDATES).dropna(subset=["trace_json"]).drop_duplicates("record_id")
    meas = successful_measurements(ws)[["record_id", "mean_s"]]
    df = cands.merge(meas, on="record_id")
    workloads = D.read_workload_lines(ws)
    model = ms.cost_model.XGBModel(config=XGBConfig(seed=seed, nthread=threads), num_warmup_samples=0,
                                   verbose_eval=0)
    groups = list(df.groupby("task_id", sort=True))
    for i, (tid, g) in enumerate(groups):
        mod = D.load_workload_mod(workloads[int(tasks.loc[tid, "workload_index"])])
        ctx = ms.TuneContext(mod=mod, target=make_target(json.loads(tasks.loc[tid, "target"])), num_threads=threads)
        args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        mc = [ms.MeasureCandidate(schedule_from_trace(mod, t), args) for t in g["trace_json"]]
        res = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in g["mean_s"]]
        model.adaptive_training = i < len(groups) - 1  # the last update trains on everything
        model.update(ctx, mc, res)
    return model, int(pd.Series(df["task_id"]).nunique()), len(df)


def rate(fn, n: int, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workspace", required=True, help="a measured workspace folder (stage=measure done)")
    p.add_argument("--model-uri", help="MLflow URI of our model (default models:/<workspace>-cost-model@best-static)")
    p.add_argument("--model-path", help="a saved CostModel folder instead of --model-uri")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the project's sqlite store)")
    p.add_argument("--task", type=int, default=0, help="row of tasks.parquet whose design space is sampled")
    p.add_argument("--candidates", type=int, default=512, help="candidates per predict call (MetaSchedule's population)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    from tvm.s_tir import meta_schedule as ms

    from pipeline.core import schema as S
    from models import tracking
    from pipeline.tuning.cost_model import PipelineCostModel
    from pipeline.core import database as D
    from pipeline.stages.sample import draw_candidates
    from pipeline.shims.targets import make_target
    from pipeline.core.workspace import Workspace, read_table

    ws = Workspace(Path(a.workspace).expanduser().resolve())
    threads = os.cpu_count() or 1
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri(a.tracking_uri))
    if a.model_path:
        ours = PipelineCostModel.from_path(a.model_path, threads=threads)
    else:
        ours = PipelineCostModel.from_uri(a.model_uri or f"models:/{ws.name}-cost-model@best-static", threads=threads)
    xgb, n_tasks, n_records = measured_xgb(ws, threads, a.seed)

    task = read_table(ws.require(ws.tasks, "tasks"), S.TASKS).iloc[a.task]
    mod = D.load_workload_mod(D.read_workload_lines(ws)[int(task.workload_index)])
    target = make_target(json.loads(task.target))
    schs = draw_candidates(mod, target, a.candidates, "replay-trace", a.seed, threads)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    cands = [ms.MeasureCandidate(s, args) for s in schs]
    ctx = ms.TuneContext(mod=mod, target=target, num_threads=threads)
    n = len(cands)
    extractor = ms.feature_extractor.PerStoreFeature()

    r_ours = rate(lambda: ours.predict(ctx, cands), n, a.repeat)
    r_xgb = rate(lambda: xgb.predict(ctx, cands), n, a.repeat)
    r_ext = rate(lambda: extractor.extract_from(ctx, cands), n, a.repeat)
    info = ours.info
    print(f"workspace {ws.name}, task {task['name']}: {n} MetaSchedule candidates per predict call, "
          f"{threads} threads, best of {a.repeat}")
    print(f"  ours   ({info.get('model') or ours.model.name}, {ours.source}): {r_ours:10.0f} candidates/s")
    print(f"  xgb    (MetaSchedule XGBModel, trained on {n_records} records of {n_tasks} tasks): {r_xgb:10.0f} candidates/s")
    print(f"  ratio  ours / xgb: {r_ours / r_xgb:.2f}")
    print(f"  (PerStoreFeature extraction alone: {r_ext:.0f} candidates/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
