"""Task and record identities: stable across processes and machines."""

from __future__ import annotations

import hashlib
import json


def task_id(mod) -> str:
    """Structural hash of the workload, as 16 hex digits."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def trace_json(trace) -> str:
    """A trace (with its decisions) as canonical JSON text."""
    return json.dumps(_plain(trace.as_json()), separators=(",", ":"))


def record_id(task: str, trace_text: str) -> str:
    return hashlib.sha1(f"{task}\n{trace_text}".encode()).hexdigest()[:16]


def _plain(obj):
    """TVM FFI containers -> JSON-serialisable Python values."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm

    if isinstance(obj, (str, bool, int)) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj
    if hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes)):
        return [_plain(x) for x in obj]
    if isinstance(obj, tvm.tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tvm.tirx.FloatImm):
        return float(obj.value)
    return str(obj)
