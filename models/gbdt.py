"""Gradient-boosted trees on the record-level columns: LightGBM and XGBoost.

Two objectives each:
  regression  squared error on normalized throughput (scores are calibrated)
  ranking     LambdaRank per task (LightGBM `lambdarank`, XGBoost `rank:ndcg`); labels become
              relevance grades 0..rank_levels-1 from each record's rank within its task (the
              best record gets the top grade); a task with more than `max_group` records is cut into random
              query groups of at most that size (LightGBM refuses very large queries)
Early stopping on the validation part when it has rows, else a fixed number of rounds.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from models.base import CostModel, FeatureSpec


def safe_names(columns: list[str]) -> list[str]:
    """Column names both libraries accept (no JSON/bracket characters), still readable."""
    out, seen = [], set()
    for c in columns:
        n = re.sub(r"[^0-9A-Za-z_.]", "_", c)
        while n in seen:
            n += "_"
        seen.add(n)
        out.append(n)
    return out


def rank_groups(task_codes: np.ndarray, max_group: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row order that makes each query group contiguous, and the group sizes."""
    rng = np.random.default_rng(seed)
    order, sizes = [], []
    for t in np.unique(task_codes):
        rows = np.flatnonzero(task_codes == t)
        rows = rows[rng.permutation(len(rows))]
        for i in range(0, len(rows), max_group):
            chunk = rows[i : i + max_group]
            order.append(chunk)
            sizes.append(len(chunk))
    return np.concatenate(order), np.asarray(sizes, dtype=np.int64)


def grades(labels: np.ndarray, task_codes: np.ndarray, levels: int) -> np.ndarray:
    """Relevance grades 0..levels-1 from each record's rank within its task (best = top grade).

    Ranks rather than raw throughput: throughputs of a task are usually skewed (a few fast
    records, a long slow tail), and raw grades would lump most records into grade 0."""
    s = pd.Series(np.asarray(labels, dtype=np.float64))
    pct = s.groupby(np.asarray(task_codes)).rank(method="min", pct=False)
    n = s.groupby(np.asarray(task_codes)).transform("size")
    frac = np.where(n > 1, (pct - 1) / (n - 1).clip(lower=1), 1.0)
    return np.clip(np.rint(frac * (levels - 1)), 0, levels - 1).astype(np.int32)


class _GBDT(CostModel):
    """What LightGBM and XGBoost share: objective handling, data layout, importance."""

    def __init__(self, params: dict, spec: FeatureSpec, seed: int = 0, threads: int = 0):
        # Trees read the record-level columns only (for static features: the program-level
        # aggregate of the per-store rows), so the model's input is one row per record.
        super().__init__(params, FeatureSpec(spec.feature_set, list(spec.columns), [], spec.target_kind), seed, threads)
        if not spec.columns:
            raise ValueError(f"model {self.name}: feature set {spec.feature_set!r} has no record-level column")
        self.ranking = str(params.get("objective", "regression")) == "ranking"
        self.calibrated = not self.ranking
        self.booster = None
        self.names = safe_names(spec.columns)

    @property
    def nthread(self) -> int:
        return self.threads or os.cpu_count() or 1

    def _layout(self, table):
        """(X, y, group sizes or None) in the row order the library needs."""
        X, y = table.records, table.labels
        if not self.ranking:
            return X, y, None
        codes = table.task_codes
        g = grades(y, codes, int(self.params.get("rank_levels", 32)))
        order, sizes = rank_groups(codes, int(self.params.get("max_group", 1024)), self.seed)
        return X[order], g[order], sizes

    def predict(self, table) -> np.ndarray:
        return self.predict_arrays(table.records, None, None)

    def native(self):
        return self.booster


