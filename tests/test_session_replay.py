"""Kept tuning runs replayed through cost models (pipeline/tuning/session_replay.py): a committed
XGBModel run of the BERT encoder, through the committed prior that never saw that network,
XGBModel and a random pick, by MetaSchedule's own update/predict calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from pipeline.config import run_stage
from pipeline.core import database as D
from pipeline.core import identity
from pipeline.tuning import comparison, session_replay
from pipeline.tuning.cost_model import PipelineCostModel

RUN = ROOT / "data" / "tuning" / "zoo_ops-llvm-epyc2-v1" / "09f3cd4473e3" / "bert_encoder" / "xgb-s0"
PRIOR = "zoo_ops-llvm-epyc2-v1-lgbm_ps_rank4-without-bert_encoder"


@pytest.fixture(scope="module")
def names() -> dict[str, str]:
    lines, _ = comparison.kept_records(RUN)
    return {identity.task_id(D.load_workload_mod(line)): f"task{i}" for i, line in enumerate(lines)}


@pytest.fixture(scope="module")
def session(names) -> list[session_replay.SessionTask]:
    return session_replay.load_session(RUN, names)


def test_a_kept_run_loads_in_the_order_it_was_measured(session, names):
    trials = json.loads((RUN / comparison.RESULT_FILE).read_text())["trials"]
    assert len(session) == 5 and all(len(t.candidates) == len(t.costs) == 128 for t in session)
    assert sum(len(t.costs) for t in session) == len(trials) == 640
    lines, records = comparison.kept_records(RUN)
    tid = identity.task_id(D.load_workload_mod(lines[records[0].workload_index]))
    task = next(t for t in session if t.name == names[tid])
    assert task.costs[0] == pytest.approx(float(np.mean([float(x) for x in records[0].run_secs])))


def test_scores_of_a_ranking():
    costs = np.array([3.0, 1.0, 2.0, session_replay.FAILED])
    right = session_replay.scores(costs, -costs)
    assert right["top1"] == 1.0 and right["pairwise"] == 1.0 and right["first_pick_s"] == 1.0
    wrong = session_replay.scores(costs, costs)
    assert wrong["pairwise"] == 0.0 and wrong["top1"] == pytest.approx(1.0 / session_replay.FAILED)
    assert wrong[f"best_of_{session_replay.PICKS}"] == 1.0  # 4 schedules: the first 8 picks hold the best


def test_every_kind_ranks_the_later_schedules_and_the_adapting_prior_learns(session, tmp_path):
    prior = PipelineCostModel.from_pretrained(PRIOR, update_rounds=50)
    make = comparison.cost_models(ours=prior, threads=2, xgb_warmup=100)
    rows = session_replay.replay_runs({"xgb-s0": session}, ["ours", "ours_adapt", "xgb", "random"], make,
                                      cuts=[8, 64], per_iter=16)
    assert len(rows) == 4 * 2 * 5 and set(rows["later"]) == {120, 64}
    by = rows.groupby(["cost_model", "cut"])["pairwise"].mean()
    assert 0.35 < by["random", 64] < 0.65
    # fed 64 measurements per task, the correction orders the next 64 better than the frozen prior
    assert by["ours_adapt", 64] > by["ours", 64] + 0.05 and by["ours_adapt", 64] > 0.55
    table = session_replay.paired(rows)
    assert list(table.columns[:3]) == ["cost_model", "cut", "pairs"]
    xgb = table[table["cost_model"] == "xgb"]
    assert xgb["xgb_pick/this_pick"].isna().all()
    others = table[table["cost_model"] != "xgb"]
    assert (others["interval_lo"] <= others["xgb_pick/this_pick"]).all()
    assert (others["xgb_pick/this_pick"] <= others["interval_hi"]).all()
    text, path = session_replay.write_report(rows, tmp_path, prefix="tune-bert_encoder_replay", baseline="xgb",
                                             heading="BERT", notes=["a note"], per_iter=16)
    assert path.read_text() == text and "a note" in text and "| ours_adapt" in text
    assert len(pd.read_csv(tmp_path / "tune-bert_encoder_replay.csv")) == len(rows)


def test_a_run_of_other_tasks_is_refused_with_the_fix(names):
    with pytest.raises(ValueError, match="no record of tuned task.*same tune.tasks"):
        session_replay.load_session(RUN, {**names, "0" * 16: "not-tuned-here"})


def test_the_tune_stage_finds_the_kept_runs_wherever_they_are_kept(tmp_path):
    """The run folders are named by the tuning settings, not by the folder that keeps them: an
    absolute tune.results and another data folder find the committed runs."""
    over = [f"paths.data={tmp_path / 'data'}", f"paths.releases={ROOT / 'data' / 'releases'}", "dataset=release",
            "dataset.release=zoo_ops-llvm-epyc2-v1", "budget=transfer", "tune.tasks=bert_encoder"]
    run_stage("tasks", over)
    out = run_stage("tune", [*over, f"tune.results={ROOT / 'data' / 'tuning'}", "tune.cost_models=[xgb,random]",
                             "tune.seeds=[0]", "tune.replay.enabled=true", "tune.replay.cuts=[64]"])
    assert out["runs"] == 1 and out["rows"] == 2 * 5
    assert "| random" in Path(out["report"]).read_text()
