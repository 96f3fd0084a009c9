"""The `python_function` loader shipped inside every logged cost model.

MLflow copies this file into each logged model (`code/pyfunc_model.py`, MLflow's
`code_paths`) and imports it when the model is loaded (`loader_module` of the pyfunc
flavor), so it imports nothing from this project: a model loads wherever its own
requirements (`requirements.txt`: mlflow, numpy, pandas and the model's library) are
installed. The trained model itself is the model's native flavor (lightgbm, xgboost or
pytorch, in the same MLflow model), loaded through that flavor; an ensemble or a counter
model (counters predicted from static features, then latency), which have no single
library object, read their boosters from the model's data folder.

Input: the workspace's feature tables as stored, under their Parquet column names
(`input.json`, also in the model's metadata and signature, lists them):
  records  one row per record: `features/static` for static aggregates, joined on record_id
           with the profiler table (`features/cpu/device=<d>` or `features/ncu/device=<d>`)
           for models that read counters
  stores   one row per buffer store: `features/static_stores` (record_id + the 164
           PerStoreFeature columns); a store model that also reads counters takes them
           repeated on every store row of the record
A model with `task_context` also reads the task's `task.*` columns (features/task_context.py
of the workload) on every row; one with a `roofline` in input.json computes each store's
roofline bound with the shipped `roofline.py` (numpy only), and with a `roofline_base` starts
each record's score from it.
Columns the model does not read (task_id, error, other features) may be present.
Output: record_id and score (higher = predicted faster), one row per record in the order
records first appear; the score is NaN for a record that has an `error` or no feature value.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd

CONTRACT = "input.json"
KEY = "record_id"
#: a booster as the project's own save writes it (an ensemble's members, under data/)
BOOSTER_FILES = {"lightgbm": "model.lgb.txt", "xgboost": "model.xgb.json"}


def frame_arrays(df: pd.DataFrame, columns: list[str], store_columns: list[str], what: str = "the model"):
    """An input frame -> (record ids in first-seen order, record matrix, store matrix, store offsets).

    Store matrix and offsets are None without store columns; then every row is a record.
    Missing columns are an error naming them, so a caller with the wrong table learns it
    at once instead of getting silent garbage."""
    need = [KEY, *columns, *store_columns] if store_columns else list(columns)
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise KeyError(f"input frame lacks {len(missing)} feature column(s) {what} was trained on, e.g. "
                       f"{missing[:5]}")
    if not store_columns:
        ids = df[KEY].tolist() if KEY in df.columns else list(range(len(df)))
        return ids, df[columns].to_numpy(dtype=np.float32, na_value=np.nan), None, None
    codes, uniques = pd.factorize(df[KEY], sort=False)
    order = np.argsort(codes, kind="stable")
    stores = df[store_columns].to_numpy(dtype=np.float32, na_value=np.nan)[order]
    counts = np.bincount(codes, minlength=len(uniques))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    first = np.searchsorted(codes[order], np.arange(len(uniques)))
    records = df[columns].to_numpy(dtype=np.float32, na_value=np.nan)[order][first] if columns \
        else np.zeros((len(uniques), 0), np.float32)
    return list(uniques), records, stores, offsets


def compress(x: np.ndarray) -> np.ndarray:
    """sign(x)·log1p|x|: counts and sizes spanning decades on one scale (the MLP's inputs, the
    counter model's targets)."""
    return np.sign(x) * np.log1p(np.abs(x))


def standardize(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """compress(x), then (z - mean) / std; NaN -> 0 (the mean): the MLP's input scaling."""
    z = compress(x.astype(np.float64))
    return np.nan_to_num((z - mean) / std, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)


class CostModelPredictor:
    """A loaded cost model: `predict(frame) -> DataFrame(record_id, score)` (module docstring)."""

    def __init__(self, native, contract: dict):
        self.native = native
        self.contract = contract
        self.columns = list(contract["columns"])
        self.store_columns = list(contract["store_columns"])
        self.kind = contract["predictor"]

    def predict(self, model_input, params=None) -> pd.DataFrame:
        df = pd.DataFrame(model_input)
        ids, records, stores, offsets = frame_arrays(
            df, self.columns, self.store_columns,
            f"model {self.contract['model']!r} (feature set {self.contract['feature_set']!r})")
        scores = self.scores(records, stores, offsets)
        if not self.store_columns:
            empty = np.isnan(records).all(axis=1) if records.shape[1] else np.zeros(len(records), bool)
            if "error" in df.columns:
                empty |= df["error"].notna().to_numpy()
            scores = np.where(empty, np.nan, scores)
        return pd.DataFrame({KEY: ids, "score": scores})

    def scores(self, records: np.ndarray, stores: np.ndarray | None, offsets: np.ndarray | None) -> np.ndarray:
        if len(records) == 0:
            return np.zeros(0, np.float64)
        if self.kind == "trees":
            return self._rows(records)
        if self.kind == "pack_sum":  # one score per store (with its record's columns beside it), summed per record
            ids = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
            base = 0.0
            if self.contract.get("roofline"):
                roofline = importlib.import_module("roofline")  # shipped beside this file
                peaks = roofline.Peaks(**self.contract["roofline"])
                bounds = roofline.store_bounds(stores, peaks, self.store_columns)
                if self.contract.get("roofline_base"):
                    total = roofline.record_bound_ns(stores, offsets, peaks, self.store_columns)
                    base = -float(self.contract["roofline_base"]) * np.log2(1.0 + total)
                stores = np.hstack([stores, bounds])
            rows = np.hstack([stores, records[ids]]).astype(np.float32) if records.shape[1] else stores
            return np.bincount(ids, weights=self._rows(rows), minlength=len(offsets) - 1) + base
        if self.kind == "mlp":
            return self._mlp(records, stores, offsets)
        raise ValueError(f"{CONTRACT}: unknown predictor {self.kind!r}")

    def _rows(self, x: np.ndarray) -> np.ndarray:
        booster = self.native
        out = booster.inplace_predict(x) if hasattr(booster, "inplace_predict") else booster.predict(x)
        return np.asarray(out, np.float64)

    def _mlp(self, records, stores, offsets) -> np.ndarray:
        # torch only for an MLP: the environment of a tree model has no torch
        import torch

        scale = self.contract["scalers"]
        r = records
        if r.shape[1]:
            r = standardize(r, np.asarray(scale["records"]["mean"]), np.asarray(scale["records"]["std"]))
        args = [torch.from_numpy(np.ascontiguousarray(r, dtype=np.float32))]
        if stores is not None:
            s = standardize(stores, np.asarray(scale["stores"]["mean"]), np.asarray(scale["stores"]["std"]))
            segments = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)).astype(np.int64)
            args += [torch.from_numpy(s), torch.from_numpy(segments)]
        with torch.no_grad():
            return self.native(*args).numpy().astype(np.float64)


