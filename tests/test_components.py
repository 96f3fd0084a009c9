"""One way to make a component (pipeline/core/components.py): every family's kinds name a
`_target_` that exists, a bad kind is refused with the valid ones in the family's own error
class, and what a caller passes reaches the component as it is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hydra.utils import get_object

from features import profilers
from pipeline import workloads
from pipeline.core import components
from pipeline.core.errors import PipelineError
from pipeline.runner import modes

from conftest import ROOT

#: every family chosen by a kind: the config key that names it and its table
FAMILIES = {"collect.profiler": profilers.PROFILERS, "dataset.source": workloads.SOURCES,
            "measure.mode": modes.MODES}


def tune_kinds():
    from pipeline.tuning import kinds  # TVM: seconds to import

    return kinds


@pytest.mark.parametrize("key", [*FAMILIES, "tune.cost_models"])
def test_every_kind_names_a_target_that_exists(key):
    table = FAMILIES.get(key) or tune_kinds().KINDS
    for kind, target in table.items():
        assert callable(get_object(target)), f"{key}={kind}: {target}"


@pytest.mark.parametrize("group", ["model", "executor"])
def test_every_config_group_file_names_a_target_that_exists(group):
    files = sorted((ROOT / "conf" / group).glob("*.yaml"))
    targets = [yaml.safe_load(f.read_text()).get("_target_") for f in files]
    named = [t for t in targets if t]
    assert len(named) >= 2, f"conf/{group}: {targets}"
    for target in named:
        assert isinstance(get_object(target), type), target


def test_a_bad_kind_names_the_key_and_the_valid_kinds():
    with pytest.raises(PipelineError, match=r"^collect.profiler='pref'; valid: perf, ncu, none, auto$"):
        profilers.create("pref", profilers.ProfilerSettings())
    with pytest.raises(PipelineError, match=r"^dataset.source='onnx'; valid: ops, zoo, tenset, relax$"):
        workloads.create("onnx", {}, "llvm")


def test_a_bad_tuning_kind_is_the_tuning_error():
    kinds = tune_kinds()
    from pipeline.tuning import TuneError

    with pytest.raises(TuneError, match=r"^tune.cost_models='xgboost'; valid: ours, ours_update, ours_adapt, xgb, random$"):
        kinds.create("xgboost", seed=0, threads=1)
    assert type(kinds.create("random", seed=3, threads=1)).__name__ == "RandomModel"


@dataclass
class Box:
    value: Path


def made(box, *, scale: int, path: Path):
    return box, scale, path


def test_arguments_reach_the_component_as_they_are():
    box = Box(Path("x"))
    node = {"_target_": f"{__name__}.made", "scale": 3}
    got, scale, path = components.create(node, box, path=Path("y"))
    assert got is box and scale == 3 and path == Path("y")  # not a dict, not a str
    table = {"made": f"{__name__}.made"}
    assert components.create_kind("k", table, "made", box, scale=1, path=Path("z"))[0] is box


def test_a_family_made_by_kind_is_the_registered_class():
    assert isinstance(profilers.create("none", profilers.ProfilerSettings()), profilers.NoProfiler)
    perf = profilers.create("auto", profilers.ProfilerSettings(target_kind="llvm"))
    assert type(perf).__name__ == "CpuCounters"
    with pytest.raises(ValueError, match="collect.profiler=perf needs collect.perf"):
        profilers.create("perf", profilers.ProfilerSettings(perf=None))
