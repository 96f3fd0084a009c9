"""TVM targets from the `target` config group (JSON dicts, as TVM 0.27 requires)."""

from __future__ import annotations

import json
import os

from omegaconf import OmegaConf


def target_dict(tvm) -> dict:
    """The `target.tvm` config as TVM's target dict (an llvm target without `num-cores` gets
    this machine's CPU count, `mcpu: host` this machine's CPU name; unset keys are left out)."""
    d = OmegaConf.to_container(tvm, resolve=True) if OmegaConf.is_config(tvm) else dict(tvm)
    if d.get("kind") == "llvm" and d.get("num-cores") is None:
        d["num-cores"] = os.cpu_count() or 1
    if d.get("kind") == "llvm" and d.get("mcpu") == "host":
        d["mcpu"] = host_cpu()
    return {k: v for k, v in d.items() if v is not None}


def host_cpu() -> str:
    """This machine's CPU as LLVM names it (what clang's -march=native picks)."""
    import tvm.target.codegen

    return str(tvm.target.codegen.llvm_get_system_cpu())


def make_target(d: dict):
    """A TVM target from its dict."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    return tvm.target.Target(d)


def target_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True)
