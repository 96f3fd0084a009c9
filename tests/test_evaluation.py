"""models/evaluation.py: the tables that stage=compare builds from many training runs,
on a handful of runs whose means, spreads and order are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from models import evaluation as E

# val_top1_score and test_top1_score of each by_network run: (model, held-out network, seed).
# Model "a" validates better than ms_xgb on average but tests worse: an order made on
# validation must put "a" first. Its resnet runs have a third seed, so the mean over
# networks (.6) differs from the mean over runs (.58).
VAL = {("a", "bert", 0): 0.8, ("a", "bert", 1): 0.6, ("a", "resnet", 0): 0.5, ("a", "resnet", 1): 0.5,
       ("a", "resnet", 2): 0.5,
       ("ms_xgb", "bert", 0): 0.9, ("ms_xgb", "bert", 1): 0.7, ("ms_xgb", "resnet", 0): 0.3,
       ("ms_xgb", "resnet", 1): 0.4}
TEST = {("a", "bert", 0): 0.1, ("a", "bert", 1): 0.3, ("a", "resnet", 0): 0.2, ("a", "resnet", 1): 0.2,
        ("a", "resnet", 2): 0.2,
        ("ms_xgb", "bert", 0): 0.9, ("ms_xgb", "bert", 1): 0.9, ("ms_xgb", "resnet", 0): 0.8,
        ("ms_xgb", "resnet", 1): 0.8}
N_TASKS = {"bert": 10, "resnet": 20}


def _runs() -> pd.DataFrame:
    """A run_frame: the by_network runs above, and two by_task runs of "a" (held out: "")."""
    rows = [dict(model=m, features="static", split="by_network", heldout=h, seed=s, val_top1_score=v,
                 test_top1_score=TEST[(m, h, s)], test_n_tasks=N_TASKS[h], test_n_tasks_topk=N_TASKS[h] - 1)
            for (m, h, s), v in VAL.items()]
    rows += [dict(model="a", features="static", split="by_task", heldout="", seed=s, val_top1_score=v,
                  test_top1_score=v, test_n_tasks=5, test_n_tasks_topk=5) for s, v in ((0, 0.4), (1, 0.2))]
    return pd.DataFrame(rows)


def test_run_frame_reads_mlflow_columns_and_fills_metrics_no_run_logged():
    runs = pd.DataFrame({"tags.model": ["a"], "tags.features": ["static"], "tags.split": ["by_task"],
                         "tags.heldout": [""], "tags.split_seed": ["3"], "metrics.val_top1_score": [0.5],
                         "metrics.test_pair_acc": [0.75], "params.lr": ["0.1"]})
    frame = E.run_frame(runs)
    assert list(frame.columns[:5]) == list(E.KEYS)
    assert frame.loc[0, "val_top1_score"] == 0.5 and frame.loc[0, "test_pair_acc"] == 0.75
    assert "params.lr" not in frame.columns and "lr" not in frame.columns
    # Every metric a table shows exists, NaN where MLflow left it out.
    assert math.isnan(frame.loc[0, "test_spearman"]) and math.isnan(frame.loc[0, "val_n_tasks_topk"])


def test_heldout_table_means_spreads_and_order():
    table = E.heldout_table(_runs(), metrics=("top1_score",))
    # Networks in name order, then the mean row of each model; by_task runs are not in it.
    assert list(zip(table["heldout"], table["model"])) == [
        ("bert", "a"), ("bert", "ms_xgb"), ("resnet", "a"), ("resnet", "ms_xgb"), (E.MEAN, "a"), (E.MEAN, "ms_xgb")]
    t = table.set_index(["heldout", "model"])
    # Per network: mean over the two seeds, with their min and max.
    assert t.loc[("bert", "a"), ["val_top1_score", "val_top1_score_min", "val_top1_score_max"]].tolist() == \
        pytest.approx([0.7, 0.6, 0.8])
    assert t.loc[("resnet", "ms_xgb"), "val_top1_score"] == pytest.approx(0.35)
    assert t.loc[("bert", "a"), "n_seeds"] == 2 and t.loc[("bert", "a"), "n_heldout"] == 1
    assert t.loc[("resnet", "a"), "n_seeds"] == 3
    # The mean row: the mean of the networks' means (.7 and .5), min and max over networks;
    # the seeds that every network has.
    assert t.loc[(E.MEAN, "a"), ["val_top1_score", "val_top1_score_min", "val_top1_score_max"]].tolist() == \
        pytest.approx([0.6, 0.5, 0.7])
    assert t.loc[(E.MEAN, "ms_xgb"), "val_top1_score"] == pytest.approx((0.8 + 0.35) / 2)
    assert t.loc[(E.MEAN, "a"), "n_heldout"] == 2 and t.loc[(E.MEAN, "a"), "n_seeds"] == 2
    # Task counts add up over the held-out networks: 10 + 20 tasks, 9 + 19 counted by top-k.
    assert t.loc[(E.MEAN, "a"), "test_n_tasks"] == 30 and t.loc[(E.MEAN, "a"), "test_n_tasks_topk"] == 28
    assert E.heldout_table(_runs().query("split == 'by_task'")).empty


def test_ablation_table_orders_by_the_validation_metric_and_counts_wins():
    runs = _runs()
    # Model "c" has no validation figure: it goes last, whatever its test figures.
    runs = pd.concat([runs, runs[runs["model"] == "a"].assign(model="c", val_top1_score=np.nan,
                                                               test_top1_score=1.0)], ignore_index=True)
    heldout = E.heldout_table(runs, metrics=("top1_score",))
    ab = E.ablation_table(heldout, "val_top1_score", also=("test_top1_score",))
    # a (val .6) before ms_xgb (val .575), although ms_xgb's test figures are far better.
    assert list(ab["model"]) == ["a", "ms_xgb", "c"]
    row = ab.set_index("model").loc["a"]
    assert row["val_top1_score.bert"] == pytest.approx(0.7) and row["val_top1_score.resnet"] == pytest.approx(0.5)
    assert row["val_top1_score"] == pytest.approx(0.6) and row["test_top1_score"] == pytest.approx(0.2)
    # Against ms_xgb, per network on validation: bert .7 < .8 (lost), resnet .5 > .35 (won).
    assert dict(zip(ab["model"], ab["beats_ms_xgb"])) == {"a": 1, "ms_xgb": 0, "c": 0}
    assert E.ablation_table(heldout, "val_no_such_metric").empty


def test_split_table_pools_every_run_of_a_split():
    table = E.split_table(_runs(), metrics=("top1_score",)).set_index(["split", "model"])
    # a on by_network: .8, .6, .5, .5, .5 over five runs; on by_task: .4 and .2
    assert table.loc[("by_network", "a"), ["val_top1_score", "val_top1_score_min", "val_top1_score_max",
                                          "n_runs"]].tolist() == pytest.approx([0.58, 0.5, 0.8, 5])
    assert table.loc[("by_task", "a"), ["val_top1_score", "n_runs"]].tolist() == pytest.approx([0.3, 2])
    assert len(table) == 3  # (by_network, a), (by_network, ms_xgb), (by_task, a)


def test_with_spread_writes_mean_min_max_as_text():
    table = pd.DataFrame({"m": [0.6, 0.5, np.nan], "m_min": [0.5, 0.5, np.nan], "m_max": [0.8, 0.5, np.nan],
                          "other": [1, 2, 3]})
    out = E.with_spread(table, ["m", "absent"], digits=2)
    assert list(out["m"]) == ["0.60 [0.50, 0.80]", "0.50", ""]
    assert list(out.columns) == ["m", "other"]


def test_random_rows_carry_the_runs_exact_chance_figures():
    runs = pd.DataFrame([dict(model=m, features="static", split="by_task", heldout="", seed=s,
                              test_top1_score=0.5, test_random_top1_score=r, test_random_top5_score=r + 0.1,
                              test_n_tasks=4, test_n_tasks_topk=3)
                         for s, r in ((0, 0.2), (1, 0.3)) for m in ("a", "b")])
    out = E.with_random_rows(runs)
    rnd = out[out["model"] == E.RANDOM].set_index("seed")
    assert len(out) == 6 and len(rnd) == 2  # one per (features, split, held-out, seed), not per model
    assert rnd.loc[0, "test_top1_score"] == 0.2 and rnd.loc[1, "test_top5_score"] == pytest.approx(0.4)
    assert (rnd["test_pair_acc"] == 0.5).all() and (rnd["test_spearman"] == 0.0).all()
    assert (rnd["test_topk_pair_acc"] == 0.5).all()
    assert (rnd["test_n_tasks_topk"] == 3).all()
    assert len(E.with_random_rows(runs.drop(columns="test_random_top1_score"))) == 4


# ---------------------------------------------------------------------------- paired intervals


def _per_task(model, seed, top1, best=1.0, heldout="net", features="static"):
    return [dict(features=features, model=model, heldout=heldout, seed=str(seed), task_id=f"t{i}", best_s=best,
                 top1_s=t) for i, t in enumerate(top1)]


def test_paired_intervals_against_the_reference():
    from models.evaluation import paired_intervals

    rows = []
    for seed in (0, 1):
        rows += _per_task("ms_xgb", seed, [2.0] * 20)  # score 0.5 on every task
        rows += _per_task("good", seed, [1.0] * 20)  # score 1.0: +0.5 on every resample
        rows += _per_task("same", seed, [2.0] * 20)
        rows += _per_task("mixed", seed, [1.0] * 10 + [4.0] * 10)  # sum best 20 / sum 50 = 0.4
    weights = pd.DataFrame({"heldout": "net", "task_id": [f"t{i}" for i in range(20)], "weight": 1.0})
    out = paired_intervals(pd.DataFrame(rows), weights, resamples=500).set_index("model")
    assert out.loc["good", "diff"] == pytest.approx(0.5) and out.loc["good", "lo"] == pytest.approx(0.5)
    assert out.loc["same", ["diff", "lo", "hi"]].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert out.loc["mixed", "diff"] == pytest.approx(-0.1) and out.loc["mixed", "lo"] < -0.1 < out.loc["mixed", "hi"]
    assert (out["n_tasks"] == 20).all() and (out["n_seeds"] == 2).all()
    # two networks: a `mean` row averaging them
    rows2 = rows + [{**r, "heldout": "net2"} for r in rows]
    weights2 = pd.concat([weights, weights.assign(heldout="net2")])
    both = paired_intervals(pd.DataFrame(rows2), weights2, resamples=200)
    mean = both[both["heldout"] == "mean"].set_index("model")
    assert mean.loc["good", "diff"] == pytest.approx(0.5) and mean.loc["good", "n_tasks"] == 40


def test_per_task_scores_share_score_and_margin():
    """Task by task: the share of the network's best-case time (weight x best) and of the
    time the first picks take (weight x picked, per seed), the top-1 score over seeds, and
    that minus the reference's on the same task."""
    from models.evaluation import per_task_scores

    rows = []
    for seed, picked in ((0, [2.0, 1.0]), (1, [4.0, 1.0])):  # t0 scored 0.5 then 0.25
        rows += _per_task("a", seed, picked, best=1.0)
        rows += _per_task("ms_xgb", seed, [1.0, 2.0], best=1.0)
    weights = pd.DataFrame({"heldout": "net", "task_id": ["t0", "t1"], "weight": [3.0, 1.0]})
    out = per_task_scores(pd.DataFrame(rows), weights).set_index(["model", "task_id"])
    assert out.loc[("a", "t0"), "share"] == pytest.approx(0.75) and out.loc[("a", "t1"), "share"] == pytest.approx(0.25)
    # of the picks' time: t0 took 3 x 2 of 7 s, then 3 x 4 of 13 s
    assert out.loc[("a", "t0"), "picked_share"] == pytest.approx((6 / 7 + 12 / 13) / 2)
    assert out.loc[("ms_xgb", "t1"), "picked_share"] == pytest.approx(0.4)
    assert out.groupby("model")["picked_share"].sum().tolist() == pytest.approx([1.0, 1.0])
    assert out.loc[("a", "t0"), "score"] == pytest.approx(0.375) and out.loc[("a", "t1"), "score"] == 1.0
    assert out.loc[("a", "t0"), "minus_ms_xgb"] == pytest.approx(-0.625)
    assert out.loc[("a", "t1"), "minus_ms_xgb"] == pytest.approx(0.5)
    assert (out["n_seeds"] == 2).all() and out.loc["ms_xgb", "minus_ms_xgb"].tolist() == [0.0, 0.0]
    # the largest share first within each (network, model); no reference: no margin, no error
    assert per_task_scores(pd.DataFrame(rows), weights)["task_id"].tolist()[:2] == ["t0", "t1"]
    alone = per_task_scores(pd.DataFrame([r for r in rows if r["model"] == "a"]), weights)
    assert alone["minus_ms_xgb"].isna().all() and len(alone) == 2


