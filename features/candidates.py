"""A model's inputs for candidates that have not run: the columns it was trained on, rebuilt
from MetaSchedule's PerStoreFeature rows of each candidate (the extractor stage=collect runs on
the dataset's traces), so that a cost model inside the search sees what it saw in training.

`feature_plan(spec)` checks once that every input column can be computed from a schedule
alone (static aggregates `static.<agg>.<feature>`, `static.n_stores`, per-store rows, the
task's context) and says how; `model_inputs` applies it to a batch. A model trained on
profiler counters is refused (FeatureMismatchError): counters exist only after a kernel ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from features import static
from features.task_context import COLUMNS as TASK_COLUMNS
from pipeline.core import schema as S

log = logging.getLogger(__name__)

STATIC = "static."

N_STORES = "n_stores"


class FeatureMismatchError(ValueError):
    """The model needs inputs that MetaSchedule cannot give for an unmeasured candidate."""


@dataclass(frozen=True)
class FeaturePlan:
    """How to rebuild a model's input columns from PerStoreFeature rows.

    record_kind[i]: 0 = aggregate (its `<agg>.<feature>` name in features.static.aggregate's
    output: aggregate_keys, in the order of these columns), 1 = n_stores, 2 = not computable
    without a build (NaN), 3 = the task's context (features.task_context, from the workload).
    store_index: position in the 164-vector of each store column."""

    columns: tuple[str, ...]
    record_kind: np.ndarray
    aggregate_keys: tuple[str, ...]
    store_columns: tuple[str, ...]
    store_index: np.ndarray
    needs_build: tuple[str, ...] = ()


def feature_plan(spec, source: str = "the model") -> FeaturePlan:
    """Check that every input of `spec` (a models.base.FeatureSpec: feature_set, columns,
    store_columns) can be computed from a schedule alone; say how.

    Raises FeatureMismatchError naming the offending columns otherwise."""
    names = {n: i for i, n in enumerate(S.PER_STORE_FEATURE_NAMES)}
    aggs = {a: i for i, a in enumerate(S.STATIC_AGGREGATES)}
    not_static = [c for c in spec.columns if not c.startswith(STATIC) and c not in TASK_COLUMNS]
    if spec.feature_set != "static" or not_static:
        raise FeatureMismatchError(
            f"{source} was trained on features={spec.feature_set!r}"
            + (f" ({len(not_static)} non-static column(s), e.g. {not_static[:3]})" if not_static else "")
            + ". Profiler counters exist only after a kernel has run, so MetaSchedule cannot supply them "
            "for the unmeasured candidates it asks a cost model to rank. Use a model trained on static "
            "features: the registered alias `best-static` (models:/<workspace>-cost-model@best-static), or "
            "train one with `python -m pipeline stage=train features=static`.")
    kind, keys, build = [], [], []
    for c in spec.columns:
        rest = c[len(STATIC):]
        a, _, f = rest.partition(".")
        if c in TASK_COLUMNS:
            kind.append(3)
        elif rest == N_STORES:
            kind.append(1)
        elif a in aggs and f in names:
            kind.append(0)
            keys.append(rest)
        elif a == "cuda":
            # Build-time resources (ptxas): known only after compiling the candidate.
            kind.append(2)
            build.append(c)
        else:
            raise FeatureMismatchError(f"{source}: column {c!r} is not a PerStoreFeature aggregate "
                                       f"(<{'|'.join(S.STATIC_AGGREGATES)}>.<feature>) nor {STATIC}{N_STORES}")
    bad = [c for c in spec.store_columns if c not in names]
    if bad:
        raise FeatureMismatchError(f"{source}: per-store column(s) {bad[:5]} are not PerStoreFeature values "
                                   f"(pipeline/core/schema.py PER_STORE_FEATURE_NAMES)")
    if build:
        log.warning("%s uses %d build-time column(s) (%s...): unknown before a candidate is compiled, given "
                    "as missing values; train with features.exclude='[^cuda\\.]' to avoid them",
                    source, len(build), build[0])
    return FeaturePlan(tuple(spec.columns), np.asarray(kind, np.int8), tuple(keys), tuple(spec.store_columns),
                       np.asarray([names[c] for c in spec.store_columns], np.int64), tuple(build))


def pack(per_store: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-candidate [n_i, 164] matrices -> (all store rows, offsets [n+1])."""
    counts = np.asarray([len(x) for x in per_store], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    width = len(S.PER_STORE_FEATURE_NAMES)
    rows = [np.asarray(x, np.float32).reshape(-1, width) for x in per_store if len(x)]
    stores = np.concatenate(rows) if rows else np.zeros((0, width), np.float32)
    return stores, offsets


def aggregate_rows(stores: np.ndarray, offsets: np.ndarray, keys: tuple[str, ...]) -> np.ndarray:
    """[n, len(keys)] float64: the program-level values `keys` (`<agg>.<feature>`) of each
    candidate's stores, as stage=collect computes them (features.static.aggregate); NaN for a
    candidate without stores."""
    out = np.full((len(offsets) - 1, len(keys)), np.nan)
    for i in range(len(offsets) - 1 if keys else 0):
        values = static.aggregate(stores[offsets[i]:offsets[i + 1]])
        if values:
            out[i] = [values[k] for k in keys]
    return out


def model_inputs(per_store: list[np.ndarray], plan: FeaturePlan, task: dict | list[dict] | None = None):
    """(record matrix float32, store rows in the model's column order, offsets) for candidates;
    `task`: the context of their task (features.task_context.of_mod), or one per candidate."""
    stores, offsets = pack(per_store)
    n = len(per_store)
    records = np.full((n, len(plan.columns)), np.nan, np.float32)
    if len(plan.columns):
        k = plan.record_kind
        records[:, np.flatnonzero(k == 0)] = aggregate_rows(stores, offsets, plan.aggregate_keys).astype(np.float32)
        records[:, np.flatnonzero(k == 1)] = np.diff(offsets)[:, None].astype(np.float32)
        cols = np.flatnonzero(k == 3)
        if len(cols) and task is not None:
            rows = [task] * n if isinstance(task, dict) else task
            records[:, cols] = np.asarray([[r.get(plan.columns[c], np.nan) for c in cols] for r in rows], np.float32)
    if plan.store_columns:
        return records, stores[:, plan.store_index], offsets
    return records, None, None
