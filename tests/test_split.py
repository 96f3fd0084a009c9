"""models/splits.py: which networks a by_network split holds out when none is named, the
errors that say which split to use instead, and splits that a seed pins down (runs are
compared by their split seed, so seed s must cut the same parts in every process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT
from models.splits import SplitError, make_split

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
