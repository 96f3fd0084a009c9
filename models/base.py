"""The interface every cost model implements, and the feature contract saved with it.

A model is trained on a `TrainingTable` (one row per record, tabular feature columns and,
for static features, the per-store rows of each record) and predicts one score per record,
higher = predicted faster. `predict_frame` is the same prediction from a plain DataFrame
(what the MLflow pyfunc wrapper and the tune stage hand in): one row per record for
tabular models, one row per buffer store (with a `record_id` column) for store models.
"""

from __future__ import annotations

import json
import tempfile
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from models.pyfunc_model import frame_arrays


@dataclass
class FeatureSpec:
    """What a trained model expects as input; stored with the model (features.json)."""

    feature_set: str  # static | profiler | all
    columns: list[str] = field(default_factory=list)  # record-level columns, in model order
    store_columns: list[str] = field(default_factory=list)  # per-store columns (store models)
    target_kind: str = "cpu"  # cpu | cuda: which profiler the profiler columns come from

    @property
    def input(self) -> str:
        """`stores`: one input row per buffer store; `records`: one row per record."""
        return "stores" if self.store_columns else "records"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "input": self.input}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "FeatureSpec":
        d = json.loads(text)
        d.pop("input", None)
        return cls(**d)


def split_frame(df: pd.DataFrame, spec: FeatureSpec) -> tuple[list, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A pyfunc input frame -> (record ids in first-seen order, record matrix, store matrix, store offsets):
    the logged model's own reading of its input (models/pyfunc_model.py), so both agree."""
    return frame_arrays(df, spec.columns, spec.store_columns, f"the model (feature set {spec.feature_set!r})")


class CostModel(ABC):
    """A trainable cost model (see the module docstring).

    Subclasses take their hyperparameters as typed keyword arguments (what a
    conf/model/<name>.yaml config passes through `hydra.utils.instantiate`) and record them
    in `hyperparams`, which is saved with the model and given back to the constructor by
    `load` and `clone`."""

    name: str = ""
    #: the library the model is made with: lightgbm | xgboost | mlp | ms_xgb (MLflow param model.library)
    library: str = ""
    #: mlflow flavor module that logs `native()`: lightgbm | xgboost | pytorch
    flavor: str = ""
    #: True when scores estimate normalized throughput (regression), so RMSE/R² apply
    calibrated: bool = True

    def __init__(self, spec: FeatureSpec, *, hyperparams: dict, name: str = "", seed: int = 0, threads: int = 0):
        self.hyperparams = dict(hyperparams)
        self.spec = spec
        self.name = name or type(self).name
        self.seed = int(seed)
        self.threads = int(threads)
        self.info: dict = {}  # filled by fit: best iteration / epochs, curves

    @abstractmethod
    def fit(self, train, val) -> dict:
        """Train on `train` (a TrainingTable), early-stop on `val` (may be empty); returns info."""

    @abstractmethod
    def continue_fit(self, table, *, rounds: int, epochs: int) -> None:
        """Train the fitted model further on `table`, in place (online updates during tuning):
        `rounds` more boosting rounds for tree models, `epochs` more epochs for networks."""

    @abstractmethod
    def predict(self, table) -> np.ndarray:
        """One score per record of `table`, higher = faster."""

    @abstractmethod
    def predict_arrays(self, records: np.ndarray, stores: np.ndarray | None, offsets: np.ndarray | None) -> np.ndarray:
        """Scores from raw matrices (record rows; store rows with offsets for store models)."""

    def predict_frame(self, df: pd.DataFrame) -> pd.DataFrame:
        """Scores from a DataFrame (see the module docstring): columns record_id, score."""
        ids, records, stores, offsets = split_frame(df, self.spec)
        return pd.DataFrame({"record_id": ids, "score": self.predict_arrays(records, stores, offsets)})

    def clone(self) -> "CostModel":
        """An untrained model of the same class, hyperparameters and input columns."""
        return type(self)(self.spec, name=self.name, seed=self.seed, threads=self.threads, **self.hyperparams)

    def copy(self) -> "CostModel":
        """An independent copy of the trained model (through save and load: the library
        objects, e.g. TVM's, do not all survive a deepcopy)."""
        with tempfile.TemporaryDirectory() as tmp:
            self.save(Path(tmp) / "model")
            out = type(self).load(Path(tmp) / "model")
        out.threads = self.threads
        return out

    @abstractmethod
    def save(self, folder: Path) -> None:
        """Everything `load` needs, in `folder` (features.json included)."""

    @classmethod
    @abstractmethod
    def load(cls, folder: Path) -> "CostModel":
        ...

    @abstractmethod
    def native(self):
        """The library object the MLflow flavor logs (Booster, torch Module)."""

    def importance(self) -> pd.Series | None:
        """Feature importance by name (None where the model has none)."""
        return None

    def _save_common(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "features.json").write_text(self.spec.to_json())
        (folder / "model.json").write_text(json.dumps(
            {"name": self.name, "class": f"{type(self).__module__}.{type(self).__qualname__}",
             "params": self.hyperparams, "seed": self.seed, "info": _plain(self.info)}, indent=2, default=str))

    @classmethod
    def _load_common(cls, folder: Path) -> "CostModel":
        """An untrained instance from a saved folder's model.json and features.json."""
        meta = json.loads((folder / "model.json").read_text())
        spec = FeatureSpec.from_json((folder / "features.json").read_text())
        model = cls(spec, name=meta["name"], seed=meta["seed"], **meta["params"])
        model.info = meta.get("info", {})
        return model


def _plain(obj):
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
