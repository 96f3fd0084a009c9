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

# A task that several networks share has one row in TASKS (weights summed, first
# network's name) and one row per network here: held-out-network splits and TenSet's
# weighted scores read this table.
NETWORK_TASKS = _schema(
    "network_tasks",
    [
        pa.field("network", pa.string()),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("weight", pa.int64()),  # calls of the task in this network
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

# Where a kernel was measured or profiled, as the kernel harness detects it (every
# measurement and profiler row; null in rows written before these columns existed).
# `hardware` is the identity that label tables compare: the GPU's name on a GPU, the CPU
# model and its logical CPU count on a CPU; two CPU signatures under one `hardware` are two
# machines (models/tables.py).
HOST = [
    pa.field("hardware", pa.string()),
    pa.field("cpu_model", pa.string()),  # /proc/cpuinfo's model name
    pa.field("cpu_count", pa.int64()),  # logical CPUs of the host
    pa.field("cpu_signature", pa.string()),  # x86 vendor, family, model, stepping (Arm: implementer, part)
    pa.field("gpu_name", pa.string()),  # null on a CPU target
    pa.field("gpu_driver", pa.string()),
]

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
        *HOST,
        pa.field("cache_flush", pa.bool_()),  # CPU caches flushed before every repeat (measure.cache_flush)
        pa.field("load_avg", pa.float64()),  # the host's 1-minute load average when the timing ended
        pa.field("rounds", pa.int64()),  # interleaved rounds (measure.rounds); the row is the best round's
        pa.field("round_means_s", pa.list_(pa.float64())),  # every round's mean, in round order
        # What timed the kernel: null = the kernel harness (stage=measure); "tuning" = MetaSchedule's
        # runner inside a tuning run, imported with its record (pipeline/tuning/imported.py). Labels
        # compare a record only with records of its task timed the same way.
        pa.field("timer", pa.string()),
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

# ----------------------------------------------------------------------------- stage=collect
# Feature tables under <workspace>/features/. Profiler tables are Hive-partitioned by the
# device that produced them (`features/cpu/device=cpu/part-*.parquet`): the `device`
# column lives in the path, so `pd.read_parquet(folder)` restores it.

# MetaSchedule's PerStoreFeature, in its C++ export order (per_store_feature.cc): 164
# values per buffer store, each log2(1 + x) of a count/byte quantity or a 0/1 flag.
_FOR_KIND_POS = ("none", "inner_spatial", "middle_spatial", "outer_spatial", "inner_reduce",
                 "middle_reduce", "outer_reduce", "mixed")
_BUFFER_FEATURES = (
    "acc_type_read", "acc_type_write", "acc_type_readwrite", "bytes", "unique_bytes", "lines",
    "unique_lines", "reuse_type_loop_multiple_read", "reuse_type_serial_multiple_read_write",
    "reuse_type_no_reuse", "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct", "bytes_d_reuse_ct",
    "unique_bytes_d_reuse_ct", "lines_d_reuse_ct", "unique_lines_d_reuse_ct", "stride",
)
PER_STORE_FEATURE_NAMES: tuple[str, ...] = (
    # group 1: arithmetic ops (weighted by the loop extents around the store)
    "float_mad", "float_addsub", "float_mul", "float_divmod", "float_cmp", "float_mathfunc",
    "float_otherfunc", "int_mad", "int_addsub", "int_mul", "int_divmod", "int_cmp", "int_mathfunc",
    "int_otherfunc", "bool_op", "select_op",
    # group 1: vectorize / unroll / parallel loops around the store
    *(f"{k}_{f}" for k in ("vec", "unroll", "parallel")
      for f in ("num", "prod", "len", *(f"type_{p}" for p in _FOR_KIND_POS))),
    # group 1: GPU thread binding
    "is_gpu", "blockIdx_x_len", "blockIdx_y_len", "blockIdx_z_len", "threadIdx_x_len",
    "threadIdx_y_len", "threadIdx_z_len", "vthread_len",
    # group 2: the first 5 buffers the store touches (zero-padded)
    *(f"b{i}_{f}" for i in range(5) for f in _BUFFER_FEATURES),
    # group 3: arithmetic intensity curve (10 samples)
    *(f"arith_intensity_curve_{i}" for i in range(10)),
    # group 4: allocation
    "alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod",
    # group 5: outer loops
    "outer_prod", "num_loops", "auto_unroll_max_step",
)
assert len(PER_STORE_FEATURE_NAMES) == 164
# Program-level aggregates of the per-store rows, as columns `<agg>.<feature>`.
STATIC_AGGREGATES = ("sum", "mean", "max")

STATIC_STORES = _schema(
    "static_stores",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("store_index", pa.int32()),  # order of the buffer store in the program
        *(pa.field(n, pa.float32()) for n in PER_STORE_FEATURE_NAMES),
    ],
)

# Build-time resources of the CUDA kernels of a record, summarised (null on llvm targets).
_CUDA_SUMMARY = (
    ("cuda.kernels", pa.int32()),  # device kernels the record launches
    ("cuda.registers_per_thread_max", pa.int32()),
    ("cuda.shared_mem_bytes_max", pa.int64()),  # static shared memory per block
    ("cuda.local_mem_bytes_max", pa.int64()),  # stack frame per thread
    ("cuda.spill_bytes_sum", pa.int64()),  # spill stores + spill loads
    ("cuda.threads_per_block_max", pa.int64()),
    ("cuda.blocks_sum", pa.int64()),
)

STATIC = _schema(
    "static",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("n_stores", pa.int32()),
        *(pa.field(f"{a}.{n}", pa.float32()) for a in STATIC_AGGREGATES for n in PER_STORE_FEATURE_NAMES),
        *(pa.field(n, t) for n, t in _CUDA_SUMMARY),
        pa.field("error", pa.string()),
    ],
)

