"""The reference row: MetaSchedule's own XGBModel, trained and queried through its own API.

It extracts its own features (PerStoreFeature) from the schedules, and learns through
`update(context, candidates, results)` exactly as during tuning: one call per training task
with that task's candidates and their measured run times. Its labels are its own
(min cost / cost per task, from the run times we hand it), its training its own (pack-sum
squared error, early stopping on its training RMSE). Two settings differ from tuning: no
random warm-up predictions (`num_warmup_samples=0`; the whole training set is known) and one
training, on all data, after the last task's update (XGBModel retrains from scratch each time,
so the retrains its adaptive schedule would run after earlier tasks change nothing but the
time).
Predictions come from `predict(context, candidates)` on the test records.

The features: XGBModel's extractor is PerStoreFeature with its defaults, which is what
stage=collect ran on the same traces (features/static.py) and stored as `static_stores`. So
the training and evaluation hand XGBModel those stored rows through an extractor that returns
them (`StoredFeatures`) instead of replaying every trace into a schedule and extracting them
again; XGBModel's own update/predict code runs unchanged (called on its Python object, as the
FFI dispatch would), and the model is saved with PerStoreFeature, as tuning uses it. Without
stored rows (a table of another feature set) it extracts them from the replayed schedules.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import tvm
import xgboost as xgb
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

from models.base import CostModel, FeatureSpec
from pipeline.core import database as D
from pipeline.core import schema as S
from pipeline.compute.progress import progress
from pipeline.shims.targets import make_target
from pipeline.shims.tvm_compat import preload_tensor_intrin
from pipeline.core.workspace import Workspace, read_table

log = logging.getLogger(__name__)

N_PER_STORE = 164  # PerStoreFeature's vector length with its default settings


class StoredFeatures:
    """A feature extractor that returns per-store rows already extracted (in candidate order)."""

    def __init__(self):
        self.pending: list[np.ndarray] = []

    def extract_from(self, context, candidates) -> list:
        out, self.pending = self.pending, []
        if len(out) != len(candidates):
            raise RuntimeError(f"{len(out)} stored feature rows for {len(candidates)} candidates")
        return [tvm.runtime.tensor(np.ascontiguousarray(x, dtype=np.float32)) for x in out]


def per_record(stores: np.ndarray, offsets: np.ndarray, rows) -> list[np.ndarray]:
    return [stores[offsets[i]:offsets[i + 1]] for i in rows]


class MSXGBModel(CostModel):
    """Hyperparameters (conf/model/ms_xgb.yaml): early_stopping_rounds (XGBModel's own)."""

    name = "ms_xgb"
    library = "ms_xgb"
    flavor = "xgboost"
    calibrated = True

    def __init__(self, spec: FeatureSpec, *, name: str = "", early_stopping_rounds: int = 50, seed: int = 0,
                 threads: int = 0):
        store_cols = spec.store_columns if len(spec.store_columns) == N_PER_STORE else \
            [f"ms.per_store.{i}" for i in range(N_PER_STORE)]
        super().__init__(FeatureSpec("static", [], store_cols, spec.target_kind),
                         hyperparams={"early_stopping_rounds": int(early_stopping_rounds)}, name=name, seed=seed,
                         threads=threads)
        self.early_stopping_rounds = int(early_stopping_rounds)
        self.ms_model = None
        self.ws: Workspace | None = None
        self._tasks = self._traces = self._workloads = None

    def bind(self, ws: Workspace) -> "MSXGBModel":
        """The workspace whose schedules (traces, workloads, targets) the records name."""
        self.ws = ws
        return self

    # -- MetaSchedule objects for records

    def _load_ws(self):
        if self._tasks is not None:
            return
        if self.ws is None:
            raise RuntimeError("ms_xgb needs the workspace: call bind(ws) before fit/predict")
        self._tasks = read_table(self.ws.tasks, S.TASKS).set_index("task_id")
        cands = read_table(self.ws.require(self.ws.candidates, "sample"), S.CANDIDATES)
        self._traces = cands.dropna(subset=["trace_json"]).drop_duplicates("record_id").set_index("record_id")["trace_json"]
        self._workloads = D.read_workload_lines(self.ws)

    def _stored(self, table) -> bool:
        return table.stores is not None and len(table.spec.store_columns) == N_PER_STORE

    def _placeholders(self, task_id: str, n: int):
        """(context, candidates) whose only use is their task and count: the features come stored."""
        task = self._tasks.loc[task_id]
        mod = ms.database.Workload.from_json(self._workloads[int(task["workload_index"])]).mod
        return SimpleNamespace(mod=mod), [None] * n

    def _context_and_candidates(self, task_id: str, record_ids: list[str]):
        preload_tensor_intrin()  # what TuneContext imports, the fast way (seconds, not minutes)
        task = self._tasks.loc[task_id]
        workload = ms.database.Workload.from_json(self._workloads[int(task["workload_index"])])
        target = make_target(json.loads(task["target"]))
        args_info = ms.arg_info.ArgInfo.from_prim_func(workload.mod["main"])
        ctx = ms.TuneContext(mod=workload.mod, target=target, task_name=str(task["name"]),
                             num_threads=self.threads or os.cpu_count() or 1, rand_state=self.seed)
        cands = []
        for rid in record_ids:
            trace = ms.database.TuningRecord.from_json([json.loads(self._traces[rid]), None, None, None], workload).trace
            rec = ms.database.TuningRecord(trace, workload, None, target, args_info)
            cands.append(rec.as_measure_candidate())
        return ctx, cands

    # -- training and prediction through MetaSchedule's API

    def fit(self, train, val) -> dict:
        self._load_ws()
        threads = self.threads or os.cpu_count() or 1
        self.ms_model = ms.cost_model.XGBModel(
            extractor=ms.feature_extractor.PerStoreFeature(),
            config=XGBConfig(seed=self.seed, nthread=threads),
            num_warmup_samples=0,
            early_stopping_rounds=self.early_stopping_rounds,
            adaptive_training=True,
        )
        stored = self._stored(train)
        model = self.ms_model._inst  # XGBModel's Python object: its own update, with stored features
        if stored:
            model.extractor = StoredFeatures()
        frame = train.frame.reset_index(drop=True)
        groups = list(frame.groupby("task_id", sort=True))
        # adaptive training skips a retrain until the data grew by a fifth since the last one:
        # a last size beyond reach defers the one training to the final update
        model.last_train_size = 1 << 62
        for i, (tid, g) in enumerate(progress(groups, desc="ms_xgb update", unit="task", leave=False)):
            if stored:
                ctx, cands = self._placeholders(tid, len(g))
                model.extractor.pending = per_record(train.stores, train.offsets, g.index)
            else:
                ctx, cands = self._context_and_candidates(tid, g["record_id"].tolist())
            results = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in g["mean_s"]]
            if i == len(groups) - 1:
                model.adaptive_training = False  # the last update trains on everything
            model.update(ctx, cands, results)
        model.extractor = ms.feature_extractor.PerStoreFeature()  # what tuning hands it: schedules
        self.info = {"tasks": len(groups), "data_size": int(self.ms_model.data_size),
                     "boosted_rounds": int(self.ms_model.booster.num_boosted_rounds()) if self.ms_model.booster else 0}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int) -> None:
        raise NotImplementedError(
            f"model {self.name} (MetaSchedule's XGBModel) learns only through its own update(context, candidates, "
            f"results), from schedules: it cannot continue on a feature table")

    def predict(self, table) -> np.ndarray:
        if self.ws is None and self._stored(table):
            # no workspace to name the schedules (a loaded model scoring a tuning session's
            # stored rows): the pack-sum of the booster over the rows, what XGBModel computes
            return self.predict_arrays(None, table.stores, table.offsets)
        self._load_ws()
        out = np.zeros(len(table), dtype=np.float64)
        frame = table.frame.reset_index(drop=True)
        model = self.ms_model._inst
        if not self._stored(table):
            for tid, g in frame.groupby("task_id", sort=True):
                ctx, cands = self._context_and_candidates(tid, g["record_id"].tolist())
                out[g.index.to_numpy()] = self.ms_model.predict(ctx, cands)
            return out
        model.extractor = StoredFeatures()
        try:
            for tid, g in frame.groupby("task_id", sort=True):
                # A record without store rows scores 0, the sum over none of its stores: XGBModel's
                # pack-sum fails on a batch holding one (its record ids come out as floats).
                rows = per_record(table.stores, table.offsets, g.index)
                some = np.array([len(x) > 0 for x in rows])
                if not some.any():
                    continue
                ctx, cands = self._placeholders(tid, int(some.sum()))
                model.extractor.pending = [x for x, keep in zip(rows, some) if keep]
                out[g.index.to_numpy()[some]] = model.predict(ctx, cands)
        finally:
            model.extractor = ms.feature_extractor.PerStoreFeature()
        return out

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        """Pack-sum prediction from PerStoreFeature rows: booster score per store, summed per record."""
        if stores is None:
            raise ValueError("ms_xgb reads per-store rows (PerStoreFeature): pass stores and offsets")
        per_store = self.ms_model.booster.predict(xgb.DMatrix(stores.astype(np.float32)))
        ids = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        return np.bincount(ids, weights=per_store, minlength=len(offsets) - 1).astype(np.float64)

    def native(self):
        return self.ms_model.booster

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        self.ms_model.booster.save_model(str(folder / "model.xgb.json"))
        self.ms_model.save(str(folder / "ms_xgb_model.tar"))  # MetaSchedule's own format (+ its data)

    @classmethod
    def load(cls, folder: Path) -> "MSXGBModel":
        folder = Path(folder)
        m = cls._load_common(folder)
        m.ms_model = ms.cost_model.XGBModel(num_warmup_samples=0)
        m.ms_model.load(str(folder / "ms_xgb_model.tar"))
        return m
