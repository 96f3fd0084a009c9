"""dataset=relax and tune.tasks=<pkg.module:function>: a user's own network (tests/fixtures/own_model.py)
through the stages and tuned end to end, and the one-line errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pipeline.config import run_stage
from pipeline.core import identity
from pipeline.core.errors import PipelineError
from pipeline.workloads import relax, zoo
from pipeline.options import workspace_of

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC = "own_model:two_layer"
SEARCH = ["tune.strategy.population_size=32", "tune.strategy.init_min_unmeasured=16", "tune.runner.min_repeat_ms=10",
          "tune.strategy.genetic_num_iters=2"]


@pytest.fixture
def own_model(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    return SPEC


def _llvm():
    import tvm

    return tvm.target.Target({"kind": "llvm", "num-cores": 1})


def test_own_network_through_the_stages_and_tuned(own_model, tmp_path):
    from pipeline.config import compose
    from pipeline.core.workspace import WorkspaceError

    over = [f"paths.data={tmp_path / 'data'}", "dataset=relax", f"dataset.module={own_model}", "budget=smoke",
            "budget.candidates_per_task=2", "measure.repeat=2", "measure.min_repeat_ms=5",
            f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    assert run_stage("tasks", over)["tasks"] == 2  # dense+relu, dense
    for stage in ("sample", "replay", "measure"):
        run_stage(stage, over)
    ws = workspace_of(compose(over))
    tasks = ws.read("tasks")
    assert set(tasks["network"]) == {"two_layer"} and set(tasks["source"]) == {"relax"}
    assert ws.selection()["dataset.module"] == SPEC
    measured = ws.read("measurements")
    assert len(measured) == 4 and measured["error"].isna().all() and (measured["mean_s"] > 0).all()
    # the module spec is part of the workspace's identity: another module is refused there
    with pytest.raises(WorkspaceError, match="dataset.module"):
        run_stage("sample", [*over, "dataset.module=own_model:two_layer_relax"])
    # the same network tuned jointly and timed end to end, as a zoo network
    out = run_stage("tune", [*over, f"tune.tasks={own_model}", "tune.max_tasks=2", "tune.trials=2", "tune.per_iter=2",
                             "tune.cost_models=[random]", *SEARCH])
    assert out["tasks"] == 2 and out["failed_runs"] == 0 and out["trials"] == 4
    e2e = pd.read_csv(ws.root / "reports" / "tune-two_layer_e2e.csv")
    assert list(e2e["cost_model"]) == ["random", "untuned"] and (e2e["e2e_latency_ms"] > 0).all()


def test_an_irmodule_gives_the_tasks_of_its_torch_form(own_model):
    torch_form = relax.load_network(own_model, "dataset.module")
    ir_form = relax.load_network("own_model:two_layer_relax", "tune.tasks", seed=0)
    assert [x.shape for x in ir_form.inputs] == [x.shape for x in torch_form.inputs] == [(4, 64)]
    assert ir_form.name == "two_layer_relax"
    ids = [sorted(identity.task_id(w.mod) for w in zoo.relax_workloads(n.mod, _llvm(), n.name, "relax")) for n in (torch_form, ir_form)]
    assert ids[0] == ids[1] and len(ids[0]) == 2


def test_torch_reductions_the_importer_lacks_are_translated(own_model):
    """`amax` and `amin` (no entry in TVM's importer) become Relax max and min: the built module
    computes what torch does."""
    import numpy as np
    import torch
    import tvm

    net = relax.load_network("own_model:stable_softmax", "dataset.module")
    vm = tvm.relax.VirtualMachine(tvm.relax.build(net.mod, "llvm"), tvm.cpu())
    from own_model import StableSoftmax

    with torch.no_grad():
        expected = StableSoftmax()(torch.as_tensor(net.inputs[0])).numpy()
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(net.inputs[0])).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec, says", [
    ("own_model", "give the function as <pkg.module:function>"),
    ("no_such_module_here:build", "module 'no_such_module_here' cannot be imported"),
    ("own_model:missing", "has no 'missing'; its functions: a_string, bessel, no_example, stable_softmax, two_layer, two_layer_relax"),
    ("own_model:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a int, not a function"),
    ("own_model:a_string", "a_string() returned a str; return a Relax IRModule, or a torch.nn.Module"),
    ("own_model:no_example", "returned a torch.nn.Module without example inputs; return `module, (example, ...)`"),
    ("own_model:bessel", "Bessel: TVM's Relax importer has no translation for ['i0.default']; write them with torch "
                         "ops it translates); export it yourself and return the Relax IRModule"),
])
def test_bad_module_spec_says_what_and_how_to_fix(own_model, spec, says):
    with pytest.raises(PipelineError) as e:
        relax.load_network(spec, "dataset.module")
    assert f"dataset.module={spec!r}" in str(e.value) and says in str(e.value)


def test_bad_input_stops_the_stages_with_one_line(own_model, tmp_path):
    from pipeline.tuning import TuneError

    over = [f"paths.data={tmp_path}", "dataset=relax", "budget=smoke"]
    with pytest.raises(PipelineError, match=r"dataset=relax needs dataset.module=<pkg.module:function>"):
        run_stage("tasks", over)
    with pytest.raises(PipelineError, match=r"dataset.module='own_model:nope': module 'own_model' .* has no 'nope'"):
        run_stage("tasks", [*over, "dataset.module=own_model:nope"])
    with pytest.raises(TuneError, match=r"tune.tasks='vgg16': not `workspace`, `ops`, a network .* <pkg.module:function>"):
        run_stage("tune", [*over, "dataset.module=own_model:two_layer", "tune.tasks=vgg16",
                           "tune.cost_models=[random]"])
