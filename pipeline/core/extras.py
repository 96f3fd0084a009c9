"""Optional dependencies. A package that serves one feature only (Ray for executor=ray, gdown for
TenSet's download, NVIDIA's ncu-report for Nsight Compute reports) installs as an extra of the
project (pyproject.toml), so a plain install stays lean; the feature imports it with `require`,
which names the extra to install when it is missing instead of failing with a bare ImportError."""

from __future__ import annotations

import importlib
from types import ModuleType

from pipeline.core.errors import PipelineError

PROJECT = "tensor-cost-pipeline"


class MissingExtra(PipelineError):
    """A feature's optional package is not installed; the message names the extra."""


def install_hint(extra: str) -> str:
    return f"pip install '{PROJECT}[{extra}]' (from a checkout: pip install '.[{extra}]')"


def require(module: str, extra: str, feature: str) -> ModuleType:
    """`module`, imported; `feature` (e.g. "executor=ray") needs it and the extra `extra` installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = module.split(".")[0]
        if e.name not in (module, top):  # the package is there but broken: its own error says more
            raise
        raise MissingExtra(f"{feature} needs the package {top!r}, which is not installed: {install_hint(extra)}; "
                           f"`make install` installs every extra") from e
