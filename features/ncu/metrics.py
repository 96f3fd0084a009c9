"""The curated Nsight Compute metric list of `collect=ncu` (one ncu pass set per kernel).

Chosen for a performance model: time, speed-of-light throughputs, memory traffic per
level, cache hit rates, occupancy and its limiters, launch configuration, instruction
mix, shared-memory bank conflicts and the warp stall breakdown. Names are ncu metric
names (`ncu --query-metrics`); a name the device does not know is dropped before
profiling and recorded with its reason. `collect=ncu_full` uses `--set full` instead.

A report made with sections (`--set full`, the default sections) publishes some of these
values under other names: `ALIASES` says where, and the parser stores them under the
curated name. `METRICS_ONLY` lists the curated names that no section of `--set full`
publishes, even under another name: only `--metrics` collection gives them.
"""

from __future__ import annotations

from typing import NamedTuple

from pipeline.core.schema import ncu_schema

STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
    "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait",
)

# group -> metric names (order is the column order of the Parquet tables).
GROUPS: dict[str, tuple[str, ...]] = {
    "time": (
        "gpu__time_duration.sum",
        "sm__cycles_elapsed.avg",
        "sm__cycles_active.avg",
        "smsp__cycles_active.avg",
    ),
    "throughput": (
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__throughput.avg.pct_of_peak_sustained_active",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    ),
    "memory": (
        "dram__bytes_read.sum",
        "dram__bytes_write.sum",
        "lts__t_bytes.sum",
        "l1tex__t_bytes.sum",
        "lts__t_sectors_op_read.sum",
        "lts__t_sectors_op_write.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
    ),
    "cache": (
        "l1tex__t_sector_hit_rate.pct",
        "lts__t_sector_hit_rate.pct",
    ),
    "bank_conflicts": (
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    ),
    "occupancy": (
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "sm__maximum_warps_per_active_cycle_pct",
        "launch__occupancy_limit_blocks",
        "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem",
        "launch__occupancy_limit_warps",
        "launch__waves_per_multiprocessor",
    ),
    "launch": (
        "launch__grid_size",
        "launch__block_size",
        "launch__thread_count",
        "launch__registers_per_thread",
        "launch__shared_mem_per_block_static",
        "launch__shared_mem_per_block_dynamic",
    ),
    "instructions": (
        "smsp__inst_executed.sum",
        "sm__inst_executed.avg.per_cycle_active",
        "smsp__thread_inst_executed_per_inst_executed.ratio",
        "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "smsp__warps_eligible.avg.per_cycle_active",
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_dadd_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum",
        "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum",
        "smsp__sass_inst_executed_op_global_ld.sum",
        "smsp__sass_inst_executed_op_global_st.sum",
        "smsp__sass_inst_executed_op_shared_ld.sum",
        "smsp__sass_inst_executed_op_shared_st.sum",
        "smsp__sass_inst_executed_op_local_ld.sum",
        "smsp__sass_inst_executed_op_local_st.sum",
        "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    ),
    "stalls": (
        "smsp__average_warp_latency_per_inst_issued.ratio",
        *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS),
    ),
}

DEFAULT_METRICS: tuple[str, ...] = tuple(m for names in GROUPS.values() for m in names)


class Published(NamedTuple):
    """The name under which a section publishes a curated value.

    `times`: the published value is a per-cycle rate; multiplied by this elapsed-cycles
    metric of the same launch it gives the curated count back (used only when the rate's
    unit is `<unit>/<unit of times>`, so that the units cancel)."""

    name: str
    times: str | None = None


def _sass_op(op: str) -> str:
    return f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"


# Curated name -> where a section publishes the same quantity; read only when a report
# lacks the curated name. Measured on real `--set full` (H100, ncu 2025.1) and
# default-section (A100, RTX 3070) reports:
# - DRAM throughput: the Speed Of Light section names its "DRAM Throughput" row
#   gpu__dram_throughput (% of peak, the same breakdown of DRAM activity); no section
#   report has dram__throughput.
# - Floating-point instruction counts: the roofline sections publish the FP32 (fadd,
#   fmul, ffma), FP64 (dadd, dmul, dfma) and FP16 (hfma) counts only as
#   `.sum.per_cycle_elapsed`, which is `.sum` / smsp__cycles_elapsed.avg; the product
#   with smsp__cycles_elapsed.avg of the same launch is the count (integers on the H100
#   report, where sm__inst_executed.sum.per_cycle_elapsed x sm__cycles_elapsed.avg also
#   equals smsp__inst_executed.sum).
ALIASES: dict[str, Published] = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed":
        Published("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    **{_sass_op(op): Published(f"{_sass_op(op)}.per_cycle_elapsed", times="smsp__cycles_elapsed.avg")
       for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hfma")},
}

# Curated names that no section of `--set full` publishes, not even under another name or
# as a rate that converts exactly: a report made with sections leaves these columns null;
# `collect=ncu` (`--metrics`) collects them.
METRICS_ONLY: dict[str, str] = {
    "lts__t_bytes.sum": "sections count L2 traffic in sectors (lts__t_sectors.sum); the bytes per "
                        "sector are not a value of the report",
    "l1tex__t_bytes.sum": "sections break L1 traffic down per pipe and memory space "
                          "(l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum, ...) with no total",
    "lts__t_sectors_op_read.sum": "sections count L2 reads per source unit (lts__t_sectors_srcunit_tex_op_read.sum "
                                  "counts only those from L1), not over all units",
    "lts__t_sectors_op_write.sum": "sections count L2 writes per source unit (lts__t_sectors_srcunit_tex_op_write.sum "
                                   "counts only those from L1), not over all units",
    _sass_op("hadd"): "no section publishes FP16 add counts, not even as a rate",
    _sass_op("hmul"): "no section publishes FP16 multiply counts, not even as a rate",
}

# The metric that weights per-kernel values when a record launches several kernels.
TIME_METRIC = "gpu__time_duration.sum"


def resolve(metrics) -> list[str]:
    """`default` (or None) -> the curated list; a list of names -> itself, deduplicated."""
    if metrics is None or (isinstance(metrics, str) and metrics == "default"):
        return list(DEFAULT_METRICS)
    if isinstance(metrics, str):
        metrics = [m.strip() for m in metrics.split(",") if m.strip()]
    out = []
    for m in metrics:
        if m not in out:
            out.append(str(m))
    if not out:
        raise ValueError("collect.ncu.metrics is empty: give `default`, a list of ncu metric names, "
                         "or use collect.ncu.set=full")
    return out


def is_additive(name: str) -> bool:
    """Counters that add up over the kernels of one record (time, bytes, instructions)."""
    return name.endswith(".sum")


# The tables of `collect=ncu` with the curated list: per kernel launch and per record.
NCU_KERNELS = ncu_schema("ncu_kernels", list(DEFAULT_METRICS), per_kernel=True)
NCU = ncu_schema("ncu", list(DEFAULT_METRICS), per_kernel=False)
