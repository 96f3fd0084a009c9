"""Workarounds for costs of the installed TVM that every MetaSchedule process pays.

`TuneContext` imports `tvm.s_tir.tensor_intrin`, which parses ~500 TVMScript functions;
each parse calls `inspect.stack()`, which reads source lines and resolves modules for
every frame. That made the first TuneContext of a process take 15-45 s here. The parser
only needs the frames (and code context to spot functions defined inside classes, which
tensor_intrin has none of), so the import runs with a stack that skips those lookups.
"""

from __future__ import annotations

import inspect
import sys


def _frames_only_stack(context: int = 1) -> list:
    frame, out = sys._getframe(1), []
    while frame is not None:
        out.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, None, None))
        frame = frame.f_back
    return out


def preload_tensor_intrin() -> None:
    """Import tvm.s_tir.tensor_intrin once per process, without the slow stack walks."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    original = inspect.stack
    inspect.stack = _frames_only_stack
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.stack = original
