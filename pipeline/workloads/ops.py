"""The MetaSchedule paper's operator suite, as shipped with TVM (te_workload.CONFIGS)."""

from __future__ import annotations

from pipeline.core.errors import PipelineError
from pipeline.workloads.base import Workload


def load(dataset, target, **_) -> list[Workload]:
    """`dataset.ops` x `dataset.configs` of the suite, each a TE workload as a PrimFunc."""
    # lazy: TVM takes seconds to import, and importing this module must stay cheap
    import tvm
    from tvm.s_tir.meta_schedule.testing import te_workload

    valid = list(te_workload.CONFIGS)
    out = []
    for op in dataset.ops:
        if op not in te_workload.CONFIGS:
            raise PipelineError(f"dataset.ops: unknown operator {op!r}; valid: {', '.join(valid)}")
        n = len(te_workload.CONFIGS[op][1])
        for idx in dataset.configs:
            if not 0 <= int(idx) < n:
                raise PipelineError(f"dataset.configs: {op} has configs 0..{n - 1}, got {idx}")
            try:
                func = te_workload.create_te_workload(op, int(idx))
            except RuntimeError as e:
                raise PipelineError(f"dataset.ops: {op} cannot be created on this TVM ({e}); drop it from dataset.ops") from e
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            out.append(Workload(name=f"{op}-{idx}", mod=mod, source="ops"))
    return out
