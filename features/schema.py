"""Every Parquet schema of a workspace, in one place.

Each table carries `task_id` (structural hash of the workload) and, from the sample
stage on, `record_id` (hash of task id and trace). Units are in the column names
(`_s` seconds, `_us` microseconds, `_bytes`). The schema version goes into each file's
metadata so that a reader can refuse files written by an incompatible version.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1"
METADATA_KEY = b"pipeline.schema_version"
TABLE_KEY = b"pipeline.table"


def _schema(name: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={METADATA_KEY: SCHEMA_VERSION.encode(), TABLE_KEY: name.encode()})


TASKS = _schema(
    "tasks",
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("network", pa.string()),  # "" for a standalone operator
        pa.field("weight", pa.int64()),  # times the network calls this task
        pa.field("flops", pa.float64()),  # floating-point ops of one call
        pa.field("target", pa.string()),  # TVM target as JSON
        pa.field("source", pa.string()),  # ops | zoo | tenset
        pa.field("args_json", pa.string()),  # [[dtype, shape], ...] of the PrimFunc params
        pa.field("workload_index", pa.int64()),  # line in database_workload.json
    ],
)

CANDIDATES = _schema(
    "candidates",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("strategy", pa.string()),  # MetaSchedule search strategy that drew it
        pa.field("trace_json", pa.string()),  # MetaSchedule trace (with decisions), as JSON
        pa.field("error", pa.string()),
    ],
)

KERNELS = _schema(
    "kernels",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("build_s", pa.float64()),
        pa.field("artifact", pa.string()),  # path relative to the workspace, null on error
        pa.field("error", pa.string()),
    ],
)

MEASUREMENTS = _schema(
    "measurements",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("device", pa.string()),
        pa.field("mean_s", pa.float64()),
        pa.field("median_s", pa.float64()),
        pa.field("std_s", pa.float64()),
        pa.field("min_s", pa.float64()),
        pa.field("repeats", pa.int64()),
        pa.field("number", pa.int64()),
        pa.field("run_secs", pa.list_(pa.float64())),  # seconds per call, one per repeat
        pa.field("checked", pa.bool_()),  # outputs compared with the unscheduled reference
        pa.field("correct", pa.bool_()),  # null when not checked
        pa.field("max_abs_err", pa.float64()),
        pa.field("error", pa.string()),  # build/run/timeout/crash message, null on success
    ],
)

ANSOR_RECORDS = _schema(
    "ansor_records",
    [
        pa.field("record_id", pa.string(), nullable=False),  # hash of (workload key, target, steps)
        pa.field("task_id", pa.string()),  # the imported task with this workload key; null if none
        pa.field("workload_key", pa.string()),  # Ansor's key: ["<dag hash or function>", args...]
        pa.field("target", pa.string()),  # the record's TVM 0.8 target string
        pa.field("target_kind", pa.string()),  # cuda | llvm
        pa.field("version", pa.string()),  # record format, e.g. v0.6
        pa.field("steps_json", pa.string()),  # Ansor transform steps, as JSON
        pa.field("n_steps", pa.int64()),
        pa.field("step_kinds", pa.string()),  # distinct step kinds, comma-separated
        pa.field("costs_s", pa.list_(pa.float64())),  # measured seconds per repeat
        pa.field("mean_s", pa.float64()),  # null when the measurement failed
        pa.field("min_s", pa.float64()),
        pa.field("error_no", pa.int64()),  # Ansor's MeasureErrorNo, 0 = success
        pa.field("all_cost_s", pa.float64()),  # build + run wall time of the measurement
        pa.field("timestamp", pa.float64()),
        pa.field("label", pa.float64()),  # TenSet's label: the task's best mean_s / mean_s
        pa.field("source", pa.string()),  # file name and line of the record
        pa.field("line", pa.int64()),
    ],
)
