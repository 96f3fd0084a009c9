"""models/metrics.py on records small enough to score by hand: which tasks the top-k
figures count (`topk_min_records`), the early-stopping `ranking_metric`, and what tied and
NaN scores pick. Every expected value is worked out in the comments, not by the code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from models import metrics as M


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
