"""models/metrics.py on records small enough to score by hand: which tasks the top-k
figures count (`topk_min_records`), the early-stopping `ranking_metric`, and what tied and
NaN scores pick. Every expected value is worked out in the comments, not by the code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from models import metrics as M

from synthetic import latency_frame


def _records(lat_by_task: dict, weights: dict, groups: dict) -> pd.DataFrame:
    """Rows (task_id, mean_s, weight, group, label) with label = best latency of the task / latency."""
    rows = [dict(task_id=t, mean_s=lat, weight=weights[t], group=groups[t])
            for t, lats in lat_by_task.items() for lat in lats]
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    return df


# Task a (network n1, weight 1): 4 records; b (n1, weight 3) and c (n2, weight 1): 2 each.
LATENCIES = {"a": [1.0, 2.0, 4.0, 8.0], "b": [3.0, 1.0], "c": [2.0, 4.0]}
WEIGHTS = {"a": 1, "b": 3, "c": 1}
GROUPS = {"a": "n1", "b": "n1", "c": "n2"}


def test_topk_figures_count_only_tasks_with_topk_min_records():
    df = _records(LATENCIES, WEIGHTS, GROUPS)
    slowest_first = -df["label"].to_numpy()  # every task's top-1 pick is its slowest record
    ev = M.evaluate(df, slowest_first, calibrated=False, topk_min_records=3)
    assert dict(zip(ev.per_task["task_id"], ev.per_task["topk"])) == {"a": True, "b": False, "c": False}
    # Only task a counts: its pick runs 8 s against its best 1 s; its top-5 holds every record.
    assert ev.summary["peak1"] == pytest.approx(1 / 8) and ev.summary["peak5"] == 1.0
    groups = ev.per_group.set_index("group")
    assert groups.loc["n1", "n_tasks"] == 2 and groups.loc["n1", "n_tasks_topk"] == 1
    assert groups.loc["n1", "top1_score"] == pytest.approx(1 / 8)
    # A random pick of a: the mean of its latencies, 15 / 4 s.
    assert groups.loc["n1", "random_top1_score"] == pytest.approx(1 / 3.75)
    # n2's only task has 2 records: nothing to score, and the mean over groups skips it.
    assert groups.loc["n2", "n_tasks_topk"] == 0 and math.isnan(groups.loc["n2", "top1_score"])
    assert ev.summary["top1_score"] == pytest.approx(1 / 8)
    assert ev.summary["n_tasks"] == 3 and ev.summary["n_tasks_topk"] == 1
    # The other metrics count every task: each ranks every pair the wrong way round.
    assert ev.summary["pair_acc"] == 0.0 and ev.summary["spearman"] == pytest.approx(-1.0)

    every = M.evaluate(df, slowest_first, calibrated=False, topk_min_records=2)  # at least 2: all three
    assert every.summary["n_tasks_topk"] == 3
    # peak1: a 1/8, b 1/3 (3 s against 1 s), c 1/2 (4 s against 2 s)
    assert every.summary["peak1"] == pytest.approx((1 / 8 + 1 / 3 + 1 / 2) / 3)
    # n1 weighs a once and b three times: (1*1 + 3*1) / (1*8 + 3*3); n2: 2 / 4
    assert every.summary["top1_score"] == pytest.approx((4 / 17 + 2 / 4) / 2)


def test_topk_pair_acc_counts_the_tasks_top_k_counts():
    """Task a ordered slowest first, b and c fastest first: pair_acc averages the three tasks
    (0, 1, 1), topk_pair_acc only a, the one task with 3 records or more."""
    df = _records(LATENCIES, WEIGHTS, GROUPS)
    scores = np.where(df["task_id"] == "a", -df["label"], df["label"]).astype(float)
    ev = M.evaluate(df, scores, calibrated=False, topk_min_records=3)
    assert ev.summary["pair_acc"] == pytest.approx(2 / 3) and ev.summary["topk_pair_acc"] == 0.0
    assert M.evaluate(df, scores, calibrated=False, topk_min_records=2).summary["topk_pair_acc"] == pytest.approx(2 / 3)


def test_ranking_metric_by_hand():
    # Rows of two tasks, interleaved: task 0 labels 1, .5, .25 scored .1, .9, .5 (predicted
    # order: .5, .25, 1); task 1 has two records of label 1.
    codes = np.array([0, 1, 0, 0, 1])
    labels = np.array([1.0, 1.0, 0.5, 0.25, 1.0])
    scores = np.array([0.1, 2.0, 0.9, 0.5, 1.0])
    # peak1: task 0 picks .5, task 1 a 1
    assert M.ranking_metric("peak1", scores, labels, codes) == pytest.approx((0.5 + 1.0) / 2)
    # peak5: 5 picks take every record of both
    assert M.ranking_metric("peak5", scores, labels, codes) == 1.0
    # apeak32: task 0's curve is .5, .5, then 1 for k = 3..32; task 1's is 1 throughout
    assert M.ranking_metric("apeak32", scores, labels, codes) == pytest.approx(((0.5 + 0.5 + 30) / 32 + 1.0) / 2)
    # pair_acc: of task 0's three pairs only (.5, .25) is in the right order; task 1 has no
    # pair with different labels, so it is left out rather than counted as 0 or 1
    assert M.ranking_metric("pair_acc", scores, labels, codes) == pytest.approx(1 / 3)
    assert math.isnan(M.ranking_metric("pair_acc", scores[[1, 4]], labels[[1, 4]], codes[[1, 4]]))
    assert set(M.STOP_METRICS) - {"loss"} == {"peak1", "peak5", "apeak32", "pair_acc"}


def test_tied_scores_pick_the_first_record_in_table_order():
    """A model that scores records alike gets the first of them: the same pick on every
    run, so a figure does not change from one evaluation of the same model to the next."""
    tied = np.ones(2)
    assert M.peak_score(np.array([0.5, 1.0]), tied, 1) == 0.5
    assert M.peak_score(np.array([1.0, 0.5]), tied, 1) == 1.0
    assert M.pairwise_accuracy(np.array([0.5, 1.0, 0.25]), np.ones(3)) == 0.5  # a tie counts half
    # Task a scored alike: its first record (1 s) is the top-1 pick; b's tie picks its 3 s record.
    df = _records({"a": [1.0, 2.0], "b": [3.0, 1.0]}, {"a": 1, "b": 1}, {"a": "n", "b": "n"})
    ev = M.evaluate(df, np.zeros(4))
    assert list(ev.per_task["top1_s"]) == [1.0, 3.0]
    assert ev.summary["top1_score"] == pytest.approx((1 + 1) / (1 + 3))


def test_nan_scores_rank_last_and_count_as_misordered():
    """A NaN score (a model that diverged on some input) never wins a top-k pick, and each
    pair it is in counts as ordered wrong, so NaNs cannot raise a figure."""
    labels = np.array([1.0, 0.5, 0.25])
    scores = np.array([np.nan, 2.0, 1.0])
    assert M.peak_score(labels, scores, 1) == 0.5  # the .5 record, not the NaN-scored best one
    np.testing.assert_allclose(M.peak_curve(labels, scores, 4), [0.5, 0.5, 1.0, 1.0])
    # pairs (1, .5) and (1, .25) hold the NaN: wrong; (.5, .25) is scored 2 > 1: right
    assert M.pairwise_accuracy(labels, scores) == pytest.approx(1 / 3)
    m = M.task_metrics(labels, scores)
    assert math.isnan(m["spearman"]) and math.isnan(m["rmse"])
    df = _records({"a": [1.0, 2.0, 4.0]}, {"a": 1}, {"a": "n"})
    ev = M.evaluate(df, scores)
    assert ev.per_task.loc[0, "top1_s"] == 2.0 and ev.summary["top1_score"] == pytest.approx(1 / 2)


# ---------------------------------------------------------------------------- scores, correlations and chance


def test_peak_score_by_hand():
    labels = np.array([0.5, 1.0, 0.25, 0.8])
    scores = np.array([4.0, 2.0, 3.0, 1.0])  # predicted order: 0, 2, 1, 3
    assert M.peak_score(labels, scores, 1) == pytest.approx(0.5)
    assert M.peak_score(labels, scores, 2) == pytest.approx(0.5)
    assert M.peak_score(labels, scores, 3) == pytest.approx(1.0)
    np.testing.assert_allclose(M.peak_curve(labels, scores, 6), [0.5, 0.5, 1, 1, 1, 1])


def test_pairwise_accuracy():
    y = np.array([0.1, 0.2, 0.3, 0.4])
    assert M.pairwise_accuracy(y, y * 10) == 1.0
    assert M.pairwise_accuracy(y, -y) == 0.0
    assert M.pairwise_accuracy(y, np.zeros(4)) == 0.5  # ties count half
    # one swapped pair out of six
    assert M.pairwise_accuracy(y, np.array([1.0, 2.0, 4.0, 3.0])) == pytest.approx(5 / 6)
    assert math.isnan(M.pairwise_accuracy(np.ones(3), np.arange(3)))  # no pair with different labels


def test_topk_recall_and_sampling():
    y = np.arange(10, dtype=float)
    assert M.topk_recall(y, y, 3) == 1.0
    assert M.topk_recall(y, -y, 3) == 0.0
    assert M.topk_recall(y, np.array([0, 1, 2, 3, 4, 5, 6, 9, 8, 0.5]), 3) == pytest.approx(2 / 3)
    assert math.isnan(M.sampled_topk_recall(y, y))  # fewer than 128 records: skipped
    rng = np.random.default_rng(0)
    big = rng.random(300)
    assert M.sampled_topk_recall(big, big) == 1.0
    noisy = M.sampled_topk_recall(big, big + rng.normal(0, 0.3, 300), seed=1)
    assert 0.0 < noisy < 1.0


def test_correlations_match_scipy():
    rng = np.random.default_rng(3)
    y, s = rng.random(50), rng.random(50)
    m = M.task_metrics(y, s)
    assert m["spearman"] == pytest.approx(stats.spearmanr(y, s).statistic)
    assert m["kendall"] == pytest.approx(stats.kendalltau(y, s).statistic)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - s) ** 2)))
    assert m["r2"] == pytest.approx(1 - np.sum((y - s) ** 2) / np.sum((y - y.mean()) ** 2))
    un = M.task_metrics(y, s, calibrated=False)
    assert math.isnan(un["rmse"]) and math.isnan(un["r2"]) and un["spearman"] == m["spearman"]
    s[7] = np.nan  # a model that emits a NaN score: both errors say so, neither skips it
    broken = M.task_metrics(y, s)
    assert math.isnan(broken["rmse"]) and math.isnan(broken["r2"])


def test_weighted_topk_score_by_hand():
    # task a (weight 2): latencies 1, 2, 4; task b (weight 1): 10, 5
    df = latency_frame({"a": [1.0, 2.0, 4.0], "b": [10.0, 5.0]}, {"a": 2, "b": 1}, {"a": "net", "b": "net"})
    # scores pick a2 (4 s) first for a, b0 (10 s) first for b
    scores = np.array([1.0, 2.0, 3.0, 1.0, 0.0])
    df["score"] = scores
    best = 2 * 1.0 + 1 * 5.0
    assert M.weighted_topk_score(df, 1) == pytest.approx(best / (2 * 4.0 + 1 * 10.0))
    assert M.weighted_topk_score(df, 2) == pytest.approx(best / (2 * 2.0 + 1 * 5.0))
    assert M.weighted_topk_score(df, 5) == pytest.approx(1.0)


def test_evaluate_aggregates_per_task_and_group():
    df = latency_frame({"a": [1.0, 2.0, 4.0, 8.0], "b": [3.0, 1.0], "c": [2.0, 2.5, 3.0]},
                {"a": 1, "b": 3, "c": 1}, {"a": "n1", "b": "n1", "c": "n2"})
    ev = M.evaluate(df, df["label"].to_numpy())  # a perfect model
    assert list(ev.per_task["task_id"]) == ["a", "b", "c"]
    assert ev.summary["peak1"] == 1.0 and ev.summary["pair_acc"] == 1.0 and ev.summary["rmse"] == 0.0
    assert ev.summary["top1_score"] == 1.0 and len(ev.per_group) == 2
    assert ev.summary["n_tasks_recall32of128"] == 0 and math.isnan(ev.summary["recall32of128"])
    worst = M.evaluate(df, -df["label"].to_numpy(), calibrated=False)
    assert worst.summary["pair_acc"] == 0.0 and math.isnan(worst.summary["rmse"])
    # per task a: worst pick is 8 s vs best 1 s
    assert worst.per_task.set_index("task_id").loc["a", "peak1"] == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="scores for"):
        M.evaluate(df, np.zeros(3))


def test_random_pick_scores_are_exact_expectations():
    # one task, latencies 1, 2, 4 s: a random pick has expected latency 7/3 s -> top-1 3/7;
    # the best of 2 random picks: 1 s with prob 2/3, 2 s with prob 1/3 -> 4/3 s
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 2) == pytest.approx(4 / 3)
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 1) == pytest.approx(7 / 3)
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 9) == pytest.approx(1.0)
    df = latency_frame({"a": [1.0, 2.0, 4.0]}, {"a": 1}, {"a": "net"})
    ev = M.evaluate(df, np.array([3.0, 2.0, 1.0]))
    assert ev.summary["random_top1_score"] == pytest.approx(3 / 7)
    assert ev.summary["random_top5_score"] == pytest.approx(1.0)  # 3 records: the top-5 holds them all
    # weighted over tasks as the models' scores are: (w_a*1 + w_b*1) / (w_a*7/3 + w_b*1.5)
    df = latency_frame({"a": [1.0, 2.0, 4.0], "b": [1.0, 2.0]}, {"a": 1, "b": 3}, {"a": "net", "b": "net"})
    ev = M.evaluate(df, np.zeros(5))
    assert ev.summary["random_top1_score"] == pytest.approx(4 / (7 / 3 + 3 * 1.5))