class EnsemblePredictor(CostModelPredictor):
    """An ensemble: the weighted mean of its members' scores, each standardized with the
    mean and deviation of its scores on the training part (`members` of the contract)."""

    def __init__(self, members: dict[str, CostModelPredictor], contract: dict):
        super().__init__(None, contract)
        self.members = members

    def scores(self, records, stores, offsets) -> np.ndarray:
        z = {}
        for k, m in self.members.items():
            mine = records[:, [self.columns.index(c) for c in m.columns]]
            idx = [self.store_columns.index(c) for c in m.store_columns]
            s = m.scores(mine, stores[:, idx] if idx else None, offsets if idx else None)
            mean, std = self.contract["members"][k]["scale"]
            z[k] = (s - mean) / std
        out = self._mean(z, "weight")
        marks = self.contract.get("convolution_columns")
        if marks and len(records):  # records of convolution tasks: the members' convolution weights
            conv = np.logical_and.reduce([records[:, self.columns.index(c)] > 0.5 for c in marks])
            out = np.where(conv, self._mean(z, "convolution_weight"), out)
        return out

    def _mean(self, z: dict, key: str) -> np.ndarray:
        weights = {k: float(self.contract["members"][k][key]) for k in z}
        return sum(weights[k] * v for k, v in z.items()) / sum(weights.values())


class CounterPredictor(CostModelPredictor):
    """Counters predicted from the static columns (one LightGBM booster each), then latency
    from both by the latency model's booster (models/counters.py)."""

    def __init__(self, counters: list, latency: CostModelPredictor, contract: dict):
        super().__init__(None, contract)
        self.counters = counters
        self.latency = latency

    def scores(self, records, stores, offsets) -> np.ndarray:
        if len(records) == 0:
            return np.zeros(0, np.float64)
        predicted = [np.full(len(records), np.nan) if b is None else np.asarray(b.predict(records), np.float64)
                     for b in self.counters]
        return self.latency.scores(np.hstack([records, np.column_stack(predicted)]).astype(np.float32), None, None)


def load_booster(library: str, path: Path):
    """A booster saved by the project's own save, read with its library alone."""
    if library == "lightgbm":
        import lightgbm  # the member's own library only

        return lightgbm.Booster(model_file=str(path))
    import xgboost  # the member's own library only

    return xgboost.Booster(model_file=str(path))


def load(model_root: str | Path, contract: dict, data: str | Path | None = None) -> CostModelPredictor:
    """The predictor of the MLflow model folder `model_root` (its native flavor + `contract`;
    an ensemble's members from their boosters under `data`, the pyfunc's data folder)."""
    if contract["predictor"] == "ensemble":
        members = {k: CostModelPredictor(load_booster(c["library"], Path(data) / c["file"]), c)
                   for k, c in contract["members"].items()}
        return EnsemblePredictor(members, contract)
    if contract["predictor"] == "counters":
        counters = [None if f is None else load_booster("lightgbm", Path(data) / f) for f in contract["counter_files"]]
        latency = contract["latency"]
        booster = load_booster(latency["library"], Path(data) / latency["file"])
        return CounterPredictor(counters, CostModelPredictor(booster, latency), contract)
    flavor = importlib.import_module(f"mlflow.{contract['flavor']}")  # the model's own library only
    return CostModelPredictor(flavor.load_model(str(model_root)), contract)


def _load_pyfunc(data_path: str, model_config=None) -> CostModelPredictor:
    """MLflow's entry point: `data_path` is the flavor's data folder, `data/<name>` in the model."""
    data = Path(data_path)
    return load(data.parents[1], json.loads((data / CONTRACT).read_text()), data)
