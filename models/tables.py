"""Training tables: successful measurements joined with features, labelled as TenSet does.

label = normalized throughput = (best mean latency of the record's task) / (its mean latency),
so every task's best record has label 1.0 and labels are comparable across tasks.

Feature sets (`features=`):
  static    MetaSchedule's PerStoreFeature: the per-store rows of each record (store models:
            the segment-sum MLP) and their program-level aggregate (tabular models: GBDT)
  profiler  per-record profiler counters: CPU counters on a cpu target, Nsight Compute
            metrics on a cuda target
  all       both: static aggregate + profiler columns, and the per-store rows
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from features import cpu_counters, static, task_context
from models.base import FeatureSpec
from pipeline.core import schema as S
from pipeline.core.workspace import Workspace, WorkspaceError, read_table

log = logging.getLogger(__name__)

FEATURE_SETS = ("static", "profiler", "all")


class FeatureSetError(WorkspaceError):
    """A feature set has no usable rows or columns in this workspace."""


@dataclass
class TrainingTable:
    """One row per record (`frame`), plus the per-store rows of each record for static sets."""

    workspace: str
    frame: pd.DataFrame  # record_id, task_id, name, network, group, weight, mean_s, label, <columns>
    spec: FeatureSpec
    groups: dict[str, list[str]] = field(default_factory=dict)  # "static"/"profiler" -> tabular columns
    stores: np.ndarray | None = None  # float32 [n_store_rows, len(spec.store_columns)]
    offsets: np.ndarray | None = None  # int64 [len(frame) + 1]: stores of record i = stores[o[i]:o[i+1]]
    notes: dict = field(default_factory=dict)  # what was dropped and why (logged with the run)
    members: pd.DataFrame | None = None  # task_id, group, weight (see `memberships`)

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def records(self) -> np.ndarray:
        """The record-level feature matrix (float32, NaN where a counter is missing)."""
        return self.frame[self.spec.columns].to_numpy(dtype=np.float32, na_value=np.nan)

    @property
    def labels(self) -> np.ndarray:
        return self.frame["label"].to_numpy(dtype=np.float64)

    @property
    def task_codes(self) -> np.ndarray:
        """The ranking group of each record: its task, split by machine and timer where the
        table holds several (their latencies are not compared: see LABEL_GROUP)."""
        keys = [k for k in LABEL_GROUP if k in self.frame.columns]
        if keys == ["task_id"] or self.frame[keys[1:]].nunique(dropna=False).max() <= 1:
            return pd.factorize(self.frame["task_id"], sort=True)[0]
        return self.frame.groupby(keys, sort=True, dropna=False).ngroup().to_numpy()

    def take(self, rows: np.ndarray) -> "TrainingTable":
        """The records at positions `rows` (stores re-packed to match)."""
        rows = np.asarray(rows, dtype=np.int64)
        frame = self.frame.iloc[rows].reset_index(drop=True)
        if self.stores is None:
            return replace(self, frame=frame)
        idx, _ = gather_segments(self.offsets, rows)
        counts = self.offsets[rows + 1] - self.offsets[rows]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return replace(self, frame=frame, stores=self.stores[idx], offsets=offsets)

    def store_frame(self, columns: list[str] | None = None) -> pd.DataFrame:
        """The pyfunc input form: one row per store (record_id, record `columns` (default: the
        table's), store columns)."""
        columns = list(self.spec.columns) if columns is None else list(columns)
        if self.stores is None:
            return self.frame[["record_id", *columns]].copy()
        counts = np.diff(self.offsets)
        rep = np.repeat(np.arange(len(self.frame)), counts)
        out = self.frame.iloc[rep][["record_id", *columns]].reset_index(drop=True)
        return pd.concat([out, pd.DataFrame(self.stores, columns=self.spec.store_columns)], axis=1)


def gather_segments(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Store-row indices of records `rows` and, for each, its position in `rows` (segment id)."""
    starts, ends = offsets[rows], offsets[rows + 1]
    counts = ends - starts
    seg = np.repeat(np.arange(len(rows)), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]) if len(rows) else np.zeros(0, np.int64)
    idx = np.repeat(starts, counts) + (np.arange(counts.sum()) - np.repeat(first, counts))
    return idx.astype(np.int64), seg.astype(np.int64)


# ----------------------------------------------------------------------------- labels


class MixedHardwareError(WorkspaceError):
    """Measurements of one workspace come from several machines and mixing was not asked for."""


# A measurement's `timer` when the kernel harness took it (the column is null there).
HARNESS = "harness"
# The records whose latencies a label compares: one task, timed on one machine by one timer.
LABEL_GROUP = ["task_id", "hardware", "timer"]

# What a row measured before hardware identity was recorded counts as.
UNRECORDED = "unrecorded (measured before the hardware was recorded)"


def hardware_of(meas: pd.DataFrame) -> pd.Series:
    """Each measurement's hardware identity: `hardware` (UNRECORDED where it is null), and
    where CPU rows of one `hardware` carry two CPU signatures (one model name, two CPUs),
    each signature's rows as a machine of their own. A row without a signature (written
    before it was recorded) stays with its `hardware`: it may be either. A GPU's rows are
    the GPU's, whatever CPU hosted it."""
    if "hardware" not in meas.columns:
        return pd.Series(UNRECORDED, index=meas.index)
    hw = meas["hardware"].astype(object).where(meas["hardware"].notna(), UNRECORDED)
    if "cpu_signature" not in meas.columns:
        return hw
    sig = meas["cpu_signature"].astype(object)
    known = sig.notna() & (meas["gpu_name"].isna() if "gpu_name" in meas.columns else True)
    several = known & hw.map(sig[known].groupby(hw[known]).nunique()).fillna(0).gt(1)
    return hw.where(~several, hw + " [" + sig.where(several, "").astype(str) + "]")


def check_one_machine(ws: Workspace, meas: pd.DataFrame) -> None:
    """Refuse measurements of several machines: a label compares a record's latency with
    its task's best, which means nothing across machines."""
    counts = hardware_of(meas).value_counts()
    if len(counts) > 1:
        which = " and ".join(f"{hw!r} ({n} records)" for hw, n in counts.items())
        raise MixedHardwareError(
            f"{ws.measurements} holds measurements of {len(counts)} machines: {which}. Labels compare each "
            f"record with its task's best latency, which is meaningless across machines. Set "
            f"train.allow_mixed_hardware=true to label each machine's records against that machine's own best "
            f"(docs/datasets.md: Merging datasets from several machines), or keep one machine's measurements.")


def usable_rows(meas: pd.DataFrame) -> pd.Series:
    """Which measurement rows are labels: no error, a positive latency, not found incorrect."""
    ok = meas["error"].isna() & np.isfinite(meas["mean_s"].astype(float)) & (meas["mean_s"].astype(float) > 0)
    if "correct" in meas.columns:
        ok &= meas["correct"].astype("boolean").fillna(True).astype(bool)
    return ok


def successful_measurements(ws: Workspace, *, allow_mixed_hardware: bool = False) -> pd.DataFrame:
    """Measurements without an error, with a positive latency and not found incorrect, of
    one machine (`allow_mixed_hardware`: of every machine, one row per record and machine)."""
    meas = read_table(ws.require(ws.measurements, "measure"), S.MEASUREMENTS)
    if meas.empty:
        raise WorkspaceError(f"{ws.measurements} has no rows: run `python -m pipeline stage=measure` first.")
    # an earlier selection's records (kept when stage=tasks force=true rebuilt the task table) are not this one's
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS, columns=["task_id"])
    meas = meas[meas["task_id"].isin(set(tasks["task_id"]))]
    if meas.empty:
        raise WorkspaceError(f"{ws.measurements}: no row is of a task in {ws.tasks} (the task table was rebuilt for "
                             f"another selection): run `python -m pipeline stage=sample`, replay and measure for it.")
    good = meas[usable_rows(meas)]
    if good.empty:
        errs = meas["error"].dropna()
        first = errs.iloc[0] if len(errs) else "latency not positive or output incorrect"
        raise WorkspaceError(f"{ws.measurements}: none of {len(meas)} measurements succeeded (first error: "
                             f"{first}); fix the build/run problem and re-run stage=replay/measure with force=true.")
    good = good.assign(hardware=hardware_of(good))
    if not allow_mixed_hardware:
        check_one_machine(ws, good)
    # A record measured twice (a re-run with force) keeps its last row.
    return good.drop_duplicates(["record_id", "hardware"], keep="last").reset_index(drop=True)


def labelled_records(ws: Workspace, *, allow_mixed_hardware: bool = False) -> pd.DataFrame:
    """record_id, task_id, name, network, group, weight, mean_s, label, hardware, timer for
    every good record. Labels are per task and timer (the harness's or an imported tuning
    run's), and per machine where several are allowed."""
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    meas = successful_measurements(ws, allow_mixed_hardware=allow_mixed_hardware)
    meas = meas[["record_id", "task_id", "mean_s", "hardware", "timer"]]
    meas = meas.assign(mean_s=meas["mean_s"].astype(np.float64), timer=meas["timer"].fillna(HARNESS).astype(str))
    meas["label"] = meas.groupby(LABEL_GROUP)["mean_s"].transform("min") / meas["mean_s"]
    t = tasks[["task_id", "name", "network", "weight"]].copy()
    t["network"] = t["network"].fillna("")
    t["weight"] = t["weight"].fillna(1).astype(np.int64)
    df = meas.merge(t, on="task_id", how="left")
    df["network"] = df["network"].fillna("")
    df["weight"] = df["weight"].fillna(1).astype(np.int64)
    df["group"] = np.where(df["network"] != "", df["network"], "all")
    return df.sort_values(["task_id", "record_id"]).reset_index(drop=True)


def memberships(ws: Workspace) -> pd.DataFrame:
    """task_id, group, weight: which networks call each task and how often.

    From network_tasks.parquet where the tasks stage wrote it (a task shared by two networks
    belongs to both, with each network's call count), else from the task table. Tasks of no
    network (the operator suite) form the group "all" with their own weight."""
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    path = getattr(ws, "network_tasks", None)
    if path is not None and path.exists():
        m = read_table(path)[["task_id", "network", "weight"]]
    else:
        m = tasks[["task_id", "network", "weight"]]
    m = m.assign(network=m["network"].fillna(""), weight=m["weight"].fillna(1).astype(np.int64))
    m = m.assign(group=np.where(m["network"] != "", m["network"], "all"))
    # tasks missing from the membership table still count once, in their own network
    rest = tasks[~tasks["task_id"].isin(m["task_id"])]
    if len(rest):
        rest = rest.assign(network=rest["network"].fillna(""), weight=rest["weight"].fillna(1).astype(np.int64))
        m = pd.concat([m, rest.assign(group=np.where(rest["network"] != "", rest["network"], "all"))[m.columns]])
    return m[["task_id", "group", "weight"]].drop_duplicates(["task_id", "group"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- features


@dataclass
class StaticFeatures:
    program: pd.DataFrame  # record_id + aggregate columns
    stores: pd.DataFrame  # record_id, store index column + store columns


def target_kind(ws: Workspace) -> str:
    """cpu or cuda, from the workspace's task table (the target each task was built for)."""
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    kinds = {json.loads(t).get("kind", "llvm") for t in tasks["target"].dropna()}
    return "cuda" if "cuda" in kinds else "cpu"


def load_static(ws: Workspace) -> StaticFeatures:
    """stage=collect's PerStoreFeature tables (error rows left out)."""
    if not (ws.features / "static").exists():
        raise FeatureSetError(f"{ws.features / 'static'} does not exist: run `python -m pipeline stage=collect` "
                              f"for workspace '{ws.name}' first.")
    program, stores = static.load(ws)
    return StaticFeatures(program, stores[["record_id", STORE_INDEX, *S.PER_STORE_FEATURE_NAMES]])


def load_profiler(ws: Workspace, kind: str, device: str) -> tuple[pd.DataFrame, dict]:
    """Per-record profiler counters of `device` (CPU counters or Nsight Compute) and, for
    columns without values, why. Error rows are left out."""
    if kind == "cuda":
        folder = ws.features / "ncu"
        part = folder / f"device={device}"
        path = part if part.exists() else folder
        if not path.exists() or not any(path.rglob("*.parquet")):
            raise FeatureSetError(f"{path} has no Nsight Compute table: run `python -m pipeline stage=collect` on "
                                  f"the GPU host for workspace '{ws.name}', or use features=static.")
        df = read_table(path)
        if "error" in df.columns:
            df = df[df["error"].isna()]
        meta = ("error", "n_kernels", "kernel_names", "device", *(f.name for f in S.HOST))
        df = df.drop(columns=[c for c in meta if c in df.columns])
        return df.drop_duplicates("record_id", keep="last").reset_index(drop=True), {}
    path = ws.features / "cpu" / f"device={device}"
    if not path.exists() or not any(path.rglob("*.parquet")):
        raise FeatureSetError(f"{path} has no CPU counter table: run `python -m pipeline stage=collect` for "
                              f"workspace '{ws.name}' (target={device}), or use features=static.")
    df, reasons = cpu_counters.load(ws, device)
    return df.drop(columns=[c for c in ("device", "calls") if c in df.columns]), reasons


def _usable_columns(df: pd.DataFrame, exclude: list[str]) -> tuple[list[str], dict]:
    """Numeric feature columns that have at least one value and are not excluded by pattern."""
    dropped = {}
    cols = []
    pats = [re.compile(p) for p in exclude]
    for c in df.columns:
        if c == "record_id" or not pd.api.types.is_numeric_dtype(df[c]):
            continue
        if any(p.search(c) for p in pats):
            dropped[c] = "excluded by features.exclude"
            continue
        if df[c].isna().all():
            dropped[c] = "no value in any record"
            continue
        cols.append(c)
    return cols, dropped


def build_table(ws: Workspace, feature_set: str, exclude: list[str] | None = None, device: str | None = None,
                *, allow_mixed_hardware: bool = False) -> TrainingTable:
    """The training table of a workspace for one feature set (see the module docstring)."""
    if feature_set not in FEATURE_SETS:
        raise FeatureSetError(f"features={feature_set!r} is not a feature set; valid: {', '.join(FEATURE_SETS)}")
    exclude = list(exclude or [])
    recs = labelled_records(ws, allow_mixed_hardware=allow_mixed_hardware)
    kind = target_kind(ws)
    notes: dict = {"records_measured": len(recs)}
    groups: dict[str, list[str]] = {}
    frame = recs
    stores_df = None
    if feature_set in ("static", "all"):
        st = load_static(ws)
        cols, dropped = _usable_columns(st.program, exclude)
        groups["static"] = [f"static.{c}" for c in cols]
        prog = st.program[["record_id", *cols]].rename(columns={c: f"static.{c}" for c in cols})
        frame = frame.merge(prog, on="record_id", how="inner")
        # the task's operator kind and size: not a feature column of its own, read by the
        # models that ask for it (task_context=true)
        frame = frame.merge(task_context.of_workspace(ws), on="task_id", how="left")
        stores_df = st.stores
        notes["static_dropped"] = dropped
    if feature_set in ("profiler", "all"):
        prof, reasons = load_profiler(ws, kind, device or ("cpu" if kind == "cpu" else ""))
        cols, dropped = _usable_columns(prof, exclude)
        dropped.update({c: reasons[c] for c in dropped if c in reasons})
        if prof.empty or not cols:
            why = "; ".join(f"{c}: {r}" for c, r in list(dropped.items())[:8]) or "no rows"
            raise FeatureSetError(
                f"features={feature_set}: the {kind} profiler table of {ws.root} has no usable counter "
                f"({len(prof)} rows; {why}). Run `python -m pipeline stage=collect` on a machine where the "
                f"profiler works, or use features=static.")
        groups["profiler"] = [f"profiler.{c}" for c in cols]
        frame = frame.merge(prof[["record_id", *cols]].rename(columns={c: f"profiler.{c}" for c in cols}),
                            on="record_id", how="inner")
        notes["profiler_dropped"] = dropped
    notes["records_without_features"] = int(len(recs) - len(frame))
    if frame.empty:
        raise FeatureSetError(
            f"features={feature_set}: none of the {len(recs)} measured records of {ws.root} has {feature_set} "
            f"features: run `python -m pipeline stage=collect` (force=true to redo it).")
    if notes["records_without_features"]:
        log.warning("features=%s: %d measured records have no features and are left out",
                    feature_set, notes["records_without_features"])
    frame = frame.sort_values(["task_id", "record_id"]).reset_index(drop=True)
    columns = [c for g in ("static", "profiler") for c in groups.get(g, [])]
    store_columns: list[str] = []
    stores = offsets = None
    if stores_df is not None:
        store_columns = list(S.PER_STORE_FEATURE_NAMES)
        sd = stores_df[stores_df["record_id"].isin(frame["record_id"])]
        sd = sd.assign(_pos=sd["record_id"].map(pd.Series(np.arange(len(frame)), index=frame["record_id"])))
        sd = sd.sort_values(["_pos", STORE_INDEX], kind="stable")
        stores = sd[store_columns].to_numpy(dtype=np.float32, na_value=np.nan)
        counts = np.bincount(sd["_pos"].to_numpy(), minlength=len(frame))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    spec = FeatureSpec(feature_set=feature_set, columns=columns, store_columns=store_columns, target_kind=kind)
    return TrainingTable(ws.name, frame, spec, groups, stores, offsets, notes, memberships(ws))


STORE_INDEX = "store_index"


def restricted_table(workspace: str | Path, spec: FeatureSpec, exclude_tasks=()):
    """The workspace's training table restricted to `spec`'s columns and without the records of
    `exclude_tasks` (the model's held-out test tasks: a refit must not learn what the model
    was not trained on), or None with the reason."""
    root = Path(workspace)
    if not root.exists():
        return None, f"workspace {root} is not on this machine"
    try:
        table = build_table(Workspace(root), spec.feature_set)
    except Exception as e:  # noqa: BLE001 - an unusable workspace only disables the union mode
        return None, f"{type(e).__name__}: {e}"
    missing = [c for c in [*spec.columns, *spec.store_columns]
               if c not in table.frame.columns and c not in table.spec.store_columns]
    if missing:
        return None, f"workspace {root} lacks {len(missing)} of the model's columns, e.g. {missing[:3]}"
    idx = [table.spec.store_columns.index(c) for c in spec.store_columns]
    stores = table.stores[:, idx] if table.stores is not None and idx else None
    keep = ["record_id", "task_id", "label", *spec.columns]
    table = replace(table, frame=table.frame[keep].copy(), spec=spec, stores=stores,
                    offsets=table.offsets if stores is not None else None)
    if exclude_tasks:
        table = table.take(np.flatnonzero(~table.frame["task_id"].isin(set(exclude_tasks)).to_numpy()))
    return table, ""


def concat_tables(a: "TrainingTable", b: "TrainingTable") -> "TrainingTable":
    """`b`'s rows after `a`'s (`b` has at least `a`'s columns), stores and offsets joined."""
    frame = pd.concat([a.frame, b.frame[a.frame.columns]], ignore_index=True)
    if a.stores is None:
        return replace(a, frame=frame, stores=None, offsets=None)
    stores = np.concatenate([a.stores, b.stores])
    offsets = np.concatenate([a.offsets, a.offsets[-1] + b.offsets[1:]])
    return replace(a, frame=frame, stores=stores, offsets=offsets)
