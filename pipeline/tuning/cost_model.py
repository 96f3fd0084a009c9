"""A cost model trained by this pipeline, as a MetaSchedule cost model.

    from pipeline.tuning.cost_model import PipelineCostModel
    cm = PipelineCostModel.from_pretrained("zoo_ops-llvm-epyc2-v16-ens_ps_rank4_fixed-all")  # a released model
    cm = PipelineCostModel.from_uri("models:/ops-llvm-cost-model@best-static")  # or .from_path(folder)
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, cost_model=cm,
                builder=PersistentBuilder())  # pipeline.compute.builder: see docs/tuning.md

MetaSchedule hands the cost model schedules it has not measured, so only static features
can be computed for them: the adapter runs MetaSchedule's own PerStoreFeature on the
candidates (the extractor that stage=collect runs on the dataset's traces) and rebuilds
(features/candidates.py) from its per-store rows exactly the columns the model was trained on (`static.<agg>.<feature>`
aggregates, `static.n_stores`, and the per-store rows of store models; see
pipeline/core/schema.py). A model trained on profiler counters (features=profiler or all) is
refused: counters exist only after a kernel has run.

Scores: MetaSchedule clamps scores below zero to zero and samples parents in proportion to
the score, so raw outputs go through a fixed, order-preserving map to positive numbers
(regression models: identity above 1e-3, an exponential tail below; ranking models:
1 + s above 0, exp(s) below).

Online update (`update=True`, off by default): every measured batch of the session is kept
as (per-store features, run time) per task, as MetaSchedule's XGBModel keeps it, labels
being the task's best session run time / run time. Every `update_every` batches the model
is refit:
  union     retrain from scratch, same model class and parameters, on the original
            training table (the workspace the model was trained on, when it is on this
            machine) plus the session's records (each session task its own label group)
  continue  without the training data: LightGBM/XGBoost add `update_rounds` trees on the
            session's records (continued boosting); the MLP fine-tunes `update_epochs`
            epochs on them
MetaSchedule's XGBModel baseline (ms_xgb) carries its own training data and is updated
through its own `update`, which is the union mode.
"""

from __future__ import annotations

import json
import logging
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.s_tir.meta_schedule.utils import shash2hex

from features import task_context
from features.candidates import feature_plan, model_inputs, pack
from models import pyfunc, registry, tracking
from models.base import CostModel, FeatureSpec
from models.residual import GRADES, SessionResidual, record_rows
from models.tables import TrainingTable, concat_tables, restricted_table
from pipeline.core import release
from pipeline.core import schema as S
from pipeline.shims.tvm_compat import preload_tensor_intrin

log = logging.getLogger(__name__)

FAILED_COST = 1e10  # MetaSchedule's run time of a failed candidate
EPS = 1e-3
MS_XGB = "ms_xgb"
UPDATE_MODES = ("auto", "union", "continue", "residual")


class TargetKindError(ValueError):
    """A model asked to score programs of a target kind it was not trained on."""


def positive_scores(raw: np.ndarray, calibrated: bool) -> np.ndarray:
    """Order-preserving map to (0, inf): MetaSchedule clamps negative scores to 0.

    Regression scores (normalized throughput) stay as they are above EPS; ranking scores
    (any real) become 1 + s above 0 and exp(s) below, which never saturates at the top."""
    raw = np.asarray(raw, np.float64)
    raw = np.clip(np.where(np.isnan(raw), -np.inf, raw), -700.0, 1e300)
    if calibrated:
        return np.where(raw > EPS, raw, EPS * np.exp(np.minimum(raw, EPS) - EPS))
    return np.where(raw > 0, 1.0 + raw, np.exp(np.minimum(raw, 0.0)))


def standardized(scores: np.ndarray) -> np.ndarray:
    """Scores of one task's candidates on a common scale (mean 0, deviation 1), so two models'
    scores can be mixed."""
    scores = np.asarray(scores, np.float64)
    spread = scores.std()
    return (scores - scores.mean()) / spread if spread > 0 else np.zeros_like(scores)


