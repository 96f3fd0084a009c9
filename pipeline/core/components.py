"""One way to make a component: Hydra's `_target_`.

Every component (a model, an executor, a workload source, a profiler, a run mode, a tuning
cost model) is made by `hydra.utils.instantiate` from a node that names its class or function
in `_target_`, as lightning-hydra-template's groups do. A config group writes that node in
each of its files (`conf/model/lgbm.yaml`, `conf/executor/ray.yaml`); a family chosen by a
short name on the command line (`dataset.source=zoo`, `collect.profiler=perf`,
`collect.mode=export`, `tune.cost_models=[ours,xgb]`) keeps a table `kind -> _target_`, and
its `create(kind, ...)`, as MetaSchedule's `X.create(kind)`, turns the kind into that node
here. A bad kind is refused with the valid ones, in the family's own error class.
"""

from __future__ import annotations

from typing import Any, Mapping

from hydra.utils import instantiate

from pipeline.core.errors import PipelineError


def target(key: str, kinds: Mapping[str, str], kind: str, error: type[Exception] = PipelineError) -> str:
    """The `_target_` that `kind` names in its family's table; `key` is the config key that
    named it, `error` the family's own error class."""
    try:
        return kinds[kind]
    except KeyError:
        raise error(f"{key}={kind!r}; valid: {', '.join(kinds)}") from None


def create(node: Mapping[str, Any], /, *args, **kwargs):
    """The component that `node` names: its `_target_` called with the node's other keys and
    `args`/`kwargs`. Those are passed as they are (a dataclass or a workspace stays itself;
    `instantiate` alone would turn a dataclass into a dict)."""
    return instantiate(node, _partial_=True, _convert_="all")(*args, **kwargs)


def create_kind(key: str, kinds: Mapping[str, str], kind: str, /, *args,
                error: type[Exception] = PipelineError, **kwargs):
    """The component of a family's `kind` (`create` of the node `{_target_: kinds[kind]}`)."""
    return create({"_target_": target(key, kinds, kind, error)}, *args, **kwargs)
