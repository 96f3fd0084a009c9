"""Making a cost model from its config, and restoring a saved one.

A model config (conf/model/<name>.yaml, composed by Hydra) names its class in `_target_`;
the other keys are the class's keyword arguments (its hyperparameters and `name`), and
`create` makes the model as every component is made (pipeline/core/components.py).
`model=all` composes every model config under its own key (`model.lgbm`, `model.xgb`, ...),
so a per-model override such as `model.lgbm.params.num_leaves=63` reaches the model that
`model=all` trains.

A saved model folder (written by `CostModel.save`) names its class in model.json; `load`
restores only the classes listed in SAVED_CLASSES.
"""

from __future__ import annotations

import json
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig

from models.base import CostModel, FeatureSpec
from pipeline.core import components

#: the `model=` option that stands for the models listed in `train.models`
ALL = "all"

#: the classes a saved model.json may name ("class"), so loading imports nothing else
SAVED_CLASSES = ("models.gbdt.LGBMModel", "models.gbdt.XGBModel", "models.mlp.MLPModel",
                 "models.baseline.MSXGBModel", "models.ensemble.EnsembleModel", "models.counters.CounterModel")


class UnknownModelError(ValueError):
    pass


def check(config: DictConfig | dict) -> None:
    """Refuse a model config that names no model class."""
    if "_target_" not in config:
        raise UnknownModelError(f"model config {config.get('name', '?')!r} has no `_target_` (the model class, e.g. "
                                f"models.gbdt.LGBMModel): it is not a model; pick one with model=<name>")


def create(config: DictConfig | dict, spec: FeatureSpec, *, seed: int = 0, threads: int = 0) -> CostModel:
    """An untrained model from its config (a conf/model/<name>.yaml node)."""
    check(config)
    return components.create(config, spec, seed=int(seed), threads=int(threads))


def load(folder: str | Path) -> CostModel:
    """A saved model (a folder written by `CostModel.save`, e.g. the pyfunc's artifact)."""
    folder = Path(folder)
    cls = json.loads((folder / "model.json").read_text())["class"]
    if cls not in SAVED_CLASSES:
        raise UnknownModelError(f"{folder / 'model.json'} names class {cls!r}, not a cost model of this project "
                                f"({', '.join(SAVED_CLASSES)})")
    return get_class(cls).load(folder)
