"""models/splits.py: which networks a by_network split holds out when none is named, the
errors that say which split to use instead, and splits that a seed pins down (runs are
compared by their split seed, so seed s must cut the same parts in every process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from models import metrics as M
from models.splits import SplitError, make_split
from synthetic import latency_frame

# Five networks of one task each (name order: alexnet, bert, dcgan, mobilenet, resnet) and
# a standalone operator, which no held-out network takes.
NETWORKS = ["resnet", "bert", "alexnet", "mobilenet", "dcgan", ""]


def _records(networks=NETWORKS, per_task: int = 5) -> pd.DataFrame:
    return pd.DataFrame([dict(task_id=f"t{t}", record_id=f"t{t}r{i}", network=net)
                         for t, net in enumerate(networks) for i in range(per_task)])


@pytest.mark.parametrize(("seed", "fraction", "held"), [
    # numpy's default_rng(seed).permutation(5): seed 0 -> [2 4 3 0 1], seed 1 -> [4 0 1 2 3];
    # a fifth of 5 networks is 1, two fifths 2.
    (0, 0.2, ["dcgan"]), (1, 0.2, ["resnet"]), (0, 0.4, ["dcgan", "resnet"]), (1, 0.4, ["alexnet", "resnet"]),
])
def test_held_out_networks_follow_the_seed(seed, fraction, held):
    df = _records()
    sp = make_split(df, "by_network", seed=seed, test_fraction=fraction)
    assert sp.info["test_networks"] == held and sp.heldout == "+".join(held)
    tasks = {net: f"t{t}" for t, net in enumerate(NETWORKS)}
    assert sp.info["test_tasks"] == sorted(tasks[n] for n in held)
    assert set(df["task_id"].iloc[sp.test]) == {tasks[n] for n in held}
    assert sp.identity == ("by_network", "+".join(held), seed)


def test_at_least_one_network_is_held_out_and_one_is_kept():
    two = _records(["bert", "resnet"])
    # A fifth of 2 networks rounds to 0: one is held out all the same; nine tenths round to
    # 2: one is kept to train on.
    for fraction in (0.2, 0.9):
        sp = make_split(two, "by_network", seed=0, test_fraction=fraction)
        assert len(sp.info["test_networks"]) == 1 and len(sp.train) + len(sp.val) == 5


@pytest.mark.parametrize(("kwargs", "frame", "message"), [
    (dict(kind="by_network", val_unit="records"), _records(), "split.val_unit='records'; valid: tasks, network"),
    (dict(kind="by_records"), _records(), "split='by_records' is not a split; valid: within_task, by_task, by_network"),
    (dict(kind="by_task"), _records([""]), "by_task needs at least 2 tasks with measurements; this workspace has 1: "
                                           "use split=within_task"),
    (dict(kind="by_network"), _records(["", ""]), "no networks in this workspace .*use split=by_task"),
    (dict(kind="by_network"), _records(["bert", ""]), r"needs at least 2 networks; this workspace has \['bert'\]: "
                                                      "use split=by_task"),
    (dict(kind="by_network", test_networks=["gpt2"]), _records(),
     r"split.test_networks names \['gpt2'\], not in this workspace; its networks: \['alexnet', 'bert', 'dcgan', "),
])
def test_a_split_that_cannot_be_made_says_what_to_use(kwargs, frame, message):
    with pytest.raises(SplitError, match=message):
        make_split(frame, **kwargs)


def test_holding_out_a_network_that_calls_every_task_is_refused():
    df = _records(["bert", "resnet"])
    # bert calls both tasks (resnet's too): holding it out leaves nothing to train on.
    members = pd.DataFrame({"task_id": ["t0", "t1", "t1"], "group": ["bert", "bert", "resnet"]})
    with pytest.raises(SplitError, match=r"holding out \['bert'\] leaves no training records"):
        make_split(df, "by_network", test_networks=["bert"], members=members)


def test_by_task_cuts_test_and_validation_by_whole_tasks():
    df = _records([""] * 10)
    sp = make_split(df, "by_task", seed=0)
    # 10 tasks: a fifth (2) for test; of the 8 left a fifth rounds to 2 for validation.
    assert len(sp.info["test_tasks"]) == 2 and len(sp.info["val_tasks"]) == 2 and sp.info["val_unit"] == "tasks"
    assert sp.sizes() == {"train": 30, "val": 10, "test": 10}
    # numpy's default_rng(0).permutation(10) starts 4, 6: tasks t4 and t6, rows 20-24 and 30-34.
    assert sp.info["test_tasks"] == ["t4", "t6"]
    assert sp.test.tolist() == [*range(20, 25), *range(30, 35)]


SPLITS_IN_A_CHILD = """
import json, sys
import pandas as pd
from models.splits import make_split
nets = ["resnet", "bert", "alexnet", "mobilenet", "dcgan", ""]
df = pd.DataFrame([dict(task_id=f"t{t}", record_id=f"t{t}r{i}", network=n) for t, n in enumerate(nets)
                   for i in range(5)])
