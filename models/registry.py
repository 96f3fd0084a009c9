"""Model names -> classes and configs (conf/model/<name>.yaml), and loading saved models.

A model config names its `library` (lightgbm, xgboost, mlp, ms_xgb), which picks the class;
everything else in it is the model's parameters. `model=all` stands for the list
`train.models`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from models.base import CostModel, FeatureSpec

CONF = Path(__file__).resolve().parents[1] / "conf"

LIBRARIES = {
    "lightgbm": "models.gbdt:LGBMModel",
    "xgboost": "models.gbdt:XGBModel",
    "mlp": "models.mlp:MLPModel",
    "ms_xgb": "models.baseline:MSXGBModel",
}

ALL = "all"


class UnknownModelError(ValueError):
    pass


def model_names() -> list[str]:
    """Every model config in conf/model (except the `all` list)."""
    return sorted(p.stem for p in (CONF / "model").glob("*.yaml") if p.stem != ALL)


def model_config(name: str) -> DictConfig:
    path = CONF / "model" / f"{name}.yaml"
    if name == ALL or not path.exists():
        raise UnknownModelError(f"model={name!r} is not a model; valid: {', '.join(model_names())} "
                                f"(or model=all for the list train.models)")
    return OmegaConf.load(path)


def _cls(library: str):
    if library not in LIBRARIES:
        raise UnknownModelError(f"model library {library!r} is unknown; valid: {', '.join(LIBRARIES)}")
    module, name = LIBRARIES[library].split(":")
    return getattr(importlib.import_module(module), name)


def build(cfg: DictConfig | dict, spec: FeatureSpec, seed: int = 0, threads: int = 0) -> CostModel:
    """An untrained model from its config (a conf/model/<name>.yaml node)."""
    d = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    name = d.get("name")
    if not name or name == ALL:
        raise UnknownModelError(f"model config {d!r} has no model name")
    if "library" not in d:
        raise UnknownModelError(f"model={name}: its config lacks `library` ({', '.join(LIBRARIES)})")
    params = {k: v for k, v in d.items() if k not in ("name", "library")}
    model = _cls(d["library"])(params, spec, seed=seed, threads=threads)
    model.name = name
    return model


def load(folder: str | Path) -> CostModel:
    """A saved model (a folder written by `CostModel.save`, e.g. the pyfunc's artifact)."""
    folder = Path(folder)
    meta = json.loads((folder / "model.json").read_text())
    module, _, cls = meta["class"].rpartition(".")
    model = getattr(importlib.import_module(module), cls).load(folder)
    model.name = meta["name"]
    return model
