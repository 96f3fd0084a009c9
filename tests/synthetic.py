"""Small synthetic tables with known answers, shared by the tests of metrics, splits, tables
and models: latencies per task, and records whose latency follows their stores' features."""

from __future__ import annotations

import numpy as np
import pandas as pd

from models.base import FeatureSpec
from models.tables import TrainingTable


def latency_frame(lat_by_task: dict, weights: dict, groups: dict) -> pd.DataFrame:
    rows = []
    for t, lats in lat_by_task.items():
        for i, lat in enumerate(lats):
            rows.append(dict(task_id=t, record_id=f"{t}{i}", mean_s=lat, weight=weights[t], group=groups[t]))
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    return df


def random_stores(seed: int, n_tasks: int, per_task: int, d: int, max_stores: int):
    """(task, record, store features) of random records with 1..max_stores stores each."""
    rng = np.random.default_rng(seed)
    for t in range(n_tasks):
        for i in range(per_task):
            yield rng, t, i, rng.normal(size=(int(rng.integers(1, max_stores + 1)), d)).astype(np.float32)


def training_table(df: pd.DataFrame, stores: list, spec: FeatureSpec, sets: dict) -> TrainingTable:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in stores])]).astype(np.int64)
    return TrainingTable("ws", df, spec, sets, np.concatenate(stores), offsets)


def small_table(seed=0, n_tasks=4, per_task=24, d=6) -> TrainingTable:
    """Records whose latency depends on their stores' first feature, so models can learn."""
    rows, stores = [], []
    for rng, t, i, s in random_stores(seed, n_tasks, per_task, d, 3):
        stores.append(s)
        lat = float(np.exp(0.5 * s[:, 0].sum() + 0.05 * rng.normal()))
        rows.append(dict(record_id=f"t{t}r{i}", task_id=f"t{t}", network="", group="all", weight=1, mean_s=lat,
                         **{f"static.f{j}": float(s[:, j].sum()) for j in range(d)},
                         **{"profiler.c": lat * 1e3}))
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    cols = [c for c in df.columns if c.startswith(("static.", "profiler."))]
    spec = FeatureSpec("all", cols, [f"s{j}" for j in range(d)])
    return training_table(df, stores, spec, {"static": cols[:d], "profiler": cols[d:]})


def additive_table(seed=0, n_tasks=6, per_task=40, d=5) -> TrainingTable:
    """Records whose label is a sum of per-store terms (what a pack-sum model assumes)."""
    rows, stores = [], []
    for _, t, i, s in random_stores(seed, n_tasks, per_task, d, 4):
        stores.append(s)
        rows.append(dict(record_id=f"t{t}r{i}", task_id=f"t{t}", network="", group="all", weight=1,
                         label=float(np.sum(np.where(s[:, 0] > 0, 0.3, 0.05) + 0.1 * np.tanh(s[:, 1])))))
    df = pd.DataFrame(rows)
    df["mean_s"] = 1.0 / df["label"].clip(lower=1e-3)
    return training_table(df, stores, FeatureSpec("static", [], [f"s{j}" for j in range(d)]), {"static": []})


def per_store_feature_table(seed=0, n_tasks=3, per_task=24) -> TrainingTable:
    """Records whose stores carry PerStoreFeature's 164 named values as it stores counts
    (log2(1 + x) of random counts), so that the roofline can read them; latency follows the
    bytes the first buffer touches."""
    from pipeline.core import schema as S

    names = list(S.PER_STORE_FEATURE_NAMES)
    rows, stores = [], []
    for rng, t, i, s in random_stores(seed, n_tasks, per_task, len(names), 3):
        s = np.log2(1.0 + np.exp2(np.abs(s) * 6.0)).astype(np.float32)
        stores.append(s)
        rows.append(dict(record_id=f"t{t}r{i}", task_id=f"t{t}", network="", group="all", weight=1,
                         mean_s=float(1e-6 * np.exp2(s[:, names.index("b0_lines")]).sum())))
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    return training_table(df, stores, FeatureSpec("static", [], names), {"static": []})