def test_paired_over_runs_margins_the_choice_and_the_named_pairs():
    """The choice is the best mean validation top-1 over runs ("a": .58 against .575); its
    margins are paired over the four (network, seed) runs both have; random rows are not models."""
    runs = E.with_random_rows(_runs().assign(test_random_top1_score=0.1))
    out = E.paired_over_runs(runs, "val_top1_score", [("ms_xgb", "a")], metrics=("val_top1_score", "test_top1_score"),
                             resamples=400)
    t = out.set_index(["model", "reference", "metric"])
    assert set(out["model"]) | set(out["reference"]) == {"a", "ms_xgb"}
    val = t.loc[("a", "ms_xgb", "val_top1_score")]
    # runs both have: bert 0/1 (-.1, -.1), resnet 0/1 (+.2, +.1): the third resnet seed is unpaired
    assert val["diff"] == pytest.approx(0.025) and val["won"] == 2 and val["n_runs"] == 4
    assert -0.1 <= val["lo"] < 0.025 < val["hi"] <= 0.2
    test = t.loc[("a", "ms_xgb", "test_top1_score")]
    assert test["diff"] == pytest.approx(-0.65) and test["won"] == 0 and -0.8 <= test["lo"] <= test["hi"] <= -0.6
    assert t.loc[("ms_xgb", "a", "val_top1_score"), "diff"] == pytest.approx(-0.025)
    assert set(out["split"]) == {"by_network"}  # by_task has one model: nothing to pair
    # by_task runs pair by seed: "a" .4 and .2 against ms_xgb .3 and .3 on the same held-out tasks
    by_task = pd.concat([runs, pd.DataFrame([dict(model="ms_xgb", features="static", split="by_task", heldout="",
                                                  seed=s, val_top1_score=0.3) for s in (0, 1)])])
    t = E.paired_over_runs(by_task, "val_top1_score", metrics=("val_top1_score",), resamples=400)
    t = t.set_index(["split", "model", "reference", "metric"])
    task = t.loc[("by_task", "a", "ms_xgb", "val_top1_score")]
    assert task["diff"] == pytest.approx(0.0) and task["won"] == 1 and task["n_runs"] == 2
    assert t.loc[("by_network", "a", "ms_xgb", "val_top1_score"), "diff"] == pytest.approx(0.025)
    # one run in common has no spread to bootstrap: the pair is left out, not given a point interval
    one = by_task[(by_task["split"] == "by_task") & (by_task["seed"] == 0)]
    assert E.paired_over_runs(one, "val_top1_score", metrics=("val_top1_score",), resamples=100).empty
    # the reference is never the choice: with ms_xgb best on validation, "a" is still chosen
    ahead = runs.assign(val_top1_score=np.where(runs["model"] == "ms_xgb", 0.99, runs["val_top1_score"]))
    out = E.paired_over_runs(ahead, "val_top1_score", metrics=("val_top1_score",), resamples=100)
    assert out[["model", "reference"]].values.tolist() == [["a", "ms_xgb"]]
    assert out["diff"].iloc[0] < 0
    # naming the choice's own pair in `pairs` margins it once, not twice
    out = E.paired_over_runs(ahead, "val_top1_score", [("a", "ms_xgb")], metrics=("val_top1_score",), resamples=100)
    assert out[["model", "reference"]].values.tolist() == [["a", "ms_xgb"]]


