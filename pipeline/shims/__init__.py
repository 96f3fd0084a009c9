"""Shims over TVM: targets from the config's JSON dicts (targets.py) and the version
differences and one-off costs of this TVM build (tvm_compat.py)."""
