"""Training time and prediction rate of the cost models at dataset scale.

Takes the real training table of a workspace (one feature set), resamples its records with
replacement to each requested size, and for each model measures
  train_s        wall time of `fit` with a fixed budget (GBDT: --rounds boosting rounds, MLP:
                 --epochs epochs; no validation part, so no early stopping)
  predict_per_s  candidates scored per second for a batch of --batch candidates (median of
                 --repeats calls on record rows of the table, features already extracted)
  peak_rss_gb    the process's peak resident memory after the model (ru_maxrss)
The MLP runs on its configured torch threads (conf/model/mlp.yaml, 1): its batches are small
and intra-op threads cost more than they save on a shared CPU.

Usage (Hydra overrides select the workspace and may change a model, as for the pipeline):
  python benchmarks/train_throughput.py paths.data=/tmp/train_ws --rows 100000 1000000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from models import registry
from models.tables import build_table
from pipeline.config import compose
from pipeline.options import workspace_of


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def resample(table, n: int, seed: int):
    idx = np.random.default_rng(seed).integers(0, len(table), size=n)
    return table.take(np.sort(idx))


def model_cfg(cfg, name: str, rounds: int, epochs: int) -> dict:
    """Model `name`'s composed config (model=all holds every one) with a fixed training budget."""
    if name not in cfg.model:
        raise SystemExit(f"--models: {name!r} is not a model config; valid: "
                         f"{', '.join(k for k in cfg.model if k != 'name')}")
    out = OmegaConf.to_container(cfg.model[name], resolve=True)
    for node in [out, *out.get("members", {}).values()]:  # an ensemble's members too
        if "rounds_without_val" in node:
            node["rounds_without_val"] = rounds
        if "max_epochs" in node:
            node.update(max_epochs=epochs, max_seconds=0)
    return out


def predict_rate(model, table, batch: int, repeats: int) -> float:
    sub = table.take(np.arange(min(batch, len(table))))
    if len(sub) < batch:
        sub = table.take(np.resize(np.arange(len(table)), batch))
    # the matrices the model reads (its own columns; stores for store models), as the adapter hands them
    records = sub.frame[model.spec.columns].to_numpy(dtype=np.float32, na_value=np.nan)
    stores = sub.stores[:, [sub.spec.store_columns.index(c) for c in model.spec.store_columns]] \
        if model.spec.store_columns else None
    arrays = (records, stores, sub.offsets if stores is not None else None)
    model.predict_arrays(*arrays)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.predict_arrays(*arrays)
        times.append(time.perf_counter() - t0)
    return batch / float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides naming the workspace (paths.data=..., dataset=...)")
    p.add_argument("--features", default="static", help="feature set: static | profiler | all")
    p.add_argument("--models", nargs="+", default=["lgbm", "xgb", "mlp"])
    p.add_argument("--rows", nargs="+", type=int, default=[100_000, 1_000_000])
    p.add_argument("--rounds", type=int, default=100, help="boosting rounds of the GBDT models")
    p.add_argument("--epochs", type=int, default=1, help="epochs of the MLP")
    p.add_argument("--threads", type=int, default=0,
                   help="threads per GBDT model (0 = all cores); the MLP uses its config's `threads` (1)")
    p.add_argument("--batch", type=int, default=512, help="candidates per prediction call")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)

    cfg = compose(["model=all", "features=each", *args.overrides])
    ws = workspace_of(cfg)
    fcfg = cfg.features[args.features]
    base = build_table(ws, args.features, exclude=list(fcfg.get("exclude") or []), device=str(cfg.target.device))
    threads = args.threads or os.cpu_count() or 1
    stores_per = (len(base.stores) / len(base)) if base.stores is not None else 0.0
    print(f"workspace {ws.root}: {len(base)} records, {len(base.spec.columns)} record columns, "
          f"{len(base.spec.store_columns)} store columns, {stores_per:.2f} stores/record; threads {threads}, "
          f"cpus {os.cpu_count()}")
    results = []
    for n in args.rows:
        big = resample(base, n, seed=n)
        gc.collect()
        for name in args.models:
            mcfg = model_cfg(cfg, name, args.rounds, args.epochs)
            # as stage=train: a model config's own `threads` (the MLP's) wins
            model = registry.create(mcfg, base.spec, seed=0, threads=int(mcfg.get("threads") or 0) or threads)
            empty = big.take(np.arange(0))
            t0 = time.perf_counter()
            model.fit(big, empty)
            train_s = time.perf_counter() - t0
            rate = predict_rate(model, base, args.batch, args.repeats)
            budget = f"{args.rounds} rounds" if name != "mlp" else f"{args.epochs} epoch(s)"
            row = {"model": name, "features": args.features, "rows": n, "budget": budget,
                   "train_s": round(train_s, 2), "train_rows_per_s": round(n / train_s),
                   "predict_per_s": round(rate), "peak_rss_gb": round(peak_rss_gb(), 2)}
            results.append(row)
            print(json.dumps(row), flush=True)
            del model
            gc.collect()
        del big
        gc.collect()
    print()
    print(f"{'model':<8}{'rows':>10}  {'budget':<12}{'train s':>9}{'rows/s':>10}{'pred/s (512)':>14}{'peak GB':>9}")
    for r in results:
        print(f"{r['model']:<8}{r['rows']:>10}  {r['budget']:<12}{r['train_s']:>9.1f}{r['train_rows_per_s']:>10}"
              f"{r['predict_per_s']:>14}{r['peak_rss_gb']:>9.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