def test_feature_margins_pair_each_model_with_itself_on_static_and_with_ms_xgb():
    """By seed (the same test records for every feature set): lgbm on profiler features minus
    lgbm on static, and each arm minus ms_xgb; an unpaired seed is left out; random is not a model."""
    rows = []
    for seed, (st, pr, ms) in enumerate([(0.5, 0.7, 0.4), (0.6, 0.9, 0.5), (0.4, 0.5, 0.4)]):
        rows += [dict(model="lgbm", features="static", split="by_task", heldout="", seed=str(seed), test_pair_acc=st),
                 dict(model="ms_xgb", features="static", split="by_task", heldout="", seed=str(seed), test_pair_acc=ms)]
        if seed < 2:
            rows.append(dict(model="lgbm", features="profiler", split="by_task", heldout="", seed=str(seed),
                             test_pair_acc=pr))
    runs = E.with_random_rows(pd.DataFrame(rows).assign(test_random_pair_acc=0.5))
    t = E.feature_margins(runs, metrics=("test_pair_acc",), resamples=200).set_index(["model", "features", "reference"])
    own = t.loc[("lgbm", "profiler", "lgbm/static")]
    assert own["diff"] == pytest.approx(0.25) and own["won"] == 2 and own["n_runs"] == 2
    assert 0.2 - 1e-9 <= own["lo"] <= own["hi"] <= 0.3 + 1e-9  # the two runs: +0.2 and +0.3
    assert t.loc[("lgbm", "static", "ms_xgb/static"), "n_runs"] == 3
    assert t.loc[("lgbm", "static", "ms_xgb/static"), "diff"] == pytest.approx(0.2 / 3)
    assert t.loc[("lgbm", "profiler", "ms_xgb/static"), "diff"] == pytest.approx(0.35)
    assert "random" not in set(t.index.get_level_values("model")) and len(t) == 3
    # one feature set: nothing to pair
    assert E.feature_margins(runs[runs["features"] == "static"]).empty
