"""stage=measure: run every built kernel on the device, time it, check a sample.

`measure.mode` picks where the kernels run (pipeline/runner/modes.py): on the executor's
devices (`executor=local`: here; `executor=ray`: the measuring nodes of a Ray cluster,
one batch per machine at a time), in child processes of the kernel harness
(pipeline/device/harness, TVM runtime only), so a kernel that crashes or hangs becomes
an error row and the rest go on; or on a device host through an exported bundle whose
results are imported back. Every row says where it was measured (`hardware`, CPU model
and count, GPU name and driver) and whether the CPU cache was flushed before each repeat
(`measure.cache_flush`). Run times are written back into the workspace's MetaSchedule
JSON database (`database.sync_records`), which makes the workspace a TenSet-style
dataset that `ms.database.JSONDatabase` loads.

A kernel whose library is missing is not measured (a lost file is not a slow kernel):
stage=replay builds it again, and the next measure run times it.
"""

from __future__ import annotations

from pipeline.runner import modes
from pipeline.runner.measurements import measure
from pipeline.options import executor_of, measure_settings, shard_of, workspace_of


def run(cfg) -> dict:
    ws, shard = workspace_of(cfg), shard_of(cfg)
    with executor_of(cfg) as executor:
        return measure(ws, shard, modes.create(str(cfg.measure.mode), measure_settings(cfg), ws, executor))
