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

import os
import re
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
import xgboost as xgb

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
    """What LightGBM and XGBoost share: objective handling, data layout, importance.

    Hyperparameters (conf/model/<name>.yaml): objective (regression | ranking),
    num_boost_round and early_stopping_rounds (with a validation part), rounds_without_val,
    params (the library's own parameters), and for ranking rank_levels, max_group, eval_at."""

    def __init__(self, spec: FeatureSpec, *, name: str = "", objective: str = "regression",
                 num_boost_round: int = 2000, early_stopping_rounds: int = 50, rounds_without_val: int = 200,
                 params: dict | None = None, rank_levels: int = 32, max_group: int = 1024,
                 eval_at: list[int] | tuple[int, ...] = (5,), seed: int = 0, threads: int = 0):
        if objective not in ("regression", "ranking"):
            raise ValueError(f"model {name or self.name}: objective={objective!r}; valid: regression, ranking")
        hyperparams = {"objective": objective, "num_boost_round": int(num_boost_round),
                       "early_stopping_rounds": int(early_stopping_rounds),
                       "rounds_without_val": int(rounds_without_val), "params": dict(params or {}),
                       "rank_levels": int(rank_levels), "max_group": int(max_group),
                       "eval_at": [int(k) for k in eval_at]}
        # Trees read the record-level columns only (for static features: the program-level
        # aggregate of the per-store rows), so the model's input is one row per record.
        super().__init__(FeatureSpec(spec.feature_set, list(spec.columns), [], spec.target_kind),
                         hyperparams=hyperparams, name=name, seed=seed, threads=threads)
        if not spec.columns:
            raise ValueError(f"model {self.name}: feature set {spec.feature_set!r} has no record-level column")
        self.ranking = objective == "ranking"
        self.calibrated = not self.ranking
        self.num_boost_round = hyperparams["num_boost_round"]
        self.early_stopping_rounds = hyperparams["early_stopping_rounds"]
        self.rounds_without_val = hyperparams["rounds_without_val"]
        self.library_params = hyperparams["params"]
        self.rank_levels = hyperparams["rank_levels"]
        self.max_group = hyperparams["max_group"]
        self.eval_at = hyperparams["eval_at"]
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
        g = grades(y, codes, self.rank_levels)
        order, sizes = rank_groups(codes, self.max_group, self.seed)
        return X[order], g[order], sizes

    def predict(self, table) -> np.ndarray:
        return self.predict_arrays(table.records, None, None)

    def native(self):
        return self.booster


class LGBMModel(_GBDT):
    name = "lgbm"
    library = "lightgbm"
    flavor = "lightgbm"

    def _train_params(self) -> dict:
        p = dict(self.library_params)
        p.update(seed=self.seed, num_threads=self.nthread, verbose=-1, deterministic=True)
        if self.ranking:
            p.update(objective="lambdarank", metric="ndcg", eval_at=list(self.eval_at),
                     label_gain=[float(2**i - 1) for i in range(self.rank_levels)])
        else:
            p.update(objective="regression", metric="rmse")
        return p

    def fit(self, train, val) -> dict:
        X, y, g = self._layout(train)
        dtrain = lgb.Dataset(X, y, group=g, feature_name=self.names, free_raw_data=True)
        curve: dict = {}
        callbacks = [lgb.record_evaluation(curve)]
        valid = []
        if len(val):
            Xv, yv, gv = self._layout(val)
            valid = [lgb.Dataset(Xv, yv, group=gv, reference=dtrain)]
            callbacks.append(lgb.early_stopping(self.early_stopping_rounds, verbose=False))
            rounds = self.num_boost_round
        else:
            rounds = self.rounds_without_val
        self.booster = lgb.train(self._train_params(), dtrain, num_boost_round=rounds, valid_sets=valid,
                                 valid_names=["val"][: len(valid)], callbacks=callbacks)
        best = self.booster.best_iteration or self.booster.current_iteration()
        self.info = {"best_iteration": int(best), "early_stopped": bool(len(val)),
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int = 0) -> None:
        """`rounds` more trees on `table` (continued boosting from the current booster)."""
        X, y, g = self._layout(table)
        p = self._train_params()
        # a small session table: leaves may hold fewer records than the configured minimum
        p["min_data_in_leaf"] = min(int(p.get("min_data_in_leaf", 20)), max(1, len(y) // 4))
        self.booster = lgb.train(p, lgb.Dataset(X, y, group=g, feature_name=self.names), num_boost_round=int(rounds),
                                 init_model=self.booster, keep_training_booster=True)

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
        m = cls._load_common(Path(folder))
        m.booster = lgb.Booster(model_file=str(Path(folder) / "model.lgb.txt"))
        return m


class XGBModel(_GBDT):
    name = "xgb"
    library = "xgboost"
    flavor = "xgboost"

    def _dmatrix(self, X, y=None, sizes=None):
        qid = None if sizes is None else np.repeat(np.arange(len(sizes)), sizes)
        return xgb.DMatrix(X, label=y, qid=qid, feature_names=self.names, nthread=self.nthread)

    def _train_params(self) -> dict:
        p = dict(self.library_params)
        p.update(seed=self.seed, nthread=self.nthread, verbosity=0)
        if self.ranking:
            p.update(objective="rank:ndcg", eval_metric=f"ndcg@{self.eval_at[0]}")
        else:
            p.update(objective="reg:squarederror", eval_metric="rmse")
        return p

    def fit(self, train, val) -> dict:
        X, y, g = self._layout(train)
        dtrain = self._dmatrix(X, y, g)
        curve: dict = {}
        if len(val):
            Xv, yv, gv = self._layout(val)
            evals = [(self._dmatrix(Xv, yv, gv), "val")]
            booster = xgb.train(self._train_params(), dtrain, num_boost_round=self.num_boost_round, evals=evals,
                                evals_result=curve, verbose_eval=False, early_stopping_rounds=self.early_stopping_rounds)
            best = int(booster.best_iteration) + 1
            booster = booster[:best]  # keep the best model, not the last one
        else:
            booster = xgb.train(self._train_params(), dtrain, num_boost_round=self.rounds_without_val)
            best = booster.num_boosted_rounds()
        self.booster = booster
        self.info = {"best_iteration": int(best), "early_stopped": bool(len(val)),
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int = 0) -> None:
        """`rounds` more trees on `table` (continued boosting from the current booster)."""
        X, y, g = self._layout(table)
        self.booster = xgb.train(self._train_params(), self._dmatrix(X, y, g), num_boost_round=int(rounds),
                                 xgb_model=self.booster)

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
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
        m = cls._load_common(Path(folder))
        m.booster = xgb.Booster(model_file=str(Path(folder) / "model.xgb.json"))
        return m
