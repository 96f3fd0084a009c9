"""The measured schedules of kept tuning runs, as training records of a workspace.

A tuning run kept in `tune.results` keeps its MetaSchedule database (comparison.keep_database):
every schedule it measured, on the region of the search space a tuner visits. `import_runs`
turns the runs of chosen networks into rows of a workspace made from the release they were
tuned on: a candidate (strategy `tuning:<cost model>`), a measurement (`timer="tuning"`: the
runner's run times, compared only with other such rows of the task, never with the harness's
labels) and the static features of each new schedule. Training reads them as training
records only (models/splits.py `training_only`): every score stays on the harness's labels.
A schedule the workspace already holds keeps its harness label; one measured by several runs
comes in once.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import pandas as pd

from features import static
from pipeline.compute.progress import progress
from pipeline.core import database as D
from pipeline.core import identity
from pipeline.core import release as R
from pipeline.core.workspace import Workspace, WorkspaceError, write_json
from pipeline.tuning.comparison import DATABASE_FILES, RESULT_FILE, kept_records

log = logging.getLogger(__name__)

TIMER = "tuning"  # measurements.timer of an imported record
STRATEGY_PREFIX = "tuning:"
FAILED = "the tuning run's runner gave no run time (build or run failure)"


class KeptRunError(WorkspaceError):
    """Kept tuning runs that cannot become records of this workspace."""


def kept_runs(folders: list[Path], networks: list[str]) -> list[Path]:
    """The run folders (<folder>/<settings>/<network>/<run>/) of `networks` that kept their
    database, in path order, searched in `folders` in turn (a release's kept runs, then those
    of the releases it extends)."""
    runs = []
    for network in networks:
        found = [p.parent for folder in folders for p in sorted(folder.glob(f"*/{network}/*/{DATABASE_FILES[1]}.gz"))]
        if not found:
            raise KeptRunError(
                f"no kept tuning run of network {network!r} under {' or '.join(str(f) for f in folders)}: tune it "
                f"with tune.results set (budget=transfer keeps runs in data/tuning), or leave it out of "
                f"dataset.tuning_networks")
        runs += found
    return runs


def _run_row(run: Path) -> dict:
    """The row of a kept run's result.json: its cost model and the CPU that tuned it."""
    try:
        row = dict(json.loads((run / RESULT_FILE).read_text())["row"])
        row["cost_model"] = str(row["cost_model"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KeptRunError(f"{run / RESULT_FILE}: unreadable ({e}); a kept run writes it after its database") from e
    return row


VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}  # CPUID vendor -> the word in the model name


def check_same_cpu(runs: list[Path], hardware: dict) -> None:
    """Refuse runs tuned on another CPU than the one that timed a release's labels
    (`hardware`: its manifest's, release.hardware_of): their run times would join that
    machine's as if timed there. What neither side recorded (runs kept before they wrote
    their CPU) cannot be checked and passes."""
    mine, model = hardware.get("cpu_signature"), hardware.get("cpu_model")
    for run in runs:
        row = _run_row(run)
        theirs, run_model = row.get("cpu_signature"), row.get("cpu_model")
        vendor = VENDORS.get(str(theirs).split(" ")[0]) if theirs else None
        if ((mine and theirs and mine != theirs) or (model and run_model and model != run_model)
                or (model and vendor and vendor not in str(model))):
            raise KeptRunError(
                f"{run}: tuned on {run_model or theirs}, but the release's labels were timed on {model or mine}: "
                f"run times of two CPUs do not join one workspace. Give dataset.tuning_results the folder of the "
                f"runs tuned on the labels' machine (tune.results keeps one folder per machine), or leave this "
                f"network out of dataset.tuning_networks")


def _host(ws: Workspace) -> dict:
    """The machine the workspace's harness labels come from: the kept runs were tuned on it
    (check_same_cpu, before the workspace is made)."""
    meas = ws.read("measurements", require=True, columns=["device", "hardware", "cpu_model", "cpu_count", "gpu_name",
                                                           "gpu_driver", "timer"])
    meas = meas[meas["timer"].isna() & meas["hardware"].notna()]
    hosts = meas.drop(columns=["timer"]).drop_duplicates()
    if len(hosts) != 1:
        raise KeptRunError(f"{ws.measurements}: tuning runs join a workspace whose labels come from one machine; "
                           f"this one has {len(hosts)}")
    return {k: (None if pd.isna(v) else v) for k, v in hosts.iloc[0].to_dict().items()}


def _measurement(rid: str, tid: str, run_secs: list | None, host: dict) -> dict:
    secs = [float(s) for s in (run_secs or [])]
    row = dict(record_id=rid, task_id=tid, run_secs=secs, repeats=len(secs), checked=False, timer=TIMER, **host)
    if not secs or any(s >= D.FAILED_RUN_SECS for s in secs):
        return {**row, "error": FAILED}
    return {**row, "mean_s": statistics.fmean(secs), "median_s": statistics.median(secs),
            "std_s": statistics.pstdev(secs), "min_s": min(secs), "error": None}


def import_runs(ws: Workspace, runs: list[Path]) -> dict:
    """Every schedule the kept `runs` measured, as rows of `ws` (see the module docstring);
    returns counts."""
    tasks = ws.read("tasks", require=True).set_index("task_id")
    workloads = D.read_workload_lines(ws)
    host = _host(ws)
    known = set(ws.read("candidates", columns=["record_id"])["record_id"])
    counts = {"runs": len(runs), "schedules": 0, "imported": 0, "already_held": 0, "failed": 0,
              "other_tasks": 0}
    by_task: dict[str, list] = {}
    task_of: dict[str, str] = {}  # a workload's structural hash in a kept database -> task id
    for run in runs:
        kind = _run_row(run)["cost_model"]
        try:
            lines, records = kept_records(run)
        except (OSError, ValueError) as e:
            raise KeptRunError(str(e)) from e
        for r in records:
            key = lines[r.workload_index][0]
            if key not in task_of:
                task_of[key] = identity.task_id(D.load_workload_mod(lines[r.workload_index]))
            tid = task_of[key]
            counts["schedules"] += 1
            if tid not in tasks.index:
                counts["other_tasks"] += 1
                continue
            rid = r.record_id(tid)
            if rid in known:
                counts["already_held"] += 1
                continue
            known.add(rid)
            by_task.setdefault(tid, []).append((rid, r, kind))
    if counts["other_tasks"]:
        log.warning("%d schedules of the kept runs belong to tasks %s does not hold: left out",
                    counts["other_tasks"], ws.root)
    bar = progress(total=sum(len(v) for v in by_task.values()), desc="import tuning runs", unit="record")
    with ws.sink() as write:
        for tid, items in sorted(by_task.items()):
            index = int(tasks.loc[tid, "workload_index"])
            cands = [dict(record_id=rid, task_id=tid, strategy=f"{STRATEGY_PREFIX}{kind}", trace_json=r.trace_text,
                          error=None) for rid, r, kind in items]
            meas = [_measurement(rid, tid, r.run_secs, host) for rid, r, _ in items]
            feats = static.task_rows(workloads[index], json.loads(tasks.loc[tid, "target"]),
                                     [(c["record_id"], tid, c["trace_json"], None) for c in cands])
            write("candidates", cands)
            write("measurements", meas)
            for name in ("static", "static_stores"):
                write(name, feats[name])
            D.append_records(ws.db_tuning_record, [
                D.RecordLine(index, r.trace, r.run_secs, r.target, r.args_info, None, None) for _, r, _ in items])
            counts["imported"] += len(items)
            counts["failed"] += sum(1 for m in meas if m["error"])
            bar.update(len(items))
    bar.close()
    write_json(ws.root / R.TUNING_RUNS, {"networks": sorted({run.parent.name for run in runs}),
                                     "runs": [str(Path(*run.parts[-3:])) for run in runs], "counts": counts})
    return counts

