"""An ensemble of cost models: the weighted mean of its members' standardized scores.

Members are model configs (conf/model/<name>.yaml nodes, composed under `members`); each is
trained on the same table. Scores of different members live on different scales (regression
on normalized throughput, LambdaRank scores), so each member's score is standardized with the
mean and standard deviation of its predictions on the training part, fixed at fit time and
saved with the model: a candidate's score never depends on the other candidates scored with
it. The ensemble's input is the union of its members' inputs (record columns and, when a
member reads them, per-store rows).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from models import registry
from models.base import CostModel, FeatureSpec


class EnsembleModel(CostModel):
    """Hyperparameters (conf/model/<name>.yaml): members (name -> model config), weights
    (name -> weight, default 1 each)."""

    name = "ensemble"
    library = "ensemble"
    flavor = ""  # no single library object: logged as the pyfunc only
    calibrated = False

    def __init__(self, spec: FeatureSpec, *, name: str = "", members: dict | None = None,
                 weights: dict | None = None, seed: int = 0, threads: int = 0):
        members = {str(k): OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else dict(v)
                   for k, v in (members or {}).items()}
        if not members:
            raise ValueError(f"model {name or self.name}: members is empty; name at least one model config")
        weights = {k: float((weights or {}).get(k, 1.0)) for k in members}
        parts = {k: registry.create(cfg, spec, seed=seed, threads=threads) for k, cfg in members.items()}
        own = _union(spec, [m.spec for m in parts.values()])
        super().__init__(own, hyperparams={"members": members, "weights": weights}, name=name, seed=seed,
                         threads=threads)
        self.members = parts
        self.weights = weights
        self.scale: dict[str, tuple[float, float]] = {}

    def fit(self, train, val) -> dict:
        info = {}
        for k, m in self.members.items():
            info[k] = m.fit(train, val)
            s = m.predict(train)
            self.scale[k] = (float(np.mean(s)), float(np.std(s)) or 1.0)
        self.info = {"members": info, "scale": self.scale}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int) -> None:
        for m in self.members.values():
            m.continue_fit(table, rounds=rounds, epochs=epochs)

    def combine(self, scores: dict[str, np.ndarray]) -> np.ndarray:
        """The ensemble's score from its members' (`member_scores`)."""
        total = sum(self.weights.values())
        return sum(self.weights[k] * (s - self.scale[k][0]) / self.scale[k][1] for k, s in scores.items()) / total

    def member_scores(self, table) -> dict[str, np.ndarray]:
        """Each member's own score of the table's records."""
        return {k: m.predict(table) for k, m in self.members.items()}

    def predict(self, table) -> np.ndarray:
        return self.combine(self.member_scores(table))

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        out = {}
        for k, m in self.members.items():
            cols = [self.spec.columns.index(c) for c in m.spec.columns]
            mine = records[:, cols] if cols else np.zeros((records.shape[0], 0), np.float32)
            idx = [self.spec.store_columns.index(c) for c in m.spec.store_columns]
            out[k] = m.predict_arrays(mine, stores[:, idx] if idx else None, offsets if idx else None)
        return self.combine(out)

    def native(self):
        return None

    def importance(self):
        return None

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        for k, m in self.members.items():
            m.save(folder / "members" / k)
        (folder / "ensemble.json").write_text(json.dumps({"scale": self.scale}, indent=2))

    @classmethod
    def load(cls, folder: Path) -> "EnsembleModel":
        folder = Path(folder)
        meta = json.loads((folder / "model.json").read_text())
        spec = FeatureSpec.from_json((folder / "features.json").read_text())
        m = cls.__new__(cls)
        CostModel.__init__(m, spec, hyperparams=meta["params"], name=meta["name"], seed=meta["seed"])
        m.members = {k: registry.load(folder / "members" / k) for k in meta["params"]["members"]}
        m.weights = meta["params"]["weights"]
        m.scale = {k: tuple(v) for k, v in json.loads((folder / "ensemble.json").read_text())["scale"].items()}
        m.info = meta.get("info", {})
        return m


def _union(spec: FeatureSpec, specs: list[FeatureSpec]) -> FeatureSpec:
    """The columns any member reads: the table's in its order, then those a member adds to
    them (the task's context columns), so that MetaSchedule's candidates get them too."""
    read = {c for s in specs for c in s.columns}
    stores = {c for s in specs for c in s.store_columns}
    cols = dict.fromkeys([c for c in spec.columns if c in read] + [c for s in specs for c in s.columns])
    return FeatureSpec(spec.feature_set, list(cols), [c for c in spec.store_columns if c in stores], spec.target_kind)
