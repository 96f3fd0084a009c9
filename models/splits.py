"""Train / validation / test splits of a training table (TenSet's three kinds).

  within_task  random records of every task (the model has seen the task: online tuning)
  by_task      held-out tasks (a new operator or shape)
  by_network   held-out networks: every task of a test network is held out (TenSet's
               main evaluation); a workspace without networks cannot be split this way

The validation part (early stopping) is cut from the training pool by the same unit as the
test part (records, tasks, tasks) when the pool has enough units, else by records. A split
is a pure function of the table, the kind, the fractions and the seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

KINDS = ("within_task", "by_task", "by_network")
HELD_NETWORKS = {"test": "test_networks", "val": "val_networks"}  # the info key of a part's whole networks


class SplitError(ValueError):
    """The workspace cannot be split as asked; the message says what to use instead."""


@dataclass
class Split:
    kind: str
    seed: int
    train: np.ndarray  # row positions in the table
    val: np.ndarray
    test: np.ndarray
    info: dict = field(default_factory=dict)  # held-out tasks / networks, how val was cut

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "val": len(self.val), "test": len(self.test)}

    @property
    def heldout(self) -> str:
        """The held-out networks ("+"-joined) of a by_network split, else "" (the test
        tasks or records of the other kinds follow from the seed)."""
        return "+".join(self.info.get("test_networks") or [])

    @property
    def identity(self) -> tuple[str, str, int]:
        """(kind, heldout, seed): runs with the same identity share train, val and test parts
        (on the same workspace), so only their metrics compare like with like."""
        return self.kind, self.heldout, int(self.seed)

    def scored_members(self, members: pd.DataFrame | None, part: str) -> pd.DataFrame | None:
        """The network memberships `part` is scored with: for the test part of a by_network
        split only the held-out networks, and for its validation part, where it validates on a
        whole network (`val_unit=network`), only that network. A held-out task that other
        networks also call counts in its held-out network's score, not in partial scores of the
        others (a few shared tasks, each such partial network's top-1 would weigh as much as the
        whole one's in the part's mean)."""
        held = self.info.get(HELD_NETWORKS.get(part, ""))
        if members is None or not held:
            return members
        return members[members["group"].isin(held)]


def training_only(split: Split, rows: np.ndarray, task_ids: np.ndarray, *,
                  per_task: int | None = None) -> Split:
    """The split with the records at `rows` (bool mask) kept out of the validation and test
    parts: records that may be trained on but must not judge a model (a tuning run's
    imported measurements, timed unlike the harness's labels every score is read on).
    `per_task` keeps at most that many of them per task (`task_ids`, one per record) in the training part,
    drawn with the split's seed: a task that tuning runs measured thousands of times would
    otherwise outweigh every other task in the ranking loss."""
    rows = np.asarray(rows, dtype=bool)
    if not rows.any():
        return split
    val, test, train = split.val[~rows[split.val]], split.test[~rows[split.test]], split.train
    info = {**split.info, "training_only": int(rows.sum()),
            "training_only_dropped": int(len(split.val) - len(val) + len(split.test) - len(test))}
    if per_task is not None:
        rng = np.random.default_rng(split.seed)
        extra = train[rows[train]]
        kept = [r[rng.permutation(len(r))[:int(per_task)]] for r in
                (extra[task_ids[extra] == t] for t in sorted(set(task_ids[extra].tolist())))]
        train = np.sort(np.concatenate([train[~rows[train]], *kept]))
        info["training_only_per_task"] = int(per_task)
    info["training_only_trained"] = int(rows[train].sum())
    return Split(split.kind, split.seed, train, val, test, info)


def _count(n: int, fraction: float) -> int:
    return int(round(n * fraction))


def _by_records(task_ids: np.ndarray, rows: np.ndarray, fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """Cut `fraction` of each task's records (at least one of a task with 3 or more) off `rows`."""
    keep, cut = [], []
    for tid in np.unique(task_ids[rows]):
        r = rows[task_ids[rows] == tid]
        r = r[rng.permutation(len(r))]
        n = _count(len(r), fraction)
        if len(r) >= 3:
            n = min(max(n, 1), len(r) - 2)
        else:
            n = 0
        cut.append(r[:n])
        keep.append(r[n:])
    return np.sort(np.concatenate(keep)) if keep else rows[:0], np.sort(np.concatenate(cut)) if cut else rows[:0]


def _by_units(units: np.ndarray, rows: np.ndarray, fraction: float, rng, min_left: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Cut whole units (tasks or networks) worth `fraction` of the units off `rows`."""
    names = np.array(sorted(set(units[rows].tolist())), dtype=object)
    n = min(max(_count(len(names), fraction), 1), len(names) - min_left)
    held = sorted(names[rng.permutation(len(names))[:n]].tolist())
    mask = np.isin(units[rows], held)
    return rows[~mask], rows[mask], held


VAL_UNITS = ("tasks", "network")


def make_split(frame: pd.DataFrame, kind: str, seed: int = 0, test_fraction: float = 0.2,
               val_fraction: float = 0.2, test_networks: list[str] | None = None,
               members: pd.DataFrame | None = None, val_unit: str = "tasks") -> Split:
    """Split the records of `frame` (columns task_id, network) into train/val/test positions.

    For by_network, `members` (task_id, group = network or "all") says which networks call a
    task; a task of a held-out network is held out even when a training network calls it
    too (TenSet's rule: no test task is trained on). `val_unit="network"` (by_network only)
    validates on one whole training network, as the test holds out a whole network (nested
    leave-one-network-out: seed s takes the s-th training network in name order, so seeds
    0..k-1 validate on each of k training networks in turn; one whose tasks would leave
    nothing to train on passes to the next); with fewer than 2 training networks the
    validation part is cut by tasks, and `info["val_unit"]` says so."""
    if val_unit not in VAL_UNITS:
        raise SplitError(f"split.val_unit={val_unit!r}; valid: {', '.join(VAL_UNITS)}")
    if kind not in KINDS:
        raise SplitError(f"split={kind!r} is not a split; valid: {', '.join(KINDS)}")
    rng = np.random.default_rng(seed)
    tasks = frame["task_id"].to_numpy(dtype=object)
    rows = np.arange(len(frame))
    info: dict = {}
    n_tasks = len(set(tasks.tolist()))
    if kind == "within_task":
        pool, test = _by_records(tasks, rows, test_fraction, rng)
        train, val = _by_records(tasks, pool, val_fraction, rng)
        info["val_unit"] = "records"
        return Split(kind, seed, train, val, test, info)

    if kind == "by_task":
        if n_tasks < 2:
            raise SplitError(f"split=by_task needs at least 2 tasks with measurements; this workspace has "
                             f"{n_tasks}: use split=within_task")
        pool, test, held = _by_units(tasks, rows, test_fraction, rng, min_left=1)
        info["test_tasks"] = held
    else:
        members = _network_members(frame, members, tasks)
        pool, test, held_tasks, names = _by_networks(tasks, rows, members, test_networks, test_fraction, rng, info)
        training = [n for n in names if n not in info["test_networks"]]
        val = _network_val(tasks, pool, members, training, held_tasks, seed) if val_unit == "network" else None
        if val is not None:
            vmask, vnet = val
            info.update(val_unit="network", val_networks=[vnet], val_tasks=sorted(set(tasks[pool][vmask].tolist())))
            return Split(kind, seed, np.sort(pool[~vmask]), np.sort(pool[vmask]), np.sort(test), info)
    if len(set(tasks[pool].tolist())) >= 3:
        train, val, vheld = _by_units(tasks, pool, val_fraction, rng, min_left=1)
        info["val_unit"] = "tasks"
        info["val_tasks"] = vheld
    else:
        train, val = _by_records(tasks, pool, val_fraction, rng)
        info["val_unit"] = "records"
    return Split(kind, seed, np.sort(train), np.sort(val), np.sort(test), info)


def _network_members(frame: pd.DataFrame, members: pd.DataFrame | None, tasks: np.ndarray) -> pd.DataFrame:
    """(task_id, group) of the tasks of `frame`: `members` where given, else each task's own
    network ("all" for a standalone operator)."""
    if members is None:
        nets = frame["network"].fillna("")
        members = pd.DataFrame({"task_id": frame["task_id"], "group": nets.where(nets != "", "all")})
    return members[members["task_id"].isin(set(tasks.tolist()))]


def _by_networks(tasks: np.ndarray, rows: np.ndarray, members: pd.DataFrame, test_networks: list[str] | None,
                 test_fraction: float, rng, info: dict) -> tuple[np.ndarray, np.ndarray, set, list[str]]:
    """(training pool, test rows, held-out tasks, every network's name): every task that a
    held-out network calls goes to test; `info` gets the held-out networks and tasks."""
    names = sorted({n for n in members["group"].tolist() if n != "all"})
    held = _held_out_networks(names, test_networks, test_fraction, rng)
    held_tasks = set(members.loc[members["group"].isin(held), "task_id"])
    mask = np.isin(tasks, list(held_tasks))
    pool, test = rows[~mask], rows[mask]
    if len(pool) == 0:
        raise SplitError(f"split=by_network: holding out {held} leaves no training records")
    info["test_networks"] = held
    info["test_tasks"] = sorted(set(tasks[test].tolist()))
    return pool, test, held_tasks, names


def _held_out_networks(names: list[str], test_networks: list[str] | None, test_fraction: float, rng) -> list[str]:
    """The networks named in `test_networks`, else `test_fraction` of `names` drawn by `rng`
    (at least one, and one left to train on)."""
    if not names:
        raise SplitError("split=by_network: no networks in this workspace (every task is a standalone "
                         "operator), use split=by_task")
    if test_networks:
        unknown = sorted(set(test_networks) - set(names))
        if unknown:
            raise SplitError(f"split.test_networks names {unknown}, not in this workspace; its networks: {names}")
        return sorted(test_networks)
    if len(names) < 2:
        raise SplitError(f"split=by_network needs at least 2 networks; this workspace has {names}: "
                         f"use split=by_task")
    n = min(max(_count(len(names), test_fraction), 1), len(names) - 1)
    return sorted(np.array(names, dtype=object)[rng.permutation(len(names))[:n]].tolist())


def _network_val(tasks: np.ndarray, pool: np.ndarray, members: pd.DataFrame, training: list[str],
                 held_tasks: set, seed: int) -> tuple[np.ndarray, str] | None:
    """(mask over `pool`, network) of the seed-th training network, or the next one that
    leaves tasks to train on; None with fewer than 2 training networks or none that fits."""
    for k in range(len(training) if len(training) >= 2 else 0):
        vnet = training[(int(seed) + k) % len(training)]
        vtasks = set(members.loc[members["group"] == vnet, "task_id"]) - held_tasks
        vmask = np.isin(tasks[pool], list(vtasks))
        if vmask.all() or not vmask.any():
            continue
        return vmask, vnet
    return None
