"""An ensemble of cost models: the weighted mean of its members' standardized scores.

Members are model configs (conf/model/<name>.yaml nodes, composed under `members`); each is
trained on the same table. Scores of different members live on different scales (regression
on normalized throughput, LambdaRank scores), so each member's score is standardized with the
mean and standard deviation of its predictions on the training part, fixed at fit time and
saved with the model: a candidate's score never depends on the other candidates scored with
it. The ensemble's input is the union of its members' inputs (record columns and, when a
member reads them, per-store rows).

`convolution_weights` gives the members other weights on the records of tasks that sum over a
window of their input (convolutions and average pools, by the task's context: `task.window`
and `task.reduce_sum`, read from the workload's TIR, so the same in a dataset and in tuning):
members that order such tasks worse than others can be left out there alone.

A member may be MetaSchedule's own XGBModel (`ms_xgb`, trained by its own `update` on the
same records): it reads the workspace (`bind`) to train, and scores per-store rows as every
pack-sum member does, so the ensemble tunes as any of them; it cannot be refit on a tuning
session's records without its workspace (`tune.costmodel` union mode).

`copies` trains a member several times, each copy with its own seed (`seed + 1000 * j`; the
first copy is the member trained with the ensemble's own seed) and a share of the member's
weight: a member whose training draws from its seed (LightGBM's row and feature bagging, the
ranker's groups) is then the mean of a few draws instead of one, and its first pick of a task
depends less on one draw. A member that draws nothing from its seed (`xgb_ps`) gains nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from models import registry
from models.base import CostModel, FeatureSpec

CONVOLUTION_COLUMNS = ("task.window", "task.reduce_sum")  # a sum over a window of an input
COPY_SEED_STEP = 1000  # copy j of a member trains with seed + COPY_SEED_STEP * j


class EnsembleModel(CostModel):
    """Hyperparameters (conf/model/<name>.yaml): members (name -> model config), weights
    (name -> weight, default 1 each), convolution_weights (name -> weight on the records of
    convolution tasks, default 0 each; none: `weights` everywhere), copies (name -> how many
    times the member is trained, each with its own seed, default 1)."""

    name = "ensemble"
    library = "ensemble"
    flavor = ""  # no single library object: logged as the pyfunc only
    calibrated = False

    def __init__(self, spec: FeatureSpec, *, name: str = "", members: dict | None = None,
                 weights: dict | None = None, convolution_weights: dict | None = None,
                 copies: dict | None = None, seed: int = 0, threads: int = 0):
        members = {str(k): OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else dict(v)
                   for k, v in (members or {}).items()}
        if not members:
            raise ValueError(f"model {name or self.name}: members is empty; name at least one model config")
        weights = {k: float((weights or {}).get(k, 1.0)) for k in members}
        conv = _convolution_weights(convolution_weights, members, name or self.name)
        copies = _copies(copies, members, name or self.name)
        params = {"members": members, "weights": weights, **({"convolution_weights": conv} if conv else {}),
                  **({"copies": copies} if any(n > 1 for n in copies.values()) else {})}
        drawn = _drawn(params)
        parts = {c: registry.create(members[k], spec, seed=seed + COPY_SEED_STEP * j, threads=threads)
                 for c, (k, j) in drawn.items()}
        # the gate reads the task's context as a member with task_context reads it
        own = _union(spec, [m.spec for m in parts.values()], CONVOLUTION_COLUMNS if conv else ())
        super().__init__(own, hyperparams=params, name=name, seed=seed, threads=threads)
        self.members = parts
        self.weights, self.convolution_weights = _drawn_weights(params, drawn)
        self.scale: dict[str, tuple[float, float]] = {}

    def bind(self, ws) -> "EnsembleModel":
        """The workspace, for the members that read it (MetaSchedule's XGBModel, `ms_xgb`: the
        schedules its records name); the others need none."""
        for m in self.members.values():
            if hasattr(m, "bind"):
                m.bind(ws)
        return self

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

    def combine(self, scores: dict[str, np.ndarray], convolutions: np.ndarray | None = None) -> np.ndarray:
        """The ensemble's score from its members' (`member_scores`); on the records marked in
        `convolutions` (see `convolutions`) with `convolution_weights`."""
        out = self._mean(scores, self.weights)
        if self.convolution_weights is not None and convolutions is not None and convolutions.any():
            out = np.where(convolutions, self._mean(scores, self.convolution_weights), out)
        return out

    def _mean(self, scores: dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
        total = sum(weights.values())
        return sum(weights[k] * (s - self.scale[k][0]) / self.scale[k][1] for k, s in scores.items()) / total

    def convolutions(self, columns) -> np.ndarray | None:
        """Which records are of convolution tasks, from `columns` (a table's frame, or a mapping
        of column name to values); None without `convolution_weights`."""
        if self.convolution_weights is None:
            return None
        missing = [c for c in CONVOLUTION_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"model {self.name}: convolution_weights reads the task's context columns {missing}, "
                             f"which this table lacks (models.tables.build_table adds them for features=static "
                             f"or all)")
        window, summed = (np.asarray(columns[c], dtype=np.float64) for c in CONVOLUTION_COLUMNS)
        return (window > 0.5) & (summed > 0.5)

    def member_scores(self, table) -> dict[str, np.ndarray]:
        """Each member's own score of the table's records."""
        return {k: m.predict(table) for k, m in self.members.items()}

    def predict(self, table) -> np.ndarray:
        return self.combine(self.member_scores(table), self.convolutions(table.frame))

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        out = {}
        for k, m in self.members.items():
            cols = [self.spec.columns.index(c) for c in m.spec.columns]
            mine = records[:, cols] if cols else np.zeros((records.shape[0], 0), np.float32)
            idx = [self.spec.store_columns.index(c) for c in m.spec.store_columns]
            out[k] = m.predict_arrays(mine, stores[:, idx] if idx else None, offsets if idx else None)
        return self.combine(out, self.convolutions(dict(zip(self.spec.columns, records.T))))

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
        drawn = _drawn(meta["params"])
        m.members = {c: registry.load(folder / "members" / c) for c in drawn}
        m.weights, m.convolution_weights = _drawn_weights(meta["params"], drawn)
        m.scale = {k: tuple(v) for k, v in json.loads((folder / "ensemble.json").read_text())["scale"].items()}
        m.info = meta.get("info", {})
        return m


def _drawn(params: dict) -> dict[str, tuple[str, int]]:
    """Each trained member's name -> (its member, which copy): a member's copies are named
    the member's own name, then `<member>_copy<j>`."""
    copies = params.get("copies") or {}
    return {(k if j == 0 else f"{k}_copy{j}"): (k, j) for k in params["members"] for j in range(copies.get(k, 1))}


