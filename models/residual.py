"""A small model of what a frozen pretrained model gets wrong on the tasks being tuned.

A pretrained model carries what other networks taught it; the session's measurements say
where that prior is off for these tasks. Refitting the prior on a few hundred session records
(union or continued boosting) either costs minutes or lets the session's noise overwrite it.
Instead the prior stays as it is and a few dozen small trees learn a correction on top of it
(TenSet's fine-tuning on the target task, Pruner's online adaptation): LambdaRank per task,
started from the prior's own scores (LightGBM's `init_score`), on the session's candidates.
A candidate's score is then prior + correction. The correction reads a record's stores summed
and maximized per PerStoreFeature value and the number of stores: cheap enough for the
thousands of candidates MetaSchedule asks about per search round.
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np

from models.gbdt import grades

#: LightGBM settings of the correction: shallow trees, as few records as a session has
PARAMS = {"objective": "lambdarank", "num_leaves": 7, "learning_rate": 0.1, "min_data_in_leaf": 3,
          "min_data_in_bin": 1, "lambda_l2": 1.0, "verbose": -1, "deterministic": True}


#: relevance grades of the correction's ranking (rank quantiles within a task)
GRADES = 4


def record_rows(stores: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """[n_records, 2 * width + 1] float32: per record the sum and the maximum of each store
    value and the number of stores (zeros for a record without stores)."""
    counts = np.diff(offsets)
    n, width = len(counts), stores.shape[1]
    total = np.zeros((n, width), np.float64)
    peak = np.zeros((n, width), np.float64)
    has = counts > 0
    if has.any():
        starts = offsets[:-1][has]
        total[has] = np.add.reduceat(stores.astype(np.float64), starts, axis=0)
        peak[has] = np.maximum.reduceat(stores.astype(np.float64), starts, axis=0)
    return np.hstack([total, peak, counts[:, None]]).astype(np.float32)


class SessionResidual:
    """The correction: `fit` on a session's records, `predict` adds nothing until fitted."""

    def __init__(self, *, rounds: int = 30, levels: int = GRADES, seed: int = 0, threads: int = 0):
        self.rounds, self.levels, self.seed, self.threads = int(rounds), int(levels), int(seed), int(threads)
        self.booster: lgb.Booster | None = None

    def fit(self, rows: np.ndarray, prior: np.ndarray, labels: np.ndarray, task_codes: np.ndarray) -> int:
        """Fit on records grouped by task (labels: best cost / cost, 0 for a failed run);
        returns the trees kept. Tasks with fewer than 2 records teach no ranking: left out."""
        order = np.argsort(task_codes, kind="stable")
        codes = task_codes[order]
        _, sizes = np.unique(codes, return_counts=True)
        keep = np.repeat(sizes >= 2, sizes)
        if keep.sum() < 4:
            return 0
        order, codes = order[keep], codes[keep]
        _, sizes = np.unique(codes, return_counts=True)
        y = grades(labels[order], codes, self.levels)
        data = lgb.Dataset(rows[order], y, group=sizes, init_score=prior[order], free_raw_data=False)
        params = {**PARAMS, "seed": self.seed, "num_threads": self.threads or 1,
                  "label_gain": [float(2**i - 1) for i in range(self.levels)]}
        self.booster = lgb.train(params, data, num_boost_round=self.rounds)
        return self.booster.current_iteration()

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """The correction of each record (zeros before the first fit)."""
        if self.booster is None or not len(rows):
            return np.zeros(len(rows), np.float64)
        return np.asarray(self.booster.predict(rows, num_threads=self.threads or 1), np.float64)

    def to_string(self) -> str | None:
        return None if self.booster is None else self.booster.model_to_string()

    def load_string(self, text: str | None) -> None:
        self.booster = None if not text else lgb.Booster(model_str=text)
