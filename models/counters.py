"""Profiler counters predicted from static features, then latency from both.

Counters (Nsight Compute metrics on a GPU, CPU counters on a CPU) exist only after a kernel
has run, so a model that reads them cannot rank the unmeasured candidates MetaSchedule hands
a cost model. This one learns them instead: trained on `features=all`, it fits one LightGBM
regressor per counter (static aggregate columns -> sign(c)·log1p|c|), then a latency model
(a records-input GBDT config, `latency`) on the static columns and the predicted counters.
Its input is the static columns alone (`spec.feature_set == "static"`), so it tunes as any
static model does.

The latency model is fitted on counters predicted *across tasks*: the training tasks are cut
into `folds` groups and each record's counters come from the counter models fitted without
its task (cross-fitting), so the latency model learns how far predicted counters can be
trusted on a task they have not seen, not the near-perfect in-sample fit. Validation and
test records get the counter models fitted on every training record.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from models import registry
from models.base import CostModel, FeatureSpec
from models.gbdt import safe_names
from models.metrics import r2
from models.pyfunc_model import compress

STATIC, PROFILER, PREDICTED = "static.", "profiler.", "predicted."
COUNTER_FILE = "counters/{}.lgb.txt"
TREES = ("lightgbm", "xgboost")  # the latency model's libraries: trees on one row per record


def _profiled_r2(y: np.ndarray, p: np.ndarray) -> float:
    """R² of one counter over the records whose profile has it (a counter a record lacks is NaN)."""
    ok = np.isfinite(y) & np.isfinite(p)
    return r2(y[ok], p[ok])


class CounterModel(CostModel):
    """Hyperparameters (conf/model/counters.yaml): latency (the second stage's model config,
    a GBDT with input=records), folds, counter_rounds, counter_params (LightGBM's own)."""

    name = "counters"
    library = "counters"
    flavor = ""  # two stages of boosters: logged as the pyfunc only

    def __init__(self, spec: FeatureSpec, *, name: str = "", latency: dict | None = None, folds: int = 3,
                 counter_rounds: int = 60, counter_params: dict | None = None, seed: int = 0, threads: int = 0):
        who = f"model {name or self.name}"
        static = [c for c in spec.columns if c.startswith(STATIC)]
        counters = [c for c in spec.columns if c.startswith(PROFILER)]
        if not static or not counters:
            raise ValueError(f"{who} learns profiler counters from static features: it trains on features=all "
                             f"(feature set {spec.feature_set!r} has {len(static)} static and {len(counters)} "
                             f"profiler column(s))")
        if int(folds) < 2:
            raise ValueError(f"{who}: folds={folds}; valid: 2 or more (the training tasks are cut into folds)")
        latency = (OmegaConf.to_container(latency, resolve=True) if isinstance(latency, DictConfig)
                   else dict(latency or {}))
        if not latency:
            raise ValueError(f"{who}: latency is empty; name the second stage's model config (e.g. lgbm)")
        hyperparams = {"latency": latency, "folds": int(folds), "counter_rounds": int(counter_rounds),
                       "counter_params": dict(counter_params or {})}
        own = FeatureSpec("static", static, [], spec.target_kind)
        super().__init__(own, hyperparams=hyperparams, name=name, seed=seed, threads=threads)
        self.table_spec = spec
        self.counters = counters
        self.predicted = [PREDICTED + c[len(PROFILER):] for c in counters]
        self.latency = registry.create(latency, FeatureSpec("all", [*static, *self.predicted], [], spec.target_kind),
                                       seed=seed, threads=threads)
        if self.latency.library not in TREES or getattr(self.latency, "input", None) != "records":
            raise ValueError(f"{who}: latency={latency.get('name')!r} is not a GBDT on record rows (input=records); "
                             f"name one such as lgbm, lgbm_rank, xgb")
        self.boosters: list[lgb.Booster | None] = []

    @property
    def packages(self) -> tuple[str, ...]:
        """The libraries its logged model needs (pyfunc requirements): LightGBM for the counter
        regressors, the latency model's (a tree library, named as its package)."""
        return tuple(dict.fromkeys(("lightgbm", self.latency.library)))

    def _params(self) -> dict:
        # one thread: a counter's regressor sees a few hundred to a few thousand rows, where
        # LightGBM's threads cost more than they save
        return {"objective": "regression", "verbosity": -1, "seed": self.seed, "deterministic": True,
                "num_threads": 1, **self.hyperparams["counter_params"]}

    def _fit_counters(self, X: np.ndarray, Y: np.ndarray) -> list[lgb.Booster | None]:
        """One regressor per column of Y on the rows where it is known; X binned once for all."""
        data = lgb.Dataset(X, feature_name=safe_names(self.spec.columns), free_raw_data=False,
                           params={"verbosity": -1, **self._params()}).construct()
        out = []
        for y in Y.T:
            ok = np.isfinite(y)
            if ok.sum() < 2:
                out.append(None)
                continue
            data.set_label(np.where(ok, y, 0.0))
            data.set_weight(ok.astype(np.float64) if not ok.all() else None)
            out.append(lgb.train(self._params(), data, num_boost_round=self.hyperparams["counter_rounds"]))
        return out

    @staticmethod
    def _predict_counter(booster: lgb.Booster | None, X: np.ndarray) -> np.ndarray:
        return np.full(len(X), np.nan) if booster is None else np.asarray(booster.predict(X), np.float64)

    def _with_counters(self, table, counters: np.ndarray):
        """`table` with the predicted counters as the latency model's columns."""
        extra = pd.DataFrame(counters, columns=self.predicted, index=table.frame.index)
        return replace(table, frame=pd.concat([table.frame.drop(columns=self.predicted, errors="ignore"), extra],
                                              axis=1))

    def counters_of(self, records: np.ndarray) -> np.ndarray:
        """The predicted counters (sign·log1p) of records' static columns, one column each."""
        if not len(records):
            return np.zeros((0, len(self.counters)))
        return np.column_stack([self._predict_counter(b, records) for b in self.boosters])

    def fit(self, train, val) -> dict:
        X = train.frame[self.spec.columns].to_numpy(np.float32, na_value=np.nan)
        Y = compress(train.frame[self.counters].to_numpy(np.float64, na_value=np.nan))
        tasks, _ = pd.factorize(train.frame["task_id"], sort=True)
        n_tasks = int(tasks.max()) + 1 if len(tasks) else 0
        folds = min(self.hyperparams["folds"], n_tasks)
        if folds < 2:
            raise ValueError(f"model {self.name}: {n_tasks} training task(s); cross-fitting the counters needs 2 "
                             f"or more")
        fold = (np.random.default_rng(self.seed).permutation(n_tasks) % folds)[tasks]
        across = np.full(Y.shape, np.nan)
        for f in range(folds):
            out = fold == f
            fitted = self._fit_counters(X[~out], Y[~out])
            across[out] = np.column_stack([self._predict_counter(b, X[out]) for b in fitted])
        self.boosters = self._fit_counters(X, Y)
        Xv = val.frame[self.spec.columns].to_numpy(np.float32, na_value=np.nan) if len(val) else X[:0]
        Pv = self.counters_of(Xv)
        latency = self.latency.fit(self._with_counters(train, across), self._with_counters(val, Pv))
        Yv = compress(val.frame[self.counters].to_numpy(np.float64, na_value=np.nan)) if len(val) else Y[:0]
        quality = {c: {"r2_across_tasks": _profiled_r2(Y[:, j], across[:, j]),
                       "r2_val": _profiled_r2(Yv[:, j], Pv[:, j])} for j, c in enumerate(self.counters)}
        self.info = {**latency, "counters": quality, "folds": folds,
                     "counters_r2_across_tasks_median": float(np.nanmedian([q["r2_across_tasks"]
                                                                            for q in quality.values()]))}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int) -> None:
        """More rounds of the latency model on measured records (their counters predicted:
        records measured while tuning have no profile)."""
        X = table.frame[self.spec.columns].to_numpy(np.float32, na_value=np.nan)
        self.latency.continue_fit(self._with_counters(table, self.counters_of(X)), rounds=rounds, epochs=epochs)

    def predict(self, table) -> np.ndarray:
        return self.predict_arrays(table.frame[self.spec.columns].to_numpy(np.float32, na_value=np.nan), None, None)

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        both = np.hstack([records, self.counters_of(records)]).astype(np.float32)
        return self.latency.predict_arrays(both, None, None)

    @property
    def counter_files(self) -> list[str]:
        """Where `save` writes each counter's booster, under the model's folder."""
        return [COUNTER_FILE.format(j) for j in range(len(self.counters))]

    @property
    def calibrated(self) -> bool:
        return self.latency.calibrated

    def native(self):
        return None

    def importance(self) -> pd.Series | None:
        """The latency model's gain over the static columns and the predicted counters."""
        return self.latency.importance()

    def clone(self) -> "CounterModel":
        return type(self)(self.table_spec, name=self.name, seed=self.seed, threads=self.threads, **self.hyperparams)

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        self._save_common(folder)
        (folder / "counters").mkdir(parents=True, exist_ok=True)
        for f, b in zip(self.counter_files, self.boosters):
            if b is not None:
                b.save_model(str(folder / f))
        (folder / "counters.json").write_text(json.dumps(
            {"table_spec": json.loads(self.table_spec.to_json()), "fitted": [b is not None for b in self.boosters]},
            indent=2))
        self.latency.save(folder / "latency")

    @classmethod
    def load(cls, folder: Path) -> "CounterModel":
        folder = Path(folder)
        meta = json.loads((folder / "model.json").read_text())
        saved = json.loads((folder / "counters.json").read_text())
        m = cls(FeatureSpec.from_json(json.dumps(saved["table_spec"])), name=meta["name"], seed=meta["seed"],
                **meta["params"])
        m.boosters = [lgb.Booster(model_file=str(folder / f)) if fitted else None
                      for f, fitted in zip(m.counter_files, saved["fitted"])]
        m.latency = registry.load(folder / "latency")
        m.info = meta.get("info", {})
        return m