def run_cost(result) -> float:
    """Median run time of a RunnerResult, FAILED_COST when it failed (as XGBModel does)."""
    secs = getattr(result, "run_secs", None)
    if result is None or getattr(result, "error_msg", None) or not secs:
        return FAILED_COST
    return float(np.median([float(s) for s in secs]))


@dataclass
class _Session:
    """Measured candidates of this tuning session, per task (structural hash of its module)."""

    stores: dict[str, list[np.ndarray]] = field(default_factory=dict)
    costs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, group: str, per_store: list[np.ndarray], costs: list[float]) -> None:
        self.stores.setdefault(group, []).extend(per_store)
        self.costs.setdefault(group, []).extend(costs)

    @property
    def size(self) -> int:
        return sum(len(c) for c in self.costs.values())


@derived_object
class PipelineCostModel(PyCostModel):
    """MetaSchedule cost model backed by a pipeline CostModel (see the module docstring).

    Parameters: `model` (a loaded CostModel trained on static features), `update` (refit from
    the session's measurements), `update_every` (refit after this many measured batches),
    `update_mode` (auto | union | continue | residual; auto = union when the training data is
    found; residual = the model frozen, a small correction fitted on the session, models/residual.py),
    `update_rounds` / `update_epochs` (continued boosting / MLP fine-tuning; `update_rounds`
    and `update_grades` are the residual mode's trees and relevance grades; `update_handover`
    > 0 mixes each task's scores with those of MetaSchedule's XGBModel on the session alone,
    its weight m / (m + update_handover) with m the task's measurements beyond the first
    `update_handover_after`, so that the prior keeps the lead it has early), `train_data`
    (the workspace the model was trained on, for the union mode), `exclude_tasks` (task ids
    of that workspace the union mode leaves out: the model's held-out test tasks), `threads`,
    `source` (where the model came from, for messages), `train_table` (the training table
    itself, for the union mode on a machine without that workspace)."""

    def __init__(self, model: CostModel, *, update: bool = False, update_every: int = 2,
                 update_mode: str = "auto", update_rounds: int = 50, update_epochs: int = 5, update_grades: int = GRADES,
                 update_handover: int = 0, update_handover_after: int = 0,
                 train_data: str | Path | None = None, exclude_tasks=(), threads: int = 0, source: str = "",
                 info: dict | None = None, train_table: TrainingTable | None = None):
        super().__init__()
        # The TuneContext that will call this model imports MetaSchedule's tensor intrinsics:
        # done here the fast way (seconds; minutes in inspect.stack() with many modules loaded).
        preload_tensor_intrin()
        if update_mode not in UPDATE_MODES:
            raise ValueError(f"update_mode={update_mode!r}; valid: {', '.join(UPDATE_MODES)}")
        if int(update_every) < 1:
            raise ValueError(f"update_every={update_every} must be >= 1")
        self.source = source or getattr(model, "name", "model")
        # MetaSchedule's own XGBModel (ms_xgb) extracts its features itself.
        self.plan = None if model.name == MS_XGB else feature_plan(model.spec, self.source)
        self.model = model
        self.extractor = ms.feature_extractor.PerStoreFeature()
        self.update_enabled = bool(update)
        self.update_every = int(update_every)
        self.update_mode = update_mode
        self.update_rounds = int(update_rounds)
        self.update_epochs = int(update_epochs)
        self.update_grades = int(update_grades)
        if int(update_handover) < 0:
            raise ValueError(f"update_handover={update_handover} must be >= 0 (0: no hand-over)")
        self.update_handover = int(update_handover)
        if int(update_handover_after) < 0:
            raise ValueError(f"update_handover_after={update_handover_after} must be >= 0")
        self.update_handover_after = int(update_handover_after)
        self.train_data = str(train_data) if train_data else None
        self.exclude_tasks = tuple(sorted(exclude_tasks or ()))
        self.threads = int(threads)
        self.info = dict(info or {})
        self.session = _Session()
        self._task_context: dict[str, dict] = {}  # workload hash -> features.task_context.of_mod
        self.residual = SessionResidual(rounds=self.update_rounds, levels=self.update_grades, threads=self.threads)
        # the session's own model, without the prior, that a task's scores hand over to
        # (update_handover): MetaSchedule's XGBModel, which ranks a tuner's late region well;
        # no warm-up, since the hand-over weighs it by the task's measurements
        self.session_xgb = ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=self.threads or 1) \
            if self.update_handover else None
        self.n_updates = 0
        self.n_refits = 0
        self.refit_log: list[dict] = []
        self._train_table = train_table
        if threads and hasattr(model, "threads"):
            model.threads = int(threads)

    # -- construction

    @classmethod
    def from_path(cls, folder: str | Path, **kwargs) -> "PipelineCostModel":
        """A saved CostModel folder (features.json, model.json, ...)."""
        folder = Path(folder)
        if not (folder / "features.json").exists():
            raise FileNotFoundError(f"{folder} is not a saved cost model (no features.json): give the folder "
                                    f"written by CostModel.save, e.g. the `saved_model` artifact of a train run")
        spec = FeatureSpec.from_json((folder / "features.json").read_text())
        if json.loads((folder / "model.json").read_text()).get("name") != MS_XGB:
            feature_plan(spec, str(folder))  # refuse before loading anything heavy
        kwargs.setdefault("source", str(folder))
        return cls(registry.load(folder), **kwargs)

    @classmethod
    def from_uri(cls, uri: str, *, tracking_uri: str | None = None, **kwargs) -> "PipelineCostModel":
        """An MLflow model: `models:/<name>@<alias>`, `models:/<name>/<version>` or `runs:/<id>/model`.

        The training workspace recorded with the run (tag workspace_path) becomes
        `train_data` for the union update mode unless one is given, and the run's held-out
        test tasks (split.json) `exclude_tasks`, so a refit never trains on them; `info`
        carries both (`workspace_path`, `split`, `test_tasks`)."""
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        info = tracking.model_source(uri)
        if info.get("features") and info["features"] != "static":
            feature_plan(FeatureSpec(info["features"]), uri)  # refuses before the download
        if info.get("workspace_path"):
            kwargs.setdefault("train_data", info["workspace_path"])
        if info.get("run_id"):
            kwargs.setdefault("exclude_tasks", info["test_tasks"])
        model = pyfunc.load_cost_model(uri)
        kwargs.setdefault("source", uri)
        return cls(model, info=info, **kwargs)

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "PipelineCostModel":
        """An adapter saved with `save(path)` (model, settings and session data)."""
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(path) as tar:
                tar.extractall(tmp, filter="data")
            state = json.loads((Path(tmp) / "adapter.json").read_text())
            settings = {**state["settings"], **kwargs}
            out = cls(registry.load(Path(tmp) / "model"), info=state.get("info"), **settings)
            out._restore(Path(tmp), state)
        return out

    def to_bytes(self) -> bytes:
        """`save` as bytes, to send the adapter to another machine (`from_bytes` there)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "adapter.tar"
            self.save(str(path))
            return path.read_bytes()

    @classmethod
    def from_bytes(cls, data: bytes, **kwargs) -> "PipelineCostModel":
        """The adapter that `to_bytes` gave (`kwargs` override its settings, e.g. `train_table`)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "adapter.tar"
            path.write_bytes(data)
            return cls.from_file(path, **kwargs)

    @classmethod
    def from_pretrained(cls, name: str | Path, *, search=None, **kwargs) -> "PipelineCostModel":
        """A released pretrained model (stage=release), by name or by the path of its folder.

        By name it is looked up in `search` (default: `release.search_path()`: $PIPELINE_RELEASES,
        $PIPELINE_HOME/data/releases, ./data/releases, then a checkout's own data/releases); its files are
        verified against the manifest
        before anything is loaded. The model's held-out test tasks become `exclude_tasks`, so
        an online refit never learns them."""
        folder = release.find(name, release.search_path() if search is None else search)
        manifest = release.verify(folder, kind="model")
        info = {"pretrained": manifest["name"], "path": str(folder), "run_id": manifest.get("run_id"),
                "uri": f"pretrained:{manifest['name']}",
                **{k: manifest.get(k) for k in ("model", "features", "split", "training_release",
                                                "test_networks", "test_tasks", "trained_tasks", "target_kind")}}
        info["split_known"] = manifest.get("split") is not None
        kwargs.setdefault("exclude_tasks", list(manifest.get("test_tasks") or []))
        kwargs.setdefault("source", f"pretrained:{manifest['name']}")
        return cls(pyfunc.load_cost_model(str(folder / "model")), info=info, **kwargs)

    def check_target(self, target) -> None:
        """Refuse candidates of a target kind the model was not trained on (a CPU model's
        scores of CUDA programs would be noise that still steers the search)."""
        kind = "cuda" if target.kind.name == "cuda" else "cpu"
        trained = getattr(self.model.spec, "target_kind", None) or "cpu"
        if kind != trained:
            raise TargetKindError(f"{self.source} was trained on {trained} programs and cannot score candidates for "
                                  f"target kind {target.kind.name!r}: use a model trained on a {kind} workspace")

    # -- MetaSchedule's interface

    def predict(self, context, candidates) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros(0, np.float64)
        self.check_target(context.target)
        if self.plan is None:
            return np.asarray(self.model.ms_model.predict(context, candidates), np.float64)
        per_store = self._features(context, candidates)
        records, stores, offsets = model_inputs(per_store, self.plan, self._task_of(context.mod))
        raw = self.model.predict_arrays(records, stores, offsets)
        calibrated = self.model.calibrated
        if self.residual.booster is not None:
            raw = raw + self.residual.predict(record_rows(*pack(per_store)))
            counted = len(self.session.costs.get(shash2hex(context.mod), ())) - self.update_handover_after
            if self.session_xgb is not None and self.session_xgb.booster is not None and counted > 0:
                # the task's scores hand over to the session's own model as its measurements
                # grow past `update_handover_after`, equal weight after `update_handover` more
                # (XGBModel scores the features extracted above: its `predict` would extract
                # them again)
                weight = counted / (counted + self.update_handover)
                own = self.session_xgb._predict(xs=per_store)  # pylint: disable=protected-access
                raw, calibrated = (1.0 - weight) * standardized(raw) + weight * standardized(own), False
        return positive_scores(raw, calibrated).astype(np.float64)

    def update(self, context, candidates, results) -> None:
        if len(candidates) == 0:
            return
        self.check_target(context.target)
        per_store = self._features(context, candidates)
        costs = [run_cost(r) for r in results]
        self.session.add(shash2hex(context.mod), per_store, costs)
        self._task_of(context.mod)
        self.n_updates += 1
        if self.session_xgb is not None:
            self.session_xgb.update(context, candidates, results)
        if self.plan is None and self.update_enabled:
            self.model.ms_model.update(context, candidates, results)  # its own data: union
            self.n_refits += 1
            return
        if self.update_enabled and self.n_updates % self.update_every == 0:
            self.refit()

    def save(self, path: str) -> None:
        """One tar file: the model folder, adapter.json (settings, counters) and session.npz."""
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            self.model.save(tmp / "model")
            groups = list(self.session.costs)
            arrays = {}
            for i, g in enumerate(groups):
                stores, offsets = pack(self.session.stores[g])
                arrays[f"stores_{i}"], arrays[f"offsets_{i}"] = stores, offsets
                arrays[f"costs_{i}"] = np.asarray(self.session.costs[g], np.float64)
            np.savez(tmp / "session.npz", **arrays)
            state = {"settings": self.settings(),
                     "info": self.info, "groups": groups, "n_updates": self.n_updates, "n_refits": self.n_refits,
                     "refit_log": self.refit_log, "task_context": self._task_context,
                "residual": self.residual.to_string()}
            (tmp / "adapter.json").write_text(json.dumps(state, indent=2, default=str))
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            parts = ["model", "adapter.json", "session.npz"]
            if self.session_xgb is not None and self.session_xgb.booster is not None:
                self.session_xgb.save(str(tmp / "session_xgb.tar"))
                parts.append("session_xgb.tar")
            with tarfile.open(path, "w") as tar:
                for p in parts:
                    tar.add(tmp / p, arcname=p)

    def settings(self) -> dict:
        """The constructor's settings (all but the model and info)."""
        return {"update": self.update_enabled, "update_every": self.update_every, "update_mode": self.update_mode,
                "update_rounds": self.update_rounds, "update_epochs": self.update_epochs, "update_grades": self.update_grades,
                "update_handover": self.update_handover, "update_handover_after": self.update_handover_after,
                "train_data": self.train_data, "exclude_tasks": list(self.exclude_tasks), "threads": self.threads,
                "source": self.source}

    def copy(self, *, threads: int | None = None, update: bool | None = None,
             update_mode: str | None = None) -> "PipelineCostModel":
        """A fresh adapter with the same model and settings (`threads`, `update` changed where
        given) and an empty session, for another tuning run; with online updates on, its own
        copy of the model, so refits do not leak."""
        settings = self.settings()
        if threads is not None:
            settings["threads"] = int(threads)
        if update is not None:
            settings["update"] = bool(update)
        if update_mode is not None:
            settings["update_mode"] = str(update_mode)
        # the residual mode never changes the model: it can be shared
        model = self.model.copy() if settings["update"] and settings["update_mode"] != "residual" else self.model
        return PipelineCostModel(model, info=self.info, train_table=self._train_table, **settings)

    def load(self, path: str) -> None:
        """Replace this adapter's model, settings and session with those saved in `path`."""
        inner = PipelineCostModel.from_file(path)._inst
        for k in ("model", "plan", "update_enabled", "update_every", "update_mode", "update_rounds",
                  "update_epochs", "update_grades", "update_handover",
                  "update_handover_after", "train_data", "exclude_tasks", "threads", "source", "info", "session",
                  "n_updates", "n_refits", "refit_log", "_task_context", "residual", "session_xgb"):
            setattr(self, k, getattr(inner, k))
        self._train_table = None

    # -- internals

    def _task_of(self, mod) -> dict | None:
        """The task context of a workload, when the model reads it (computed once per task)."""
        if self.plan is None or not (self.plan.record_kind == 3).any():
            return None
        key = shash2hex(mod)
        if key not in self._task_context:
            self._task_context[key] = task_context.of_mod(mod)
        return self._task_context[key]

    def _features(self, context, candidates) -> list[np.ndarray]:
        width = len(S.PER_STORE_FEATURE_NAMES)
        return [x.numpy().astype(np.float32, copy=False).reshape(-1, width)
                for x in self.extractor.extract_from(context, candidates)]

    def _restore(self, folder: Path, state: dict) -> None:
        z = np.load(folder / "session.npz")
        for i, g in enumerate(state.get("groups", [])):
            stores, offsets, costs = z[f"stores_{i}"], z[f"offsets_{i}"], z[f"costs_{i}"]
            self.session.add(g, [stores[offsets[j]:offsets[j + 1]] for j in range(len(offsets) - 1)],
                             [float(c) for c in costs])
        self.n_updates = int(state.get("n_updates", 0))
        self.n_refits = int(state.get("n_refits", 0))
        self.refit_log = list(state.get("refit_log", []))
        self._task_context = dict(state.get("task_context", {}))
        self.residual.load_string(state.get("residual"))
        if self.session_xgb is not None and (folder / "session_xgb.tar").exists():
            self.session_xgb.load(str(folder / "session_xgb.tar"))

    def session_table(self):
        """The session's measured candidates as a TrainingTable (labels per task: best / cost)."""
        frames, all_stores, tasks = [], [], []
        for gi, (g, costs) in enumerate(self.session.costs.items()):
            c = np.asarray(costs, np.float64)
            ok = c < FAILED_COST
            best = c[ok].min() if ok.any() else FAILED_COST
            labels = np.where(ok, best / c, 0.0)
            frames.append(pd.DataFrame({"record_id": [f"session-{gi}-{j}" for j in range(len(c))],
                                        "task_id": f"session-{g}", "label": labels}))
            all_stores.extend(self.session.stores[g])
            tasks += [self._task_context.get(g, {})] * len(c)
        frame = pd.concat(frames, ignore_index=True) if frames else \
            pd.DataFrame({"record_id": [], "task_id": [], "label": []})
        records, stores, offsets = model_inputs(all_stores, self.plan, tasks)
        frame = pd.concat([frame, pd.DataFrame(records, columns=list(self.plan.columns))], axis=1)
        return TrainingTable("session", frame, self.model.spec, {}, stores, offsets)

    def training_table(self):
        """The training table of the union mode (None when it is not usable here), read once."""
        if self._train_table is None and self.train_data:
            self._train_table, why = restricted_table(self.train_data, self.model.spec, self.exclude_tasks)
            if self._train_table is None:
                log.warning("online update: the training data is not usable (%s): continuing from the model", why)
                self.train_data = None
        return self._train_table

    def refit(self) -> dict:
        """Refit the model on the session's measurements (see the module docstring)."""
        t0 = time.perf_counter()
        session = self.session_table()
        if len(session) < 2:
            return {}
        mode = self.update_mode
        if mode == "residual":
            return self._fit_residual(session, t0)
        base = self.training_table() if mode in ("auto", "union") else None
        if mode == "union" and base is None:
            raise ValueError(f"update_mode=union needs the model's training data: pass train_data=<workspace> "
                             f"({self.source} does not name a workspace on this machine)")
        mode = "union" if base is not None else "continue"
        if mode == "union":
            # the same class and hyperparameters, trained from scratch (no validation part)
            fresh = self.model.clone()
            both = concat_tables(base, session)
            fresh.fit(both, both.take(np.zeros(0, np.int64)))
            self.model = fresh
        else:
            try:
                self.model.continue_fit(session, rounds=self.update_rounds, epochs=self.update_epochs)
            except NotImplementedError as e:
                raise ValueError(f"online update: {e}; use update_mode=union with its training data") from e
        return self._logged(mode, len(session), len(base) if base is not None else 0, t0)

    def _fit_residual(self, session, t0: float) -> dict:
        """The model's own scores of the session's records as the start, a correction on top."""
        prior = self.model.predict(session)
        rows = record_rows(*pack(self.session_records()))
        trees = self.residual.fit(rows, prior, session.labels, session.task_codes)
        return self._logged("residual", len(session), 0, t0, trees=trees)

    def session_records(self) -> list[np.ndarray]:
        """Every session record's [n_stores, 164] matrix, in session_table's order."""
        return [x for g in self.session.costs for x in self.session.stores[g]]

    def _logged(self, mode: str, session: int, train: int, t0: float, **more) -> dict:
        self.n_refits += 1
        entry = {"refit": self.n_refits, "mode": mode, "session_records": session, "train_records": train,
                 "seconds": time.perf_counter() - t0, **more}
        self.refit_log.append(entry)
        log.info("cost model refit %d (%s): %d session + %d training records in %.1f s", self.n_refits, mode,
                 session, train, entry["seconds"])
        return entry
