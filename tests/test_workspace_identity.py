"""A workspace's identity (dataset, target, content hash of its task table) and the dataset
selection its task table was built for: a run with another selection is refused."""

from __future__ import annotations

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
    moved = _moved(over, tmp_path)
    assert run_stage("tasks", [*moved, "dataset.ops=[GMM]", "force=true"])["tasks"] == 1
    assert Workspace(tmp_path / root.name).selection()["dataset.ops"] == ["GMM"]
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
