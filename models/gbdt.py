"""Gradient-boosted trees: LightGBM and XGBoost, on record rows or on buffer-store rows.

Two inputs (`input`):
  records     one row per record: the record-level columns (for static features, the
              program-level aggregate sum/mean/max of the per-store rows)
  stores      one row per buffer store (PerStoreFeature), a record's score being the sum of
              its stores' outputs (MetaSchedule XGBModel's pack-sum): the loss is taken on the
              record's sum and its gradient handed to each of the record's stores (custom
              objectives of both libraries), so trees learn what each store costs; `context`
              (regular expressions on the record-level columns) appends the matching columns
              of a store's record to each store row (the program around the store);
              `task_context` appends the task's operator kind and size (features/task_context.py)
              and `roofline` (the machine's peaks) each store's roofline bound (features/roofline.py);
              `roofline_base` > 0 starts each record's score at -roofline_base x log2(its bound),
              so the trees learn a correction of the roofline rather than the whole ranking
Two objectives each:
  regression  squared error on normalized throughput (scores are calibrated), each record
              weighted by label ** label_weight (0: unweighted; 1: MetaSchedule's weighting, the
              fast records of each task dominate the fit)
  ranking     LambdaRank per task (records: LightGBM `lambdarank`, XGBoost `rank:ndcg`; stores:
              the same LambdaRank gradient on the records' sums); labels become relevance grades
              0..rank_levels-1 from each record's rank within its task (the best record gets
              the top grade), or with `grade_cuts` from tiers of normalized throughput; a task
              with more than `max_group` records is cut into random query groups of at most
              that size (LightGBM refuses very large queries); `rank_truncation` k > 0
              (stores input) keeps only the pairs whose better-scored record is among the
              first k of its group's current order (LightGBM's lambdarank_truncation_level):
              the gradient goes to what the top of the order gets wrong, which top-1 reads
`task_weight` p > 0 (stores input) weighs each training task by its share of a network's
best-case time to the power p (a task of several networks: its largest share; the operator
suite counts as one network), scaled so the tasks weigh 1 on average: a held-out network's
top-1 is TenSet's time-weighted score, decided by its few heaviest tasks, while an unweighted
loss spends as much on a transpose of 0.1% of the time as on the convolution of 60%.
Early stopping on the validation part when it has rows (`early_stopping_metric`: the
objective's own loss, or a per-task ranking metric of the validation records: peak1, peak5,
apeak32 = mean peak score@1..32, pair_acc), else a fixed number of rounds
(`rounds_without_val`). `early_stopping_rounds: 0` trains that fixed number even with a
validation part, which is then only scored: the length of training does not depend on
which network validates.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
import xgboost as xgb

from features import roofline as roof
from features.task_context import COLUMNS as TASK_COLUMNS
from models.base import CostModel, FeatureSpec
from models.metrics import STOP_METRICS, network_time_shares, ranking_metric
from models.tables import gather_segments


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


def grades(labels: np.ndarray, task_codes: np.ndarray, levels: int,
           cuts: list[float] | tuple[float, ...] | None = None) -> np.ndarray:
    """Relevance grades 0..levels-1 from each record's rank within its task (best = top grade).

    Ranks rather than raw throughput: throughputs of a task are usually skewed (a few fast
    records, a long slow tail), and raw grades would lump most records into grade 0.
    With `cuts` (increasing, in (0, 1)) the grade is instead the number of cuts a record's
    normalized throughput (best of its task = 1) reaches: tiers of speed, so a task whose
    best is far ahead of the rest gives only that record the top grade."""
    if cuts:
        return np.searchsorted(np.asarray(cuts, dtype=np.float64), np.asarray(labels, dtype=np.float64),
                               side="right").astype(np.int32)
    s = pd.Series(np.asarray(labels, dtype=np.float64))
    pct = s.groupby(np.asarray(task_codes)).rank(method="min", pct=False)
    n = s.groupby(np.asarray(task_codes)).transform("size")
    frac = np.where(n > 1, (pct - 1) / (n - 1).clip(lower=1), 1.0)
    return np.clip(np.rint(frac * (levels - 1)), 0, levels - 1).astype(np.int32)


INPUTS = ("records", "stores")


def task_time_weights(frame: pd.DataFrame, members: pd.DataFrame | None, power: float) -> np.ndarray:
    """Per record of `frame` (task_id, mean_s; group and weight unless `members`): its task's
    largest share of a network's best-case time (sum over the network's tasks here of calls x
    best latency) to the power `power`, divided by the mean over the tasks (tasks weigh 1 on
    average). A table without latencies (a tuning session's measured candidates) weighs every
    record 1; one without memberships counts its tasks once each, in one network."""
    if "mean_s" not in frame.columns:
        return np.ones(len(frame))
    best = frame.groupby("task_id", sort=False)["mean_s"].min()
    if members is None:
        members = frame.reindex(columns=["task_id", "group", "weight"])
        members = members.assign(group=members["group"].astype(object).fillna(""), weight=members["weight"].fillna(1))
        members = members.drop_duplicates(["task_id", "group"])
    m = members[members["task_id"].isin(best.index)][["task_id", "group", "weight"]]
    m = m.assign(share=network_time_shares(m["weight"], best.reindex(m["task_id"]).set_axis(m.index), m["group"]))
    share = m.groupby("task_id")["share"].max().reindex(best.index)
    share = share.fillna(share.median() if share.notna().any() else 1.0)  # a task of no network
    w = share.to_numpy(dtype=np.float64).clip(min=1e-12) ** float(power)
    w = pd.Series(w / w.mean(), index=best.index)
    return w.reindex(frame["task_id"]).to_numpy(dtype=np.float64)


def lambdarank_gradients(scores: np.ndarray, grade: np.ndarray, sizes: np.ndarray,
                         truncation: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """LambdaRank's gradient and hessian of `scores` (rows contiguous per query group of
    `sizes`), NDCG gains 2**grade - 1, as LightGBM's lambdarank computes them; with
    `truncation` k > 0 only over the pairs one of whose records is among the k best-scored of
    its group (LightGBM's lambdarank_truncation_level)."""
    grad = np.zeros_like(scores)
    hess = np.zeros_like(scores)
    start = 0
    for n in sizes:
        sl = slice(start, start + n)
        start += n
        s, g = scores[sl], grade[sl].astype(np.float64)
        gain = 2.0 ** g - 1.0
        ideal = np.sort(gain)[::-1]
        max_dcg = float(np.sum(ideal / np.log2(np.arange(2, n + 2))))
        if n < 2 or max_dcg <= 0:
            continue
        rank = np.empty(n, np.int64)
        rank[np.argsort(-s, kind="stable")] = np.arange(n)
        disc = 1.0 / np.log2(rank + 2.0)
        better = g[:, None] > g[None, :]  # pairs (i, j): i should rank above j
        if truncation:
            better &= np.minimum(rank[:, None], rank[None, :]) < truncation
        delta = np.abs((gain[:, None] - gain[None, :]) * (disc[:, None] - disc[None, :])) / max_dcg
        rho = 1.0 / (1.0 + np.exp(np.clip(s[:, None] - s[None, :], -50, 50)))  # sigmoid(-(s_i - s_j))
        lam = np.where(better, rho * delta, 0.0)
        h = np.where(better, rho * (1.0 - rho) * delta, 0.0)
        grad[sl] = -lam.sum(axis=1) + lam.sum(axis=0)
        hess[sl] = h.sum(axis=1) + h.sum(axis=0)
    return grad, np.maximum(hess, 1e-9)


def mean_ndcg(scores: np.ndarray, grade: np.ndarray, sizes: np.ndarray, k: int) -> float:
    """NDCG@k with gains 2**grade - 1, averaged over the query groups (rows contiguous per group)."""
    out, start = [], 0
    for n in sizes:
        s, g = scores[start:start + n], 2.0 ** grade[start:start + n].astype(np.float64) - 1.0
        start += n
        disc = 1.0 / np.log2(np.arange(2, min(k, n) + 2))
        ideal = float(np.sum(np.sort(g)[::-1][:k] * disc))
        if ideal > 0:
            out.append(float(np.sum(g[np.argsort(-s, kind="stable")[:k]] * disc)) / ideal)
    return float(np.mean(out)) if out else float("nan")


class _Layout:
    """One table in the row order and form the library trains on: rows `X` (records, or the
    stores of the records), record labels `y` (grades for ranking), record weights `w` in the
    loss (label weight x task weight; None: 1), the record of each row `seg` (stores) and the
    query group sizes (ranking)."""

    def __init__(self, X, y, w, seg, sizes, labels, codes, base=None):
        self.X, self.y, self.w, self.seg, self.sizes = X, y, w, seg, sizes
        self.labels, self.codes = labels, codes  # per record, in layout order (validation metrics)
        self.base = base  # per record: the score the trees start from and correct (None: 0)

    @property
    def n_records(self) -> int:
        return len(self.y)

    def record_scores(self, row_scores: np.ndarray) -> np.ndarray:
        if self.seg is None:
            return np.asarray(row_scores, np.float64)
        out = np.bincount(self.seg, weights=row_scores, minlength=self.n_records)
        return out if self.base is None else out + self.base


def _own_spec(spec: FeatureSpec, input: str, context: list[str], task_context: bool, who: str) -> FeatureSpec:
    """The columns a GBDT reads. records: the record-level columns (for static features, the
    program-level aggregate of the per-store rows); stores: the per-store rows, summed per
    record, with the record-level columns matching a `context` pattern (and the task's
    context columns) on every row."""
    if input == "records":
        if not spec.columns:
            raise ValueError(f"{who}: feature set {spec.feature_set!r} has no record-level column")
        return FeatureSpec(spec.feature_set, list(spec.columns), [], spec.target_kind)
    if not spec.store_columns:
        raise ValueError(f"{who}: input=stores needs per-store rows (features=static or all); feature set "
                         f"{spec.feature_set!r} has none")
    pats = [re.compile(c) for c in context]
    ctx = [c for c in spec.columns if any(p.search(c) for p in pats)]
    if pats and not ctx:
        raise ValueError(f"{who}: context={context} matches no record-level column of feature "
                         f"set {spec.feature_set!r} (e.g. {spec.columns[:3]})")
    if task_context:
        ctx += [c for c in TASK_COLUMNS if c not in ctx]
    return FeatureSpec(spec.feature_set, ctx, list(spec.store_columns), spec.target_kind)


class _GBDT(CostModel):
    """What LightGBM and XGBoost share: objective handling, data layout, importance.

    Hyperparameters (conf/model/<name>.yaml): objective (regression | ranking), input
    (records | stores), label_weight (regression), early_stopping_metric, num_boost_round and
    early_stopping_rounds (with a validation part), rounds_without_val, params (the library's
    own parameters), task_weight (stores), and for ranking rank_levels (or grade_cuts),
    rank_truncation (stores), max_group, eval_at."""

    def __init__(self, spec: FeatureSpec, *, name: str = "", objective: str = "regression", input: str = "records",
                 context: list[str] | tuple[str, ...] = (), task_context: bool = False,
                 roofline: dict | None = None, roofline_base: float = 0.0, label_weight: float = 0.0,
                 early_stopping_metric: str = "loss", num_boost_round: int = 2000,
                 early_stopping_rounds: int = 50, rounds_without_val: int = 200, params: dict | None = None,
                 rank_levels: int = 32, grade_cuts: list[float] | tuple[float, ...] | None = None,
                 rank_truncation: int = 0, max_group: int = 1024, eval_at: list[int] | tuple[int, ...] = (5,),
                 task_weight: float = 0.0, seed: int = 0, threads: int = 0):
        who = f"model {name or self.name}"
        if objective not in ("regression", "ranking"):
            raise ValueError(f"{who}: objective={objective!r}; valid: regression, ranking")
        if input not in INPUTS:
            raise ValueError(f"{who}: input={input!r}; valid: {', '.join(INPUTS)}")
        if early_stopping_metric not in STOP_METRICS:
            raise ValueError(f"{who}: early_stopping_metric={early_stopping_metric!r}; valid: {', '.join(STOP_METRICS)}")
        if int(early_stopping_rounds) < 0:
            raise ValueError(f"{who}: early_stopping_rounds={early_stopping_rounds}; valid: a count of rounds, "
                             f"or 0 to train rounds_without_val rounds without stopping")
        cuts = [float(c) for c in (grade_cuts or ())]
        if cuts and not (all(0.0 < c < 1.0 for c in cuts) and all(a < b for a, b in zip(cuts, cuts[1:]))):
            raise ValueError(f"{who}: grade_cuts={cuts}; valid: increasing normalized throughputs in (0, 1), "
                             f"e.g. [0.5, 0.8, 0.95]")
        if float(task_weight) < 0 or (task_weight and input != "stores"):
            raise ValueError(f"{who}: task_weight={task_weight}; valid: 0 (every task weighs the same), or a "
                             f"power > 0 of each task's share of its network's time with input=stores")
        if int(rank_truncation) < 0 or (rank_truncation and (objective != "ranking" or input != "stores")):
            raise ValueError(f"{who}: rank_truncation={rank_truncation}; valid: 0 (every pair), or a count of "
                             f"best-scored records per group with objective=ranking and input=stores")
        if cuts and objective != "ranking":
            raise ValueError(f"{who}: grade_cuts grade a ranking objective; set objective=ranking or drop them")
        if cuts:
            rank_levels = len(cuts) + 1
        hyperparams = {"objective": objective, "input": input, "context": [str(c) for c in context],
                       "task_context": bool(task_context), "roofline": dict(roofline) if roofline else None,
                       "roofline_base": float(roofline_base),
                       "label_weight": float(label_weight),
                       "early_stopping_metric": early_stopping_metric, "num_boost_round": int(num_boost_round),
                       "early_stopping_rounds": int(early_stopping_rounds),
                       "rounds_without_val": int(rounds_without_val), "params": dict(params or {}),
                       "rank_levels": int(rank_levels), "grade_cuts": cuts or None,
                       "rank_truncation": int(rank_truncation), "max_group": int(max_group),
                       "eval_at": [int(k) for k in eval_at], "task_weight": float(task_weight)}
        if roofline_base and not roofline:
            raise ValueError(f"{who}: roofline_base={roofline_base} needs the machine's peaks (roofline: gflops, gbs, "
                             f"cores, lanes)")
        if (context or task_context or roofline) and input != "stores":
            raise ValueError(f"{who}: context, task_context and roofline need input=stores (a row per store)")
        own = _own_spec(spec, input, hyperparams["context"], bool(task_context), who)
        super().__init__(own, hyperparams=hyperparams, name=name, seed=seed, threads=threads)
        self.input = input
        self.label_weight = hyperparams["label_weight"]
        self.stop_metric = early_stopping_metric
        self.ranking = objective == "ranking"
        self.calibrated = not self.ranking
        self.num_boost_round = hyperparams["num_boost_round"]
        self.early_stopping_rounds = hyperparams["early_stopping_rounds"]
        self.rounds_without_val = hyperparams["rounds_without_val"]
        self.library_params = hyperparams["params"]
        self.rank_levels = hyperparams["rank_levels"]
        self.grade_cuts = hyperparams["grade_cuts"]
        self.rank_truncation = hyperparams["rank_truncation"]
        self.max_group = hyperparams["max_group"]
        self.eval_at = hyperparams["eval_at"]
        self.task_weight = hyperparams["task_weight"]
        self.peaks = roof.Peaks(**hyperparams["roofline"]) if hyperparams["roofline"] else None
        self.base_weight = hyperparams["roofline_base"]
        self.booster = None
        self.names = safe_names(self.row_columns)

    @property
    def nthread(self) -> int:
        return self.threads or os.cpu_count() or 1

    def _stops(self, val) -> bool:
        """Whether this fit stops early on `val` (or trains `rounds_without_val` rounds)."""
        return bool(len(val)) and self.early_stopping_rounds > 0

    @property
    def row_columns(self) -> list[str]:
        """The columns of a row the trees see: record columns, or store columns + context."""
        if self.input == "records":
            return list(self.spec.columns)
        return [*self.spec.store_columns, *(roof.COLUMNS if self.peaks else ()), *self.spec.columns]

    def _store_rows(self, stores: np.ndarray, records: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """Store rows with their roofline bounds and their record's context columns appended."""
        parts = [stores]
        if self.peaks is not None:
            parts.append(roof.store_bounds(stores, self.peaks, self.spec.store_columns))
        if self.spec.columns:
            parts.append(records[seg])
        return parts[0] if len(parts) == 1 else np.hstack(parts).astype(np.float32, copy=False)

    def _records_of(self, table) -> np.ndarray:
        """The record-level columns this model reads, from a table (which may hold more)."""
        if not self.spec.columns:
            return np.zeros((len(table), 0), np.float32)
        return table.frame[self.spec.columns].to_numpy(dtype=np.float32, na_value=np.nan)

    @property
    def custom(self) -> bool:
        """Whether the objective is computed here (store input) rather than by the library."""
        return self.input == "stores"

    def _layout(self, table, fitted: bool = False) -> _Layout:
        """The table in the row order and form the library trains on (see _Layout); `fitted`:
        the table the trees are fitted to, the only one whose records carry task weights."""
        labels, codes = table.labels, table.task_codes
        if self.ranking:
            order, sizes = rank_groups(codes, self.max_group, self.seed)
            y = grades(labels, codes, self.rank_levels, self.grade_cuts)[order]
        else:
            order, sizes = np.arange(len(labels)), None
            y = labels
        w = labels[order] ** self.label_weight if (self.label_weight and not self.ranking) else None
        if self.input == "records":
            return _Layout(self._records_of(table)[order], y, w, None, sizes, labels[order], codes[order])
        idx, seg = gather_segments(table.offsets, order)
        X = self._store_rows(table.stores[idx], self._records_of(table)[order], seg)
        base = self._base(table.stores, table.offsets)
        if fitted and self.task_weight:
            tw = task_time_weights(table.frame, table.members, self.task_weight)[order]
            w = tw if w is None else w * tw
        return _Layout(X, y, w, seg, sizes, labels[order], codes[order], None if base is None else base[order])

    def _base(self, stores: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Per record, -roofline_base x log2 of its roofline bound (ns): fast records start high."""
        if not self.base_weight:
            return None
        bound = roof.record_bound_ns(stores, offsets, self.peaks, self.spec.store_columns)
        return -self.base_weight * np.log2(1.0 + bound)

    def _objective(self, lay: _Layout):
        """Gradient and hessian per row (store) from the loss on the records' sums."""
        def objective(row_scores: np.ndarray):
            rec = lay.record_scores(row_scores)
            if self.ranking:
                g, h = lambdarank_gradients(rec, lay.y, lay.sizes, self.rank_truncation)
            else:
                g, h = rec - lay.y, np.ones_like(rec)
            if lay.w is not None:
                g, h = g * lay.w, h * lay.w
            return g[lay.seg], h[lay.seg]
        return objective

    def _val_metric(self, lay: _Layout):
        """(name, fn(row scores) -> value, higher is better) for early stopping on validation."""
        name = self.stop_metric
        if name == "loss":
            if not self.custom:
                return None
            if self.ranking:
                k = self.eval_at[0]
                return f"val_ndcg@{k}", lambda r: mean_ndcg(lay.record_scores(r), lay.y, lay.sizes, k), True
            w = lay.w if lay.w is not None else np.ones(lay.n_records)
            return "val_wrmse", lambda r: float(np.sqrt(np.sum(w * (lay.record_scores(r) - lay.y) ** 2) / w.sum())), False
        return f"val_{name}", lambda r: ranking_metric(name, lay.record_scores(r), lay.labels, lay.codes), True

    def predict(self, table) -> np.ndarray:
        return self.predict_arrays(self._records_of(table), table.stores if self.input == "stores" else None,
                                   table.offsets if self.input == "stores" else None)

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        if self.input == "records":
            return self._predict_rows(records)
        if stores is None:
            raise ValueError(f"model {self.name} reads per-store rows (input=stores): pass stores and offsets")
        seg = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        rows = self._store_rows(stores, records, seg)
        out = np.bincount(seg, weights=self._predict_rows(rows), minlength=len(offsets) - 1).astype(np.float64)
        base = self._base(stores, offsets)
        return out if base is None else out + base

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def importance(self) -> pd.Series:
        return self._gain().reindex(self.row_columns, fill_value=0.0).sort_values(
            ascending=False)

    def native(self):
        return self.booster


class LGBMModel(_GBDT):
    name = "lgbm"
    library = "lightgbm"
    flavor = "lightgbm"

    def _train_params(self) -> dict:
        p = dict(self.library_params)
        p.update(seed=self.seed, num_threads=self.nthread, verbose=-1, deterministic=True)
        if self.custom:
            p.update(objective="none", metric="None")  # gradients from _objective
        elif self.ranking:
            p.update(objective="lambdarank", metric="ndcg", eval_at=list(self.eval_at),
                     label_gain=[float(2**i - 1) for i in range(self.rank_levels)])
        else:
            p.update(objective="regression", metric="rmse")
        if self.stop_metric != "loss" and not self.custom:
            p["metric"] = "None"  # early stopping on the ranking metric only
        return p

    def _dataset(self, lay: _Layout, reference=None):
        # stores: the labels live in the layout (the objective reads them); LightGBM needs one per row
        label = lay.y if lay.seg is None else lay.y[lay.seg]
        weight = lay.w if lay.seg is None else None
        return lgb.Dataset(lay.X, label, weight=weight, group=lay.sizes if not self.custom else None,
                           feature_name=self.names, reference=reference, free_raw_data=False)

    def _fobj(self, lay: _Layout):
        objective = self._objective(lay)
        return lambda preds, data: objective(preds)

    def fit(self, train, val) -> dict:
        lay = self._layout(train, fitted=True)
        dtrain = self._dataset(lay)
        p = self._train_params()
        if self.custom:
            p["objective"] = self._fobj(lay)
        curve: dict = {}
        callbacks = [lgb.record_evaluation(curve)]
        valid, feval = [], None
        if len(val):
            vlay = self._layout(val)
            valid = [self._dataset(vlay, reference=dtrain)]
            metric = self._val_metric(vlay)
            if metric is not None:
                name, fn, higher = metric
                feval = lambda preds, data: (name, fn(preds), higher)  # noqa: E731
        stops = self._stops(val)
        if stops:
            callbacks.append(lgb.early_stopping(self.early_stopping_rounds, first_metric_only=True, verbose=False))
        self.booster = lgb.train(p, dtrain, num_boost_round=self.num_boost_round if stops else self.rounds_without_val,
                                 valid_sets=valid, valid_names=["val"][: len(valid)], feval=feval, callbacks=callbacks)
        best = self.booster.best_iteration or self.booster.current_iteration()
        self.info = {"best_iteration": int(best), "early_stopped": stops,
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int = 0) -> None:
        """`rounds` more trees on `table` (continued boosting from the current booster)."""
        lay = self._layout(table, fitted=True)
        p = self._train_params()
        if self.custom:
            p["objective"] = self._fobj(lay)
        # a small session table: leaves may hold fewer records than the configured minimum
        p["min_data_in_leaf"] = min(int(p.get("min_data_in_leaf", 20)), max(1, len(lay.y) // 4))
        self.booster = lgb.train(p, self._dataset(lay), num_boost_round=int(rounds), init_model=self.booster,
                                 keep_training_booster=True)

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        if not len(X):
            return np.zeros(0)
        return np.asarray(self.booster.predict(X, num_threads=self.nthread), dtype=np.float64)

    def _gain(self) -> pd.Series:
        gain = self.booster.feature_importance(importance_type="gain")
        return pd.Series(gain, index=self.row_columns, dtype=float)

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

    def _dmatrix(self, lay: _Layout | None = None, X=None):
        if lay is None:
            return xgb.DMatrix(X, feature_names=self.names, nthread=self.nthread)
        if self.custom:  # labels live in the layout (the objective reads them)
            return xgb.DMatrix(lay.X, feature_names=self.names, nthread=self.nthread)
        qid = None if lay.sizes is None else np.repeat(np.arange(len(lay.sizes)), lay.sizes)
        return xgb.DMatrix(lay.X, label=lay.y, weight=lay.w, qid=qid, feature_names=self.names, nthread=self.nthread)

    def _train_params(self) -> dict:
        p = dict(self.library_params)
        p.update(seed=self.seed, nthread=self.nthread, verbosity=0)
        if self.custom:
            # a record's score is the plain sum of its stores' outputs: no per-row base score
            p.update(base_score=0.0, disable_default_eval_metric=1)
        elif self.ranking:
            p.update(objective="rank:ndcg", eval_metric=f"ndcg@{self.eval_at[0]}")
        else:
            p.update(objective="reg:squarederror", eval_metric="rmse")
        if self.stop_metric != "loss" and not self.custom:
            p["disable_default_eval_metric"] = 1
            p.pop("eval_metric", None)
        return p

    def _obj(self, lay: _Layout):
        if not self.custom:
            return None
        objective = self._objective(lay)
        return lambda preds, dtrain: objective(preds)

    def fit(self, train, val) -> dict:
        lay = self._layout(train, fitted=True)
        dtrain = self._dmatrix(lay)
        curve: dict = {}
        evals, kwargs = [], {}
        if len(val):
            vlay = self._layout(val)
            evals = [(self._dmatrix(vlay), "val")]
            metric = self._val_metric(vlay)
            if metric is not None:
                name, fn, higher = metric
                kwargs = {"custom_metric": lambda preds, d: (name, fn(preds)), "maximize": higher}
        stops = self._stops(val)
        booster = xgb.train(self._train_params(), dtrain,
                            num_boost_round=self.num_boost_round if stops else self.rounds_without_val,
                            evals=evals, obj=self._obj(lay), evals_result=curve, verbose_eval=False,
                            early_stopping_rounds=self.early_stopping_rounds if stops else None, **kwargs)
        if stops:
            booster = booster[:int(booster.best_iteration) + 1]  # keep the best model, not the last one
        self.booster = booster
        self.info = {"best_iteration": int(booster.num_boosted_rounds()), "early_stopped": stops,
                     "val_curve": {k: list(map(float, v)) for k, v in curve.get("val", {}).items()}}
        return self.info

    def continue_fit(self, table, *, rounds: int, epochs: int = 0) -> None:
        """`rounds` more trees on `table` (continued boosting from the current booster)."""
        lay = self._layout(table, fitted=True)
        self.booster = xgb.train(self._train_params(), self._dmatrix(lay), num_boost_round=int(rounds),
                                 xgb_model=self.booster, obj=self._obj(lay))

    def _predict_rows(self, X: np.ndarray) -> np.ndarray:
        if not X.shape[0]:
            return np.zeros(0)
        if self.custom:  # inplace_predict would add base_score as the booster saved it: the same, but be explicit
            return np.asarray(self.booster.predict(self._dmatrix(X=X)), dtype=np.float64)
        return np.asarray(self.booster.inplace_predict(X), dtype=np.float64)

    def _gain(self) -> pd.Series:
        gain = self.booster.get_score(importance_type="total_gain")
        by_name = dict(zip(self.names, self.row_columns))
        return pd.Series({by_name[k]: v for k, v in gain.items()}, dtype=float)

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        self.booster.save_model(str(folder / "model.xgb.json"))

    @classmethod
    def load(cls, folder: Path) -> "XGBModel":
        m = cls._load_common(Path(folder))
        m.booster = xgb.Booster(model_file=str(Path(folder) / "model.xgb.json"))
        return m