CUDA_RESOURCES = _schema(
    "cuda_resources",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("kernel_index", pa.int32()),  # order in the device module; null on error rows
        pa.field("kernel_name", pa.string()),
        pa.field("arch", pa.string()),  # e.g. sm_90a
        pa.field("registers_per_thread", pa.int32()),  # ptxas "Used N registers"
        pa.field("shared_mem_bytes", pa.int64()),  # static shared memory per block (ptxas smem)
        pa.field("dynamic_shared_mem", pa.bool_()),  # the kernel also takes dynamic shared memory
        pa.field("constant_mem_bytes", pa.int64()),  # ptxas cmem[0] (kernel parameters and constants)
        pa.field("local_mem_bytes", pa.int64()),  # ptxas stack frame per thread
        pa.field("spill_store_bytes", pa.int64()),
        pa.field("spill_load_bytes", pa.int64()),
        pa.field("barriers", pa.int32()),
        pa.field("grid_x", pa.int64()), pa.field("grid_y", pa.int64()), pa.field("grid_z", pa.int64()),
        pa.field("block_x", pa.int64()), pa.field("block_y", pa.int64()), pa.field("block_z", pa.int64()),
        pa.field("threads_per_block", pa.int64()),
        pa.field("blocks", pa.int64()),
        pa.field("error", pa.string()),
    ],
)

# CPU counters: column -> perf event. Values are per kernel call (count / calls).
PERF_EVENTS: dict[str, str] = {
    "task_clock_s": "task-clock",  # perf reports msec; stored in seconds
    "context_switches": "context-switches",
    "cpu_migrations": "cpu-migrations",
    "page_faults": "page-faults",
    "cycles": "cycles",
    "instructions": "instructions",
    "branches": "branches",
    "branch_misses": "branch-misses",
    "cache_references": "cache-references",
    "cache_misses": "cache-misses",
    "l1d_loads": "L1-dcache-loads",
    "l1d_load_misses": "L1-dcache-load-misses",
    "llc_loads": "LLC-loads",
    "llc_load_misses": "LLC-load-misses",
    "dtlb_load_misses": "dTLB-load-misses",
}
# getrusage(RUSAGE_SELF) deltas of the process that ran the kernel, per call.
RUSAGE_FIELDS: dict[str, str] = {
    "user_s": "ru_utime",
    "system_s": "ru_stime",
    "minor_faults": "ru_minflt",
    "major_faults": "ru_majflt",
    "voluntary_ctx_switches": "ru_nvcsw",
    "involuntary_ctx_switches": "ru_nivcsw",
}

