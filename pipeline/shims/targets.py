"""TVM targets from the `target` config group (JSON dicts, as TVM 0.27 requires)."""

from __future__ import annotations

import json
import os

from omegaconf import OmegaConf


def target_dict(tvm) -> dict:
    """The `target.tvm` config as TVM's target dict (an llvm target without `num-cores` gets
    this machine's CPU count; unset keys are left out)."""
    d = OmegaConf.to_container(tvm, resolve=True) if OmegaConf.is_config(tvm) else dict(tvm)
    if d.get("kind") == "llvm" and d.get("num-cores") is None:
        d["num-cores"] = os.cpu_count() or 1
    return {k: v for k, v in d.items() if v is not None}


def make_target(d: dict):
    """A TVM target from its dict."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    return tvm.target.Target(d)


def target_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True)