def _drawn_weights(params: dict, drawn: dict) -> tuple[dict[str, float], dict[str, float] | None]:
    """The weights (and convolution weights) of the trained members: a member's own, shared
    by its copies."""
    copies = params.get("copies") or {}
    share = {c: 1.0 / copies.get(k, 1) for c, (k, _) in drawn.items()}
    conv = params.get("convolution_weights")
    return ({c: params["weights"][k] * share[c] for c, (k, _) in drawn.items()},
            conv and {c: conv[k] * share[c] for c, (k, _) in drawn.items()})


def _per_member(given, members: dict, who: str, option: str, default):
    """`option`'s value for every member (`default` where not named); refuses names that are
    not members."""
    given = OmegaConf.to_container(given) if isinstance(given, DictConfig) else dict(given or {})
    unknown = sorted(set(given) - set(members))
    if unknown:
        raise ValueError(f"model {who}: {option} names {unknown}, not members; its members: {sorted(members)}")
    return {k: given.get(k, default) for k in members}


def _copies(given: dict | None, members: dict, who: str) -> dict[str, int]:
    """How many times each member is trained (1 where not named)."""
    copies = _per_member(given, members, who, "copies", 1)
    bad = {k: n for k, n in copies.items() if not isinstance(n, int) or isinstance(n, bool) or n < 1}
    if bad:
        raise ValueError(f"model {who}: copies {bad} must be whole numbers of at least 1 (1: the member once)")
    return copies


def _convolution_weights(given: dict | None, members: dict, who: str) -> dict[str, float] | None:
    """Every member's weight on convolution records (0 where not named), or None."""
    if not given:
        return None
    conv = {k: float(w) for k, w in _per_member(given, members, who, "convolution_weights", 0.0).items()}
    if sum(conv.values()) <= 0:
        raise ValueError(f"model {who}: convolution_weights {conv} sum to {sum(conv.values())}; give a member a "
                         f"positive weight")
    return conv


def _union(spec: FeatureSpec, specs: list[FeatureSpec], extra: tuple[str, ...] = ()) -> FeatureSpec:
    """The columns any member (or the ensemble itself: `extra`) reads: the table's in its
    order, then those added to them (the task's context columns), so that MetaSchedule's
    candidates get them too."""
    read = {c for s in specs for c in s.columns} | set(extra)
    stores = {c for s in specs for c in s.store_columns}
    cols = dict.fromkeys([c for c in spec.columns if c in read] + [c for s in specs for c in s.columns] + list(extra))
    return FeatureSpec(spec.feature_set, list(cols), [c for c in spec.store_columns if c in stores], spec.target_kind)
