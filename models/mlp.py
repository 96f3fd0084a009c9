"""Torch MLP cost models: the segment-sum MLP on per-store features, a plain MLP on columns.

The network follows TenSet's MLP and MetaSchedule's SegmentSumMLP: an encoder applied to
every buffer store of a program, a sum over the stores of each record, two residual layers
and a linear decoder. Record-level columns (profiler counters) go through their own encoder
and are added to the store sum; with no stores this is a plain MLP. The default loss is
LambdaRank per task (TenSet's and MetaSchedule's choice): each batch holds records of one
task, so only orders within a task are learned. Inputs are log-compressed
(sign(x)·log1p|x|) and standardized with training statistics that are saved with the model.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from models.base import CostModel, FeatureSpec
from models.metrics import STOP_METRICS, ranking_metric
from models.pyfunc_model import compress, standardize
from models.tables import gather_segments


class CostMLP(torch.nn.Module):
    """Store encoder + segment sum (+ record encoder) -> two residual layers -> score."""

    def __init__(self, store_dim: int, record_dim: int, hidden: int):
        super().__init__()
        nn = torch.nn
        self.store_dim, self.record_dim, self.hidden = store_dim, record_dim, hidden

        def encoder(d):
            return nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())

        self.store_encoder = encoder(store_dim) if store_dim else None
        self.record_encoder = encoder(record_dim) if record_dim else None
        self.layer0 = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.layer1 = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU())
        self.decoder = nn.Linear(hidden, 1)

    def forward(self, records, stores=None, segments=None):
        x = torch.zeros((records.shape[0], self.hidden), dtype=torch.float32, device=records.device)
        if self.store_encoder is not None:
            x = x.index_add(0, segments, self.store_encoder(stores))
        if self.record_encoder is not None:
            x = x + self.record_encoder(records)
        x = self.layer0(x) + x
        x = self.layer1(x) + x
        return self.decoder(x).squeeze(-1)


def lambda_rank_loss(preds, labels, eps: float = 1e-10, sigma: float = 1.0):
    """LambdaLoss with NDCG weights over one list (Wang et al. 2018, as TenSet and MetaSchedule use).

    `labels` are normalized throughputs (higher is better); pairs with equal labels do not count."""
    y_pred, y_true = preds[None, :], labels[None, :]
    y_pred_sorted, idx = y_pred.sort(descending=True, dim=-1)
    y_true_sorted, _ = y_true.sort(descending=True, dim=-1)
    true_by_pred = torch.gather(y_true, 1, idx)
    diffs = true_by_pred[:, :, None] - true_by_pred[:, None, :]
    mask = torch.isfinite(diffs) & (diffs > 0)
    pos = torch.arange(1, y_pred.shape[1] + 1, device=preds.device, dtype=torch.float32)
    D = torch.log2(1.0 + pos)[None, :]
    max_dcg = torch.sum((torch.pow(2, y_true_sorted.clamp(min=0)) - 1) / D, dim=-1).clamp(min=eps)
    G = (torch.pow(2, true_by_pred.clamp(min=0)) - 1) / max_dcg[:, None]
    weights = torch.abs(torch.pow(D[:, :, None], -1.0) - torch.pow(D[:, None, :], -1.0)) * torch.abs(G[:, :, None] - G[:, None, :])
    score_diffs = (y_pred_sorted[:, :, None] - y_pred_sorted[:, None, :]).clamp(min=-1e8, max=1e8)
    score_diffs = torch.nan_to_num(score_diffs, nan=0.0)
    probs = (torch.sigmoid(sigma * score_diffs).clamp(min=eps) ** weights).clamp(min=eps)
    return -torch.sum(torch.log2(probs)[mask])


class Scaler:
    """sign(x)·log1p|x|, then (x - mean) / std with training statistics; NaN -> 0 (the mean)."""

    def __init__(self, mean: np.ndarray | None = None, std: np.ndarray | None = None):
        self.mean, self.std = mean, std

    def fit(self, x: np.ndarray, max_rows: int = 1 << 18, seed: int = 0) -> "Scaler":
        """Statistics from at most `max_rows` rows (a seeded sample): bounded memory at scale."""
        if len(x) > max_rows:
            x = x[np.sort(np.random.default_rng(seed).choice(len(x), max_rows, replace=False))]
        z = compress(x.astype(np.float64))
        self.mean = np.nan_to_num(np.nanmean(z, axis=0)) if len(z) else np.zeros(x.shape[1])
        std = np.nan_to_num(np.nanstd(z, axis=0)) if len(z) else np.ones(x.shape[1])
        self.std = np.where(std > 1e-8, std, 1.0)
        return self

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # the logged model's own scaling (models/pyfunc_model.py), so both agree
        return standardize(x, self.mean, self.std)

    def transform_chunked(self, x: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
        """The same as calling the scaler, in chunks (float32 out, no full float64 copy)."""
        out = np.empty(x.shape, dtype=np.float32)
        for i in range(0, len(x), chunk):
            out[i : i + chunk] = self(x[i : i + chunk])
        return out


class MLPModel(CostModel):
    """See the module docstring. Hyperparameters (conf/model/mlp.yaml): loss (lambdarank |
    mse), hidden, lr, weight_decay, batch_size, max_epochs, patience, grad_clip, use_stores,
    max_seconds (wall-clock cap on fit, 0 = none), early_stopping_metric (loss: the training
    loss on the validation part; peak1, peak5, apeak32, pair_acc: that ranking metric of the
    validation records, as models.gbdt.ranking_metric)."""

    name = "mlp"
    library = "mlp"
    flavor = "pytorch"

    def __init__(self, spec: FeatureSpec, *, name: str = "", loss: str = "lambdarank", hidden: int = 256,
                 lr: float = 7e-4, weight_decay: float = 1e-6, batch_size: int = 128, max_epochs: int = 100,
                 patience: int = 10, grad_clip: float = 0.5, use_stores: bool = True, max_seconds: float = 0,
                 early_stopping_metric: str = "loss", seed: int = 0, threads: int = 0):
        if loss not in ("lambdarank", "mse"):
            raise ValueError(f"model.loss={loss!r}; valid: lambdarank, mse")
        if early_stopping_metric not in STOP_METRICS:
            raise ValueError(f"model.early_stopping_metric={early_stopping_metric!r}; valid: {', '.join(STOP_METRICS)}")
        hyperparams = {"loss": loss, "hidden": int(hidden), "lr": float(lr), "weight_decay": float(weight_decay),
                       "batch_size": int(batch_size), "max_epochs": int(max_epochs), "patience": int(patience),
                       "grad_clip": float(grad_clip), "use_stores": bool(use_stores),
                       "max_seconds": float(max_seconds or 0), "early_stopping_metric": early_stopping_metric}
        use_stores = bool(use_stores) and bool(spec.store_columns)
        # With stores, the record encoder sees only the profiler columns: the static aggregate
        # repeats what the stores already say. (A saved spec is already in this form.)
        record_columns = [c for c in spec.columns if not (use_stores and c.startswith("static."))]
        super().__init__(FeatureSpec(spec.feature_set, record_columns, list(spec.store_columns) if use_stores else [],
                                     spec.target_kind), hyperparams=hyperparams, name=name, seed=seed, threads=threads)
        self.loss = loss
        self.calibrated = loss == "mse"
        self.hidden, self.lr, self.weight_decay = hyperparams["hidden"], hyperparams["lr"], hyperparams["weight_decay"]
        self.batch_size, self.max_epochs, self.patience = (hyperparams["batch_size"], hyperparams["max_epochs"],
                                                           hyperparams["patience"])
        self.grad_clip, self.max_seconds = hyperparams["grad_clip"], hyperparams["max_seconds"]
        self.stop_metric = early_stopping_metric
        self.record_scaler = Scaler()
        self.store_scaler = Scaler()
        self.net = None

    # -- data

    def _arrays(self, table):
        cols = [table.spec.columns.index(c) for c in self.spec.columns]
        records = table.records[:, cols] if cols else np.zeros((len(table), 0), np.float32)
        stores = table.stores if self.spec.store_columns else None
        return records, stores, table.offsets if stores is not None else None

    def _tensors(self, records, stores, offsets, rows, scaled: bool = False):
        """Tensors of records `rows`; `scaled`: the arrays went through the scalers already."""
        r = records[rows] if scaled or not records.shape[1] else self.record_scaler(records[rows])
        r = torch.from_numpy(np.ascontiguousarray(r, dtype=np.float32))
        if stores is None:
            return r, None, None
        idx, seg = gather_segments(offsets, rows)
        s = stores[idx] if scaled else self.store_scaler(stores[idx])
        return r, torch.from_numpy(s), torch.from_numpy(seg)

    def _scaled(self, arrays):
        """Scale once before the epochs instead of once per batch per epoch."""
        records, stores, offsets = arrays
        records = self.record_scaler.transform_chunked(records) if records.shape[1] else records
        return records, None if stores is None else self.store_scaler.transform_chunked(stores), offsets

    def _batches(self, task_codes: np.ndarray, rng, batch: int) -> list[np.ndarray]:
        out = []
        for t in np.unique(task_codes):
            rows = np.flatnonzero(task_codes == t)
            rows = rows[rng.permutation(len(rows))]
            out += [rows[i : i + batch] for i in range(0, len(rows), batch)]
        return [out[i] for i in rng.permutation(len(out))]

    def _loss(self, pred, y):
        if self.loss == "mse":
            return torch.mean((pred - y) ** 2)
        return lambda_rank_loss(pred, y) / max(len(y), 1)

    # -- training

    def fit(self, train, val) -> dict:
        torch.manual_seed(self.seed)
        torch.set_num_threads(self.threads or os.cpu_count() or 1)
        rng = np.random.default_rng(self.seed)
        records, stores, offsets = self._arrays(train)
        self.record_scaler.fit(records, seed=self.seed)
        if stores is not None:
            self.store_scaler.fit(stores, seed=self.seed)
        records, stores, offsets = self._scaled((records, stores, offsets))
        self.net = CostMLP(len(self.spec.store_columns), len(self.spec.columns), self.hidden)
        opt = self._optimizer()
        y_train = torch.from_numpy(train.labels.astype(np.float32))
        codes = train.task_codes
        val_arrays = self._scaled(self._arrays(val)) if len(val) else None
        best, best_state, bad, curve = math.inf, None, 0, {"train_loss": [], "val_loss": []}
        epochs = 0
        t0 = time.time()
        for epoch in range(self.max_epochs):
            curve["train_loss"].append(self._epoch(opt, (records, stores, offsets), y_train, codes, rng, scaled=True))
            epochs = epoch + 1
            if val_arrays is not None:
                if self.stop_metric == "loss":
                    v = self._eval_loss(val_arrays, val.labels, val.task_codes, self.batch_size)
                else:  # lower is better here: the metric's negative
                    v = -ranking_metric(self.stop_metric, self._predict_scaled(val_arrays), val.labels, val.task_codes)
                curve["val_loss"].append(v)
                if v < best - 1e-9:
                    best, bad = v, 0
                    best_state = {k: t.detach().clone() for k, t in self.net.state_dict().items()}
                else:
                    bad += 1
                    if bad >= self.patience:
                        break
            if self.max_seconds and time.time() - t0 > self.max_seconds:
                break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        self.info = {"epochs": epochs, "best_val_loss": None if best == math.inf else float(best),
                     "early_stopped": val_arrays is not None, **curve}
        return self.info

    def continue_fit(self, table, *, rounds: int = 0, epochs: int) -> None:
        """`epochs` more epochs on `table` (fine-tuning; the scalers keep their training statistics)."""
        rng = np.random.default_rng(self.seed)
        opt = self._optimizer()
        labels = torch.from_numpy(table.labels.astype(np.float32))
        for _ in range(int(epochs)):
            self._epoch(opt, self._arrays(table), labels, table.task_codes, rng, scaled=False)
        self.net.eval()

    def _optimizer(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def _epoch(self, opt, arrays, labels, codes, rng, scaled: bool) -> float:
        """One pass over per-task batches; returns the mean batch loss."""
        records, stores, offsets = arrays
        self.net.train()
        total, steps = 0.0, 0
        for rows in self._batches(codes, rng, self.batch_size):
            if len(rows) < 2 and self.loss == "lambdarank":
                continue
            r, s, seg = self._tensors(records, stores, offsets, rows, scaled=scaled)
            loss = self._loss(self.net(r, s, seg), labels[rows])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.grad_clip)
            opt.step()
            total += loss.item()
            steps += 1
        return total / max(steps, 1)

    def _eval_loss(self, arrays, labels, codes, batch) -> float:
        records, stores, offsets = arrays
        self.net.eval()
        total, n = 0.0, 0
        with torch.no_grad():
            for t in np.unique(codes):
                rows = np.flatnonzero(codes == t)
                for i in range(0, len(rows), batch):
                    sub = rows[i : i + batch]
                    if len(sub) < 2 and self.loss == "lambdarank":
                        continue
                    r, s, seg = self._tensors(records, stores, offsets, sub, scaled=True)
                    total += float(self._loss(self.net(r, s, seg), torch.from_numpy(labels[sub].astype(np.float32))))
                    n += 1
        return total / max(n, 1)

    # -- prediction

    def predict(self, table) -> np.ndarray:
        return self.predict_arrays(*self._arrays(table))

    def predict_arrays(self, records, stores, offsets) -> np.ndarray:
        if self.spec.store_columns and stores is None:
            raise ValueError("this MLP reads per-store rows: pass stores and offsets")
        return self._predict_scaled((records, stores, offsets), scaled=False)

    def _predict_scaled(self, arrays, scaled: bool = True) -> np.ndarray:
        records, stores, offsets = arrays
        n = records.shape[0]
        out = np.empty(n, dtype=np.float64)
        self.net.eval()
        with torch.no_grad():
            for i in range(0, n, 4096):
                rows = np.arange(i, min(n, i + 4096))
                r, s, seg = self._tensors(records, stores, offsets, rows, scaled=scaled)
                out[rows] = self.net(r, s, seg).numpy()
        return out

    # -- persistence

    def native(self):
        return self.net

    def save(self, folder: Path) -> None:
        self._save_common(folder)
        torch.save(self.net.state_dict(), folder / "mlp.pt")
        np.savez(folder / "scalers.npz", rm=self.record_scaler.mean, rs=self.record_scaler.std,
                 sm=self.store_scaler.mean if self.store_scaler.mean is not None else np.zeros(0),
                 ss=self.store_scaler.std if self.store_scaler.std is not None else np.zeros(0))
        (folder / "mlp.json").write_text(json.dumps({"store_dim": self.net.store_dim, "record_dim": self.net.record_dim,
                                                    "hidden": self.net.hidden}))

    @classmethod
    def load(cls, folder: Path) -> "MLPModel":
        folder = Path(folder)
        m = cls._load_common(folder)
        dims = json.loads((folder / "mlp.json").read_text())
        m.net = CostMLP(dims["store_dim"], dims["record_dim"], dims["hidden"])
        m.net.load_state_dict(torch.load(folder / "mlp.pt", weights_only=True))
        m.net.eval()
        z = np.load(folder / "scalers.npz")
        m.record_scaler = Scaler(z["rm"], z["rs"])
        m.store_scaler = Scaler(z["sm"], z["ss"]) if len(z["sm"]) else Scaler()
        return m
