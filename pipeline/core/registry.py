"""One way to choose a component: a family (workload sources, profilers, measure and collect
modes, tuning's cost models) keeps a dict `kind -> implementation` and its `create(kind, ...)`
picks from it here, as MetaSchedule's `SearchStrategy.create(kind)` does; a bad kind fails with
the valid ones."""

from __future__ import annotations

from typing import Mapping, TypeVar

from pipeline.core.errors import PipelineError

T = TypeVar("T")


def choose(key: str, kinds: Mapping[str, T], kind: str, error: type[PipelineError] = PipelineError) -> T:
    """The implementation registered as `kind`; `key` is the config key that named it, `error`
    the family's own error class."""
    try:
        return kinds[kind]
    except KeyError:
        raise error(f"{key}={kind!r}; valid: {', '.join(kinds)}") from None