CPU_COUNTERS = _schema(
    "cpu_counters",
    [
        pa.field("record_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("calls", pa.int64()),  # kernel calls inside the counted window
        pa.field("wall_s", pa.float64()),  # wall time per call
        *(pa.field(f"rusage.{c}", pa.float64()) for c in RUSAGE_FIELDS),
        pa.field("rusage.max_rss_bytes", pa.int64()),  # peak resident set of the process
        *(f for c in PERF_EVENTS for f in (pa.field(f"perf.{c}", pa.float64()),
                                           pa.field(f"perf.{c}.reason", pa.string()))),
        pa.field("perf_version", pa.string()),
        pa.field("error", pa.string()),
        *HOST,
    ],
)


def ncu_schema(name: str, metrics: list[str], string_metrics: frozenset = frozenset(), per_kernel: bool = True) -> pa.Schema:
    """Nsight Compute table: one column per ncu metric (ncu's own name; float64 unless the
    report gives a string). Per kernel (`ncu_kernels`) or aggregated per record (`ncu`)."""
    head = [pa.field("record_id", pa.string(), nullable=False), pa.field("task_id", pa.string(), nullable=False)]
    if per_kernel:
        head += [pa.field("kernel_index", pa.int32()), pa.field("kernel_name", pa.string())]
    else:
        head += [pa.field("n_kernels", pa.int32()), pa.field("kernel_names", pa.string())]
    cols = [pa.field(m, pa.string() if m in string_metrics else pa.float64()) for m in metrics]
    host = [f for f in HOST if f.name not in metrics]
    return _schema(name, [*head, *host, *cols, pa.field("error", pa.string())])


def ncu_launches_schema(metrics: list[str], string_metrics: frozenset = frozenset()) -> pa.Schema:
    """Kernel table of any .ncu-rep (`python -m features.ncu.report`): the `ncu_kernels`
    columns, with `record_id` null for a launch outside the pipeline's NVTX domain and
    `task_id` null (a report alone names no task), plus where each launch comes from."""
    base = ncu_schema("ncu_launches", metrics, string_metrics, per_kernel=True)
    fields = [f.with_nullable(True) if f.name in ("record_id", "task_id") else f for f in base]
    at = base.get_field_index("kernel_name") + 1
    where = [
        pa.field("device", pa.string()),  # device__attribute_display_name, e.g. "NVIDIA H100 PCIe"
        pa.field("nvtx_ranges", pa.string()),  # push/pop ranges around the launch: "a/b" (default domain), "dom@a/b"
        pa.field("report", pa.string()),  # the .ncu-rep file name
        pa.field("launch_index", pa.int32()),  # 0-based position of the launch in the report
    ]
    return pa.schema([*fields[:at], *where, *fields[at:]], metadata=base.metadata)


# ----------------------------------------------------------------------------- stage=tune
# Every measured trial of a tuning comparison (<workspace>/tune_trials/part-*.parquet).
TUNE_TRIALS = _schema(
    "tune_trials",
    [
        pa.field("tune_run", pa.string(), nullable=False),  # the stage run (time stamp)
        pa.field("task", pa.string()),  # task name (a network's task name for tune.tasks=<network>)
        pa.field("cost_model", pa.string()),  # ours | xgb | mlp | random
        pa.field("seed", pa.int64()),
        pa.field("trial", pa.int64()),  # 1-based, in measurement order within the task
        pa.field("batch", pa.int64()),  # 1-based search iteration that proposed it
        pa.field("latency_s", pa.float64()),  # mean of the runner's repeats; null when it failed
        pa.field("elapsed_s", pa.float64()),  # seconds since the tuning run started
        pa.field("error", pa.string()),
    ],
)
