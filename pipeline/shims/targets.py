"""TVM targets from the `target` config group (JSON dicts, as TVM 0.27 requires)."""

from __future__ import annotations

import json
import os

from omegaconf import OmegaConf


def target_dict(cfg) -> dict:
    d = OmegaConf.to_container(cfg.target.tvm, resolve=True)
    if d.get("kind") == "llvm" and d.get("num-cores") is None:
        d["num-cores"] = os.cpu_count() or 1
    return {k: v for k, v in d.items() if v is not None}


def make_target(cfg_or_dict):
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    d = cfg_or_dict if isinstance(cfg_or_dict, dict) else target_dict(cfg_or_dict)
    return tvm.target.Target(d)


def target_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True)
