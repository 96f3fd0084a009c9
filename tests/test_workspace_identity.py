"""A workspace's identity (dataset, target, content hash of its task table) and the dataset
selection its task table was built for: a run with another selection is refused."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.config import compose, run_stage
from pipeline.core import identity
from pipeline.core.workspace import Workspace, WorkspaceError
from pipeline.options import workspace_of


def _moved(over: list[str], data) -> list[str]:
    return [o for o in over if not o.startswith("paths.data=")] + [f"paths.data={data}"]


def test_tasks_stage_records_its_selection(measured_workspace):
    root, over = measured_workspace
    recorded = Workspace(root).selection()
    assert recorded == {"dataset.name": "ops", "dataset.source": "ops", "dataset.ops": ["GMM", "C1D", "SFM"],
                        "dataset.configs": [0], "budget.max_tasks": 3, "available": 3}


def test_other_selection_is_refused(measured_workspace):
    root, over = measured_workspace
    with pytest.raises(WorkspaceError, match=r'dataset\.ops=\["GMM", "C1D", "SFM"\] there, \["GMM"\] in this run'
                                             r'.*workspace=<name>.*stage=tasks force=true'):
        workspace_of(compose([*over, "dataset.ops=[GMM]"]))
    with pytest.raises(WorkspaceError, match="budget.max_tasks=3 there, 2 in this run"):
        run_stage("train", [*over, "budget.max_tasks=2"])
    with pytest.raises(WorkspaceError, match="dataset.ops"):
        run_stage("tasks", [*over, "dataset.ops=[GMM]"])
    # a larger budget that keeps the same tasks selects the same workspace
    for ok in ("budget=default", "budget.max_tasks=null", "budget.candidates_per_task=64"):
        assert workspace_of(compose([*over, ok])).root == root


def test_force_rebuilds_the_tasks_for_a_new_selection(measured_workspace, tmp_path):
    root, over = measured_workspace
    shutil.copytree(root, tmp_path / root.name, ignore=shutil.ignore_patterns("lib"))
    moved, ws = _moved(over, tmp_path), Workspace(tmp_path / root.name)
    made = ws.runs_on_tasks()
    assert [e["stage"] for e in made][:4] == ["tasks", "sample", "replay", "measure"] and made == ws.history()
    assert {e["tasks_digest"] for e in made} == {ws.tasks_digest()}
    assert run_stage("tasks", [*moved, "dataset.ops=[GMM]", "force=true"])["tasks"] == 1
    assert ws.selection()["dataset.ops"] == ["GMM"]
    # the runs a release of the rebuilt table names: the rebuild, not the runs on the old table
    assert [e["stage"] for e in ws.runs_on_tasks()] == ["tasks"] and len(ws.history()) == len(made) + 1
    # lines written before runs recorded the table's digest: the runs since the last rebuild
    legacy = [{k: v for k, v in e.items() if k != "tasks_digest"} for e in ws.history()]
    ws.history_file.write_text("".join(json.dumps(e) + "\n" for e in legacy))
    assert ws.runs_on_tasks() == legacy[-1:]
    with pytest.raises(WorkspaceError, match="dataset.ops"):
        workspace_of(compose(moved))


def test_identity_follows_the_tasks_not_the_folder(measured_workspace, tmp_path):
    root, over = measured_workspace
    shutil.copytree(root, tmp_path / root.name, ignore=shutil.ignore_patterns("lib", "candidates", "kernels"))
    cfg, moved = compose(over), compose(_moved(over, tmp_path))
    here = workspace_of(cfg).identity(cfg.dataset.name, cfg.target.name)
    there = workspace_of(moved).identity(moved.dataset.name, moved.target.name)
    assert here == there and len(here["workspace_id"]) == 16
    tasks = Workspace(root).read("tasks")
    shuffled = tasks.sample(frac=1.0, random_state=1)
    assert identity.tasks_digest(shuffled["task_id"], shuffled["target"]) == here["workspace.tasks_digest"]
    assert identity.tasks_digest(tasks["task_id"][1:], tasks["target"][1:]) != here["workspace.tasks_digest"]
    assert identity.workspace_id("ops", "h100", here["workspace.tasks_digest"]) != here["workspace_id"]