out = {}
for kind in ("within_task", "by_task", "by_network"):
    sp = make_split(df, kind, seed=int(sys.argv[1]))
    out[kind] = [sp.train.tolist(), sp.val.tolist(), sp.test.tolist(), sp.info]
print(json.dumps(out, sort_keys=True))
"""


def test_a_seed_cuts_the_same_parts_in_every_process():
    """String hashing differs from one Python process to the next (PYTHONHASHSEED): a split
    that depended on the order of a set of task names would differ between the run that
    trained a model and the one that compares it."""
    def child(hash_seed: str, seed: int) -> dict:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", SPLITS_IN_A_CHILD, str(seed)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout)

    first, second = child("1", 3), child("2", 3)
    assert first == second
    here = make_split(_records(), "by_network", seed=3)
    assert first["by_network"][2] == here.test.tolist() and first["by_network"][3] == json.loads(json.dumps(here.info))
    assert child("1", 4)["by_task"] != first["by_task"]  # another seed, other parts


# ---------------------------------------------------------------------------- the three kinds of split


def _task_records(n_tasks=6, per_task=10, networks=None) -> pd.DataFrame:
    rows = []
    for t in range(n_tasks):
        for i in range(per_task):
            rows.append(dict(task_id=f"t{t}", record_id=f"t{t}r{i}",
                             network=(networks[t] if networks else "")))
    return pd.DataFrame(rows)


def _check_partition(sp, n):
    allrows = np.concatenate([sp.train, sp.val, sp.test])
    assert len(allrows) == n and len(np.unique(allrows)) == n


def test_within_task_split():
    df = _task_records()
    sp = make_split(df, "within_task", seed=1)
    _check_partition(sp, len(df))
    for t in df["task_id"].unique():
        rows = np.flatnonzero(df["task_id"] == t)
        assert len(np.intersect1d(rows, sp.test)) == 2 and len(np.intersect1d(rows, sp.val)) >= 1
    again = make_split(df, "within_task", seed=1)
    assert np.array_equal(sp.test, again.test)
    assert not np.array_equal(sp.test, make_split(df, "within_task", seed=2).test)


def test_by_task_split_holds_out_whole_tasks():
    df = _task_records(n_tasks=10)
    sp = make_split(df, "by_task", seed=0)
    _check_partition(sp, len(df))
    test_tasks = set(df["task_id"].iloc[sp.test])
    assert test_tasks == set(sp.info["test_tasks"]) and len(test_tasks) == 2
    assert not test_tasks & set(df["task_id"].iloc[sp.train])
    assert sp.info["val_unit"] == "tasks" and not set(sp.info["val_tasks"]) & set(df["task_id"].iloc[sp.train])
    with pytest.raises(SplitError, match="within_task"):
        make_split(_task_records(n_tasks=1), "by_task")


def test_by_network_split():
    nets = ["resnet", "resnet", "bert", "bert", "mobilenet", ""]
    df = _task_records(networks=nets)
    sp = make_split(df, "by_network", seed=0, test_networks=["bert"])
    _check_partition(sp, len(df))
    assert set(df["task_id"].iloc[sp.test]) == {"t2", "t3"}
    assert sp.info["test_networks"] == ["bert"]
    auto = make_split(df, "by_network", seed=0)
    assert len(auto.info["test_networks"]) == 1
    with pytest.raises(SplitError, match="not in this workspace"):
        make_split(df, "by_network", test_networks=["gpt"])
    with pytest.raises(SplitError, match="no networks in this workspace.*use split=by_task"):
        make_split(_task_records(), "by_network")
    with pytest.raises(SplitError, match="valid: within_task, by_task, by_network"):
        make_split(df, "random")


def test_by_network_shared_task_is_held_out_and_counts_in_both_networks():
    df = _task_records(n_tasks=4, per_task=6, networks=["resnet", "resnet", "bert", "bert"])
    members = pd.DataFrame({"task_id": ["t0", "t1", "t1", "t2", "t3"],
                            "group": ["resnet", "resnet", "bert", "bert", "bert"], "weight": [1, 2, 5, 1, 1]})
    sp = make_split(df, "by_network", test_networks=["bert"], members=members)
    assert set(df["task_id"].iloc[sp.test]) == {"t1", "t2", "t3"}  # t1 is also called by bert
    assert set(df["task_id"].iloc[sp.train]) | set(df["task_id"].iloc[sp.val]) == {"t0"}
    # the weighted score counts t1 in both networks with each network's weight
    lat = latency_frame({"t0": [1.0, 2.0], "t1": [1.0, 3.0]}, {"t0": 1, "t1": 1}, {"t0": "x", "t1": "x"})
    ev = M.evaluate(lat, np.array([0.0, 1.0, 0.0, 1.0]), members=members)  # always picks the slow one
    groups = ev.per_group.set_index("group")
    assert groups.loc["bert", "top1_score"] == pytest.approx(1 / 3)
    assert groups.loc["resnet", "top1_score"] == pytest.approx((1 * 1 + 2 * 1) / (1 * 2 + 2 * 3))


def test_by_network_validates_on_a_whole_training_network_rotating_with_the_seed():
    nets = ["resnet", "resnet", "bert", "bert", "mobilenet", "mobilenet", "vit", ""]
    df = _task_records(n_tasks=8, networks=nets)
    seen = set()
    for seed in range(3):
        sp = make_split(df, "by_network", seed=seed, test_networks=["bert"], val_unit="network")
        _check_partition(sp, len(df))
        (vnet,) = sp.info["val_networks"]
        assert sp.info["val_unit"] == "network" and vnet != "bert"
        val_tasks = set(df["task_id"].iloc[sp.val])
        assert val_tasks == {f"t{i}" for i, n in enumerate(nets) if n == vnet} == set(sp.info["val_tasks"])
        assert "t7" in set(df["task_id"].iloc[sp.train])  # a standalone operator always trains
        seen.add(vnet)
    assert seen == {"mobilenet", "resnet", "vit"}  # each training network validates once over 3 seeds
    # one training network left: validation by tasks, and the split says so
    two = make_split(_task_records(n_tasks=4, networks=["a", "a", "b", "b"]), "by_network", test_networks=["a"],
                     val_unit="network")
    assert two.info["val_unit"] != "network"
    with pytest.raises(SplitError, match="split.val_unit"):
        make_split(df, "by_network", val_unit="records")


def test_a_validation_network_is_scored_alone_as_a_held_out_one():
    """A validation network's task that a training network also calls counts in the
    validation network's top-1 only: not as a partial network of one task whose score would
    weigh as much as the whole network's in the part's mean."""
    # t0, t1: netA (held out); t2, t3: netB, t3 also called by netC; t4, t5: netC
    members = pd.DataFrame({"task_id": ["t0", "t1", "t2", "t3", "t3", "t4", "t5"],
                            "group": ["netA", "netA", "netB", "netB", "netC", "netC", "netC"], "weight": 1.0})
    rng = np.random.default_rng(0)
    frame = pd.DataFrame([{"task_id": f"t{t}", "record_id": f"t{t}r{i}", "network": "", "mean_s": float(m)}
                          for t in range(6) for i, m in enumerate(rng.uniform(1, 2, 10))])
    frame["label"] = frame.groupby("task_id")["mean_s"].transform("min") / frame["mean_s"]
    # seed 0 validates on the first training network in name order
    split = make_split(frame, "by_network", seed=0, test_networks=["netA"], members=members, val_unit="network")
    assert split.info["val_networks"] == ["netB"]
    val = frame.iloc[split.val]
    assert set(val["task_id"]) == {"t2", "t3"}
    # a model that picks t2's best record and t3's worst: netB's top-1 is what it got on both
    scores = np.where(val["task_id"] == "t2", val["label"], -val["label"])
    everyone = M.evaluate(val, scores, members=members)
    alone = M.evaluate(val, scores, members=split.scored_members(members, "val"))
    assert set(everyone.per_group["group"]) == {"netB", "netC"}  # netC: t3 alone, a partial network
    assert list(alone.per_group["group"]) == ["netB"]
    net_b = everyone.per_group.set_index("group").loc["netB", "top1_score"]
    assert alone.summary["top1_score"] == pytest.approx(net_b) != pytest.approx(everyone.summary["top1_score"])
    assert split.scored_members(members, "test")["group"].unique().tolist() == ["netA"]
    # a split that validates on tasks names no validation network: every membership scores
    by_tasks = make_split(frame, "by_network", seed=0, test_networks=["netA"], members=members)
    assert by_tasks.scored_members(members, "val") is members
