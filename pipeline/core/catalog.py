"""The workspace's tables by name: where each lives, its schema, key and partitioning.

Stages name the tables they read and write (`ws.read("kernels")`, `ws.writer("measurements",
...)`) instead of building paths; the catalog is the one place that maps a name to a file
or folder under the workspace, so a layout change is one edit here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from pipeline.core import schema as S


@dataclass(frozen=True)
class Table:
    name: str
    path: str  # relative to the workspace root: a folder of part files, or one .parquet file
    schema: pa.Schema | None  # None: the writer gives it per part (ncu: one column per metric)
    key: tuple[str, ...]  # what identifies a row; stages resume on it
    stage: str  # the stage that writes it (named when it is missing)
    partition: str | None = None  # Hive partition column in the path (`device=<d>/`)

    @property
    def is_folder(self) -> bool:
        return not self.path.endswith(".parquet")


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("tasks", "tasks.parquet", S.TASKS, ("task_id",), "tasks"),
    Table("network_tasks", "network_tasks.parquet", S.NETWORK_TASKS, ("network", "task_id"), "tasks"),
    Table("ansor_records", "ansor_records.parquet", S.ANSOR_RECORDS, ("record_id",), "download"),
    Table("candidates", "candidates", S.CANDIDATES, ("record_id",), "sample"),
    Table("kernels", "kernels", S.KERNELS, ("record_id",), "replay"),
    Table("measurements", "measurements", S.MEASUREMENTS, ("record_id",), "measure"),
    Table("static", "features/static", S.STATIC, ("record_id",), "collect"),
    Table("static_stores", "features/static_stores", S.STATIC_STORES, ("record_id", "store_index"), "collect"),
    Table("cuda_resources", "features/cuda_resources", S.CUDA_RESOURCES, ("record_id", "kernel_index"), "collect"),
    Table("cpu_counters", "features/cpu", S.CPU_COUNTERS, ("record_id",), "collect", partition="device"),
    Table("ncu", "features/ncu", None, ("record_id",), "collect", partition="device"),
    Table("ncu_kernels", "features/ncu_kernels", None, ("record_id", "kernel_index"), "collect", partition="device"),
    Table("tune_trials", "tune_trials", S.TUNE_TRIALS, ("tune_run", "task", "cost_model", "seed", "trial"), "tune"),
)}


def table(name: str | Table) -> Table:
    if isinstance(name, Table):
        return name
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no table {name!r} in the workspace catalog; known: {', '.join(TABLES)}") from None


def ncu_tables(section_set: str | None = None) -> tuple[Table, Table]:
    """(per-record, per-kernel) Nsight Compute tables; a section set gets tables of its own
    (`features/ncu_<set>/`), since its columns differ from the curated list's."""
    records, kernels = TABLES["ncu"], TABLES["ncu_kernels"]
    if not section_set:
        return records, kernels
    return (Table(f"ncu_{section_set}", f"features/ncu_{section_set}", None, records.key, "collect", "device"),
            Table(f"ncu_{section_set}_kernels", f"features/ncu_{section_set}_kernels", None, kernels.key,
                  "collect", "device"))