class LGBMModel(_GBDT):
    name = "lgbm"
    flavor = "lightgbm"

    def fit(self, train, val) -> dict:
        import lightgbm as lgb

        p = dict(self.params.get("params", {}))
        p.update(seed=self.seed, num_threads=self.nthread, verbose=-1, deterministic=True)
        if self.ranking:
            p.update(objective="lambdarank", metric="ndcg", eval_at=list(self.params.get("eval_at", [5])),
                     label_gain=[float(2**i - 1) for i in range(int(self.params.get("rank_levels", 32)))])
        else:
            p.update(objective="regression", metric="rmse")
        X, y, g = self._layout(train)
        dtrain = lgb.Dataset(X, y, group=g, feature_name=self.names, free_raw_data=True)
        curve: dict = {}
        callbacks = [lgb.record_evaluation(curve)]
        valid = []
        if len(val):
            Xv, yv, gv = self._layout(val)
            valid = [lgb.Dataset(Xv, yv, group=gv, reference=dtrain)]
            callbacks.append(lgb.early_stopping(int(self.params.get("early_stopping_rounds", 50)), verbose=False))
            rounds = int(self.params.get("num_boost_round", 2000))
        else:
            rounds = int(self.params.get("rounds_without_val", 200))
        self.booster = lgb.train(p, dtrain, num_boost_round=rounds, valid_sets=valid, valid_names=["val"][: len(valid)],
                                 callbacks=callbacks)
        best = self.booster.best_iteration or self.booster.current_iteration()
        self.info = {"best_iteration": int(best), "early_stopped": bool(len(val)),
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        return np.asarray(self.booster.predict(records, num_threads=self.nthread), dtype=np.float64)

    def importance(self) -> pd.Series:
        gain = self.booster.feature_importance(importance_type="gain")
        return pd.Series(gain, index=self.spec.columns, dtype=float).sort_values(ascending=False)

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        self.booster.save_model(str(folder / "model.lgb.txt"))

    @classmethod
    def load(cls, folder: Path) -> "LGBMModel":
        import lightgbm as lgb

        meta, spec = cls._load_common(Path(folder))
        m = cls(meta["params"], spec, meta["seed"])
        m.name, m.info = meta["name"], meta.get("info", {})
        m.booster = lgb.Booster(model_file=str(Path(folder) / "model.lgb.txt"))
        return m


class XGBModel(_GBDT):
    name = "xgb"
    flavor = "xgboost"

    def _dmatrix(self, X, y=None, sizes=None):
        import xgboost as xgb

        qid = None if sizes is None else np.repeat(np.arange(len(sizes)), sizes)
        return xgb.DMatrix(X, label=y, qid=qid, feature_names=self.names, nthread=self.nthread)

    def fit(self, train, val) -> dict:
        import xgboost as xgb

        p = dict(self.params.get("params", {}))
        p.update(seed=self.seed, nthread=self.nthread, verbosity=0)
        if self.ranking:
            p.update(objective="rank:ndcg", eval_metric=f"ndcg@{int(self.params.get('eval_at', [5])[0])}")
        else:
            p.update(objective="reg:squarederror", eval_metric="rmse")
        X, y, g = self._layout(train)
        dtrain = self._dmatrix(X, y, g)
        curve: dict = {}
        if len(val):
            Xv, yv, gv = self._layout(val)
            evals = [(self._dmatrix(Xv, yv, gv), "val")]
            booster = xgb.train(p, dtrain, num_boost_round=int(self.params.get("num_boost_round", 2000)),
                                evals=evals, evals_result=curve, verbose_eval=False,
                                early_stopping_rounds=int(self.params.get("early_stopping_rounds", 50)))
            best = int(booster.best_iteration) + 1
            booster = booster[:best]  # keep the best model, not the last one
        else:
            booster = xgb.train(p, dtrain, num_boost_round=int(self.params.get("rounds_without_val", 200)))
            best = booster.num_boosted_rounds()
        self.booster = booster
        self.info = {"best_iteration": int(best), "early_stopped": bool(len(val)),
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        import xgboost as xgb

        return np.asarray(self.booster.inplace_predict(records) if records.shape[0] else np.zeros(0), dtype=np.float64)

    def importance(self) -> pd.Series:
        gain = self.booster.get_score(importance_type="total_gain")
        by_name = dict(zip(self.names, self.spec.columns))
        s = pd.Series({by_name[k]: v for k, v in gain.items()}, dtype=float)
        return s.reindex(self.spec.columns, fill_value=0.0).sort_values(ascending=False)

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        self.booster.save_model(str(folder / "model.xgb.json"))

    @classmethod
    def load(cls, folder: Path) -> "XGBModel":
        import xgboost as xgb

        meta, spec = cls._load_common(Path(folder))
        m = cls(meta["params"], spec, meta["seed"])
        m.name, m.info = meta["name"], meta.get("info", {})
        m.booster = xgb.Booster(model_file=str(Path(folder) / "model.xgb.json"))
        return m
