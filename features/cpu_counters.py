"""CPU counters of llvm kernels: `perf stat` around N calls, getrusage and wall time.

The kernel harness's perf instrument (pipeline/device/harness) loads each kernel in a
supervised child process, makes its inputs as the measure stage does, warms it up and
picks N so that the counted loop lasts `min_time_s`; `perf stat -p <child>` starts with
counting disabled and the child switches it on and off around the loop through perf's
control FIFO, so the counts cover exactly the N calls (per call = count / N) and not
loading or input generation. This module decides which events to ask for and turns the
harness's events into rows.

Where the machine does not expose an event (hardware counters in VMs and containers:
perf_event_open fails), or perf is not installed, the value is null and `<col>.reason`
says why; a counter is never reported as zero when it was not counted. getrusage deltas
(page faults, context switches, user/system time) and wall time need nothing and are
always there.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

from pipeline.device import harness
from pipeline.core.catalog import Table, table
from pipeline.core.schema import PERF_EVENTS, RUSAGE_FIELDS
from pipeline.core.workspace import Workspace

PERF_MISSING = ("perf not installed: install it (Debian: apt-get install linux-perf; Ubuntu: "
                "apt-get install linux-tools-$(uname -r)) or set collect.perf.executable")


# ----------------------------------------------------------------------------- perf


def perf_version(perf: str) -> str | None:
    try:
        out = subprocess.run([perf, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def parse_perf_csv(text: str) -> dict[str, tuple[float | None, str | None]]:
    """perf stat -x, output -> event -> (value in perf's unit, reason when not counted)."""
    out: dict[str, tuple[float | None, str | None]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(",")
        if len(parts) < 3:
            continue
        value, unit, event = parts[0].strip(), parts[1].strip(), parts[2].strip()
        if not event:
            continue
        if value.startswith("<"):
            reason = {
                "<not supported>": "not supported on this machine (perf_event_open refused the event: "
                                   "hardware counters are not exposed here, e.g. in a VM or container)",
                "<not counted>": "not counted (the event was never scheduled on a counter)",
            }.get(value, f"perf reported {value}")
            out[event] = (None, reason)
            continue
        try:
            v = float(value)
        except ValueError:
            out[event] = (None, f"unparsable perf value {value!r}")
            continue
        if unit == "msec":
            v /= 1e3  # task-clock: seconds
        out[event] = (v, None)
    return out


def probe_perf(perf_exe: str, events: list[str]) -> tuple[str | None, list[str], dict[str, str]]:
    """(perf path, events worth counting, reasons for the others) on this machine.

    One `perf stat -- true` tells which events the kernel refuses, so that per-kernel runs
    ask only for the rest and every missing counter gets its reason once."""
    unknown = [e for e in events if e not in PERF_EVENTS.values()]
    if unknown:
        raise ValueError(f"collect.perf.events: unknown event(s) {unknown}; known: {list(PERF_EVENTS.values())}")
    path = shutil.which(perf_exe)
    if not path:
        return None, [], {e: PERF_MISSING for e in events}
    try:
        proc = subprocess.run([path, "stat", "-x", ",", "-e", ",".join(events), "--", "true"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, [], {ev: f"perf stat failed: {e}" for ev in events}
    parsed = parse_perf_csv(proc.stderr)
    if proc.returncode != 0 or not parsed:
        msg = " ".join(proc.stderr.strip().splitlines()[-3:])[:300]
        return None, [], {ev: f"perf stat failed on this machine: {msg}" for ev in events}
    usable, reasons = [], {}
    for ev in events:
        v, reason = parsed.get(ev, (None, "perf printed no value for this event"))
        if reason:
            reasons[ev] = reason
        else:
            usable.append(ev)
    return path, usable, reasons


# ----------------------------------------------------------------------------- profiler


class CpuCounters:
    """collect.profiler=perf: the kernel harness's perf instrument in child processes of its
    supervisor (`batch_size` kernels each), one CPU_COUNTERS row per kernel."""

    name = "cpu"
    # counted here or on the executor's nodes, never by a device bundle part
    on_device_host = False

    def __init__(self, executable: str = "perf", events: tuple[str, ...] = tuple(PERF_EVENTS.values()),
                 min_time_s: float = 0.2, max_calls: int = 100000, timeout_s: float = 60.0, batch_size: int = 64):
        self.executable, self.events = str(executable), [str(e) for e in events]
        self.min_time_s, self.max_calls = float(min_time_s), int(max_calls)
        self.timeout_s, self.batch_size = float(timeout_s), max(1, int(batch_size))

    def tables(self) -> tuple[Table, ...]:
        return (table("cpu_counters"),)

    def profile(self, jobs: list[dict], errors: list[dict], *, root, write, progress=None) -> dict:
        """Count `jobs` (record_id, task_id, artifact, args); `write(table, rows)` gets the rows
        as they come, `errors` (rows of records that cannot run) first."""
        out = self.tables()[0]
        write(out, errors)
        if progress:
            progress(len(errors))
        counts = {"cpu": 0, "cpu_errors": len(errors)}
        perf, usable, reasons = probe_perf(self.executable, self.events)
        version = perf_version(perf) if perf else None
        for ev in PERF_EVENTS.values():
            if ev not in self.events:
                reasons[ev] = "not selected (collect.perf.events)"
        options = dict(min_time_s=self.min_time_s, max_calls=self.max_calls, perf=perf or "",
                       perf_events=",".join(usable))
        by_id = {j["record_id"]: j for j in jobs}

        def done(event):
            row = counter_row(by_id[event["record_id"]], event, usable, reasons, version)
            counts["cpu_errors" if row.get("error") else "cpu"] += 1
            write(out, [row])
            if progress:
                progress(1)

        with tempfile.TemporaryDirectory(prefix="cpu-counters-") as tmp:
            events = Path(tmp) / "events.jsonl"
            for start in range(0, len(jobs), self.batch_size):
                events.unlink(missing_ok=True)
                harness.supervise(jobs[start:start + self.batch_size], events, root=root, device="cpu",
                                  instrument="perf", options=options, timeout_s=self.timeout_s, on_done=done)
        return counts


def counter_row(job: dict, event: dict, usable: list[str], reasons: dict[str, str], version: str | None) -> dict:
    """A CPU_COUNTERS row from the harness's done event of one kernel (values per call)."""
    row = {"record_id": job["record_id"], "task_id": job["task_id"], "perf_version": version,
           **{k: event.get(k) for k in harness.HOST_FIELDS}}  # where it ran
    if event.get("error"):
        row["error"] = event["error"]
        return row
    counted = parse_perf_csv(event["perf_csv"]) if event.get("perf_csv") else {}
    if usable and not counted:
        why = event.get("perf_stderr") or "no output"
        counted = {ev: (None, f"perf stat -p failed: {why}") for ev in usable}
    calls = event["calls"]
    row.update(calls=calls, wall_s=event["wall_s"], **{"rusage.max_rss_bytes": event["max_rss_bytes"]})
    row.update({f"rusage.{col}": event["rusage"][field] for col, field in RUSAGE_FIELDS.items()})
    for col, ev in PERF_EVENTS.items():
        value, reason = counted.get(ev, (None, reasons.get(ev, "perf printed no value for this event")))
        row[f"perf.{col}"] = None if value is None else value / calls
        row[f"perf.{col}.reason"] = reason if value is None else None
    return row


def load(ws: Workspace, device: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """(per-record counters, column -> why it has no value) of a workspace, error rows left out."""
    df = ws.read("cpu_counters", device)
    df = df[df["error"].isna()].drop_duplicates("record_id", keep="last").reset_index(drop=True)
    reasons = {}
    for col in PERF_EVENTS:
        r = df[f"perf.{col}.reason"].dropna()
        if len(r):
            reasons[f"perf.{col}"] = str(r.iloc[0])
    meta = ("error", "perf_version", *harness.HOST_FIELDS)
    keep = [c for c in df.columns if not c.endswith(".reason") and c not in meta]
    return df[keep], reasons
