"""models/score_elsewhere.py: the logged models of training runs scored on another workspace."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from models import score_elsewhere, tracking
from pipeline.config import compose, run_stage
from pipeline.options import workspace_of

RELEASE = Path(__file__).resolve().parents[1] / "data" / "releases" / "zoo-llvm-xeon2-v1"

pytestmark = pytest.mark.skipif(not RELEASE.is_dir(), reason=f"{RELEASE} is not committed")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two seeds of ms_xgb, a pack-sum LambdaRank model and the fixed ensemble (its members
    trained 30 rounds) trained on the release (by_task)."""
    tmp = tmp_path_factory.mktemp("elsewhere")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    short = [f"model.ens_ps_rank4_fixed.members.{m}.rounds_without_val=30"
             for m in ("lgbm_ps_rank4_task", "lgbm_ps_rank4_roofbase1", "xgb_ps")]
    over = ["dataset=release", f"dataset.release={RELEASE}", f"paths.data={tmp / 'data'}", "model=all",
            "features=static", "train.models=[ms_xgb,lgbm_ps_rank4_task,ens_ps_rank4_fixed]", "split=by_task",
            f"mlflow.tracking_uri={uri}", "mlflow.experiment=elsewhere", *short]
    for seed in (0, 1):
        run_stage("train", [*over, f"seed={seed}"])
    return tmp, uri, workspace_of(compose(over))


def test_runs_scored_on_their_own_workspace_give_their_logged_test_picks(trained):
    """Scored on the workspace they were trained on, each run's model picks, on its own test
    tasks, the records its training run logged: the model, its input and the metric are the
    training's."""
    _, uri, ws = trained
    runs = tracking.latest_per_config(tracking.experiment_runs(uri, "elsewhere"))
    assert len(runs) == 6
    per_run, per_task = score_elsewhere.score_runs(runs, ws)
    assert len(per_run) == 6 and set(per_run["heldout"]) == {"rnnsearch_decode"}
    assert per_run["test_top1_score"].between(0, 1).all() and per_run["test_top1_score"].gt(per_run["random_top1_score"]).any()
    logged = tracking.per_task_tables(runs)
    logged = logged[logged["topk"].astype(bool)]
    both = per_task.merge(logged, on=["run_id", "task_id"], suffixes=("", "_logged"))
    assert len(both) == len(logged) > 0 and set(both["run_id"]) == set(runs["run_id"])
    pd.testing.assert_series_equal(both["top1_s"], both["top1_s_logged"], check_names=False)
    pd.testing.assert_series_equal(both["best_s"], both["best_s_logged"], check_names=False)
    # every task of the workspace is scored, not only the test tasks
    assert per_task.groupby("run_id")["task_id"].nunique().min() > logged.groupby("run_id")["task_id"].nunique().max()


def test_the_command_writes_means_pairs_and_a_random_pick(trained, capsys):
    tmp, uri, ws = trained
    out = tmp / "report"
    assert score_elsewhere.main(["--experiment", "elsewhere", "--tracking-uri", uri, "--workspace", str(ws.root),
                                 "--pairs", "lgbm_ps_rank4_task:ms_xgb", "--out", str(out)]) == 0
    means = pd.read_csv(out / "means.csv")
    assert set(means["model"]) == {"random", "ms_xgb", "lgbm_ps_rank4_task", "ens_ps_rank4_fixed"}
    assert means.loc[means["model"] != "random", "runs"].eq(2).all()
    intervals, margins = pd.read_csv(out / "intervals.csv"), pd.read_csv(out / "margins.csv")
    assert list(zip(intervals["model"], intervals["reference"])) == [("lgbm_ps_rank4_task", "ms_xgb")]
    row = intervals.iloc[0]
    assert row["lo"] <= row["diff"] <= row["hi"] and row["n_seeds"] == 2
    assert set(margins["metric"]) == {"test_top1_score", "test_top5_score", "test_pair_acc"}
    assert (margins["n_runs"] == 2).all() and set(margins["heldout"]) == {"rnnsearch_decode"}
    text = capsys.readouterr().out
    assert "| rnnsearch_decode | random |" in text and "lgbm_ps_rank4_task | ms_xgb |" in text


def test_members_of_an_ensemble_are_scored_alone_beside_it(trained):
    """With --members each member of the ensemble gets its own rows, scored by its own
    predictions (not the ensemble's), and can be paired like any model; other models have none."""
    tmp, uri, ws = trained
    out = tmp / "members"
    assert score_elsewhere.main(["--experiment", "elsewhere", "--tracking-uri", uri, "--workspace", str(ws.root),
                                 "--members", "--models", "ens_ps_rank4_fixed,ms_xgb", "--out", str(out),
                                 "--pairs", "ens_ps_rank4_fixed.xgb_ps:ens_ps_rank4_fixed"]) == 0
    per_run = pd.read_csv(out / "per_run.csv")
    members = ["lgbm_ps_rank4_task", "lgbm_ps_rank4_roofbase1", "xgb_ps"]
    assert sorted(set(per_run["model"])) == sorted(["ens_ps_rank4_fixed", "ms_xgb",
                                                     *(f"ens_ps_rank4_fixed.{m}" for m in members)])
    assert per_run.groupby("model")["seed"].nunique().eq(2).all()
    runs = per_run.set_index(["model", "seed"])["test_pair_acc"].unstack("model")
    for m in members:  # each member orders the records otherwise than the ensemble in some run
        assert not runs[f"ens_ps_rank4_fixed.{m}"].equals(runs["ens_ps_rank4_fixed"])
    intervals = pd.read_csv(out / "intervals.csv")
    assert list(zip(intervals["model"], intervals["reference"])) == [("ens_ps_rank4_fixed.xgb_ps", "ens_ps_rank4_fixed")]


def test_bad_inputs_name_the_fix(trained, tmp_path):
    _, uri, _ = trained
    with pytest.raises(Exception, match="stage=tasks dataset=release dataset.release=nowhere"):
        score_elsewhere.main(["--experiment", "elsewhere", "--tracking-uri", uri, "--release", "nowhere",
                              "--data", str(tmp_path)])
    with pytest.raises(SystemExit, match="no finished training run in experiment 'other'"):
        score_elsewhere.main(["--experiment", "other", "--tracking-uri", uri, "--workspace",
                              str(trained[2].root)])
    with pytest.raises(SystemExit, match="model:reference"):
        score_elsewhere.main(["--experiment", "elsewhere", "--tracking-uri", uri, "--workspace",
                              str(trained[2].root), "--pairs", "lgbm_ps_rank4_task"])


def test_runs_of_two_held_out_parts_are_not_paired_by_seed(trained):
    """The same seed of two held-out parts is two runs: they are refused together and chosen
    with `heldout`."""
    _, uri, _ = trained
    runs = tracking.experiment_runs(uri, "elsewhere")
    other = runs.assign(**{"tags.heldout": "vgg11", "run_id": runs["run_id"] + "-other"})
    both = pd.concat([runs, other], ignore_index=True)
    with pytest.raises(ValueError, match=r"held out 2 parts \('', 'vgg11'\): choose one with --heldout"):
        score_elsewhere.select_runs(both)
    assert set(score_elsewhere.select_runs(both, heldout="vgg11")["run_id"]) == set(other["run_id"])
    assert set(score_elsewhere.select_runs(both, heldout="", models=["ms_xgb"])["tags.model"]) == {"ms_xgb"}
