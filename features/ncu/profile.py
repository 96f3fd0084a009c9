"""Profile kernels with Nsight Compute: one ncu process per batch, with isolation.

A batch of kernels runs in one process of the kernel harness (pipeline/device/harness,
`--in-process --instrument nvtx`: each kernel's profiled call inside an NVTX range named
by its record) under one ncu invocation, loading TVM and starting ncu once per batch
instead of once per kernel. The harness logs a start and a done line per kernel; when the
process crashes, hangs (killed after the timeout) or fails a kernel, the kernel with a
start and no done (or with an error) becomes an error row and a fresh invocation goes on
with the kernels that remain, so one bad kernel costs one retry, not the batch. A missing
ncu or missing permission to read the GPU counters stops everything with a message that
says what to install or set.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path


from features.ncu import command, report
from pipeline.device import harness
from pipeline.core import schema as S
from pipeline.core.catalog import Table, ncu_tables
from pipeline.core.errors import PipelineError
from pipeline.device.harness import EXIT_UNUSABLE

log = logging.getLogger(__name__)


class NcuError(RuntimeError):
    """ncu cannot profile on this machine; the message says how to fix it."""


NCU_MISSING = (
    "Nsight Compute (ncu) was not found as {exe!r}: install it (CUDA toolkit component "
    "`nsight-compute`, or https://developer.nvidia.com/nsight-compute) and put `ncu` on PATH, "
    "or set collect.ncu.executable=/path/to/ncu"
)
NCU_PERMISSION = (
    "ncu has no permission to read the GPU performance counters (ERR_NVGPUCTRPERM). Run the "
    "collect stage as root, or allow profiling for all users: add `options nvidia "
    "NVreg_RestrictProfilingToAdminUsers=0` to a file in /etc/modprobe.d/ and reload the "
    "nvidia kernel module (or reboot); see https://developer.nvidia.com/ERR_NVGPUCTRPERM. "
    "In a container, start it with --cap-add=SYS_ADMIN."
)


def find_ncu(exe: str = "ncu") -> str:
    path = shutil.which(exe)
    if not path:
        raise NcuError(NCU_MISSING.format(exe=exe))
    return path


def check_output(text: str) -> None:
    """Raise NcuError for the failures that no retry can fix."""
    if "ERR_NVGPUCTRPERM" in text:
        raise NcuError(NCU_PERMISSION)


def unknown_metrics(text: str, metrics: list[str]) -> list[str]:
    """Requested metric names that ncu names in an error line (unknown on this device)."""
    errors = [line for line in text.splitlines() if "==ERROR==" in line]
    return [m for m in metrics if any(re.search(rf"(?<![\w.]){re.escape(m)}(?![\w.])", e) for e in errors)]


@dataclass
class Options:
    ncu: str = "ncu"
    metrics: list[str] | None = None  # None with section_set
    section_set: str | None = None
    clock_control: str = "base"
    cache_control: str = "all"
    replay_mode: str = "kernel"
    batch_size: int = 64
    timeout_s: float = 900.0  # per batch
    warmup: int = 1
    extra_args: list[str] = field(default_factory=list)
    domain: str = command.NVTX_DOMAIN
    device: str = "cuda"  # the harness device (cpu only in tests of the orchestration)


@dataclass
class Outcome:
    kernels: list[dict]  # one row per profiled launch (report.read rows)
    errors: dict[str, str]  # record_id -> why it has no profile
    units: dict[str, str] = field(default_factory=dict)
    string_metrics: set = field(default_factory=set)
    metrics: list[str] = field(default_factory=list)
    dropped_metrics: dict[str, str] = field(default_factory=dict)  # metric -> reason
    reports: list[str] = field(default_factory=list)
    invocations: int = 0
    host: dict = field(default_factory=dict)  # where the kernels ran (harness.HOST_FIELDS)


def read_progress(path: Path) -> tuple[list[str], dict[str, str | None], dict]:
    """(record ids started, record id -> error or None for those done, where they ran) of a
    harness events file."""
    events = harness.read_events(path)
    started = [ev["record_id"] for ev in events if ev.get("event") == "start"]
    done = [ev for ev in events if ev.get("event") == "done"]
    host = next(({k: ev.get(k) for k in harness.HOST_FIELDS} for ev in done if ev.get("hardware")), {})
    return started, {ev["record_id"]: ev.get("error") for ev in done}, host


def settle(batch: list[str], started: list[str], done: dict[str, str | None], profiled: set[str],
           report_written: bool, verdict: str | None, tries: dict[str, int], max_tries: int = 2):
    """Decide what a finished invocation means for each record of its batch (pure).

    Returns (accepted, errors {record: reason}, retry): accepted records have profiles,
    errors are final, retry go into the next invocation."""
    accepted, errors, retry = [], {}, []
    for rid in batch:
        if rid in done:
            if done[rid]:
                errors[rid] = f"under ncu: {done[rid]}"
            elif rid in profiled:
                accepted.append(rid)
            elif not report_written and tries.get(rid, 0) + 1 < max_tries:
                retry.append(rid)  # ran, but the report of this invocation was lost
            elif not report_written:
                errors[rid] = f"ncu wrote no report ({verdict or 'unknown reason'})"
            else:
                errors[rid] = "ncu recorded no kernel launch in the record's NVTX range"
        elif rid in started:
            errors[rid] = verdict or "the harness stopped while this kernel ran"
        else:
            retry.append(rid)  # never reached in this invocation
    return accepted, errors, retry


def describe_exit(rc: int | None, timed_out: bool, timeout_s: float) -> str | None:
    if timed_out:
        return f"timeout: ncu and the harness were killed after {timeout_s:g} s"
    if rc == 0:
        return None
    return f"crashed: {harness.describe_exit(rc)}"


def harness_command(python: str, jobs_file: Path, progress: Path, root: Path, opts: Options) -> list[str]:
    """The kernel harness in this process under ncu: NVTX instrument, one event line per start and done."""
    return [*harness.command(python), "--in-process", "--jobs", str(jobs_file), "--out", str(progress),
            "--root", str(root), "--device", opts.device, "--instrument", "nvtx", "--domain", opts.domain,
            "--warmup", str(opts.warmup)]


def _invoke(batch: list[dict], stem: Path, ncu: str, metrics: list[str] | None, python: str, root: Path,
            opts: Options) -> tuple[int | None, bool, str]:
    """One ncu invocation of the harness over `batch`: files named `stem`.*; (rc, timed out, log)."""
    jobs_file, progress = stem.with_name(f"{stem.name}.jobs.jsonl"), stem.with_name(f"{stem.name}.progress.jsonl")
    rep, log_file = stem.with_name(f"{stem.name}.ncu-rep"), stem.with_name(f"{stem.name}.log")
    jobs_file.write_text("".join(json.dumps({k: j[k] for k in ("record_id", "artifact", "args")}) + "\n"
                                 for j in batch))
    target = harness_command(python, jobs_file, progress, root, opts)
    cmd = command.build_command(target, str(rep), ncu=ncu, metrics=metrics, section_set=opts.section_set,
                                clock_control=opts.clock_control, cache_control=opts.cache_control,
                                replay_mode=opts.replay_mode, domain=opts.domain, extra_args=opts.extra_args)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    child = harness.run_child(cmd, log_file, env=env, timeout_s=opts.timeout_s)
    return child.rc, child.timed_out, (log_file.read_text(errors="replace") if log_file.exists() else "")


def _read_into(out: Outcome, rep: Path, domain: str, metrics: list[str] | None,
               verdict: str | None) -> tuple[list[dict], bool, str | None]:
    """The rows of report `rep`, its units and metrics merged into `out`; a truncated or
    unreadable report counts as no report and says so in the verdict."""
    if not rep.exists():
        return [], False, verdict
    try:
        parsed = report.read(str(rep), domain, metrics)
    except Exception as e:  # noqa: BLE001 - a truncated report counts as no report
        return [], False, f"{verdict or 'ok'}; the report could not be read ({type(e).__name__}: {e})"
    out.units.update(parsed.units)
    out.string_metrics |= parsed.string_metrics
    out.metrics.extend(m for m in parsed.metrics if m not in out.metrics)
    out.reports.append(str(rep))
    return parsed.rows, True, verdict


def profile(jobs: list[dict], root: Path, report_dir: Path, opts: Options, python: str = sys.executable,
            on_batch=None, tag: str = "batch") -> Outcome:
    """Profile `jobs` (record_id, artifact, args); reports are kept in `report_dir`.

    `on_batch(outcome_part)` gets each invocation's accepted kernel rows and errors, so
    that the caller can write them as they come."""
    ncu = find_ncu(opts.ncu)
    metrics = list(opts.metrics) if opts.metrics else None
    out = Outcome(kernels=[], errors={}, metrics=list(metrics or []))
    report_dir.mkdir(parents=True, exist_ok=True)
    pending = [j["record_id"] for j in jobs]
    by_id = {j["record_id"]: j for j in jobs}
    tries: dict[str, int] = {}
    while pending:
        batch, pending = pending[: max(1, opts.batch_size)], pending[max(1, opts.batch_size):]
        name = f"{tag}-{uuid.uuid4().hex[:10]}"
        progress, rep = report_dir / f"{name}.progress.jsonl", report_dir / f"{name}.ncu-rep"
        rc, timed_out, text = _invoke([by_id[r] for r in batch], report_dir / name, ncu, metrics, python, root, opts)
        out.invocations += 1
        check_output(text)
        started, done, host = read_progress(progress)
        out.host = out.host or host
        bad = unknown_metrics(text, metrics) if metrics else []
        if bad:  # drop what this device does not know and profile the batch again
            for m in bad:
                out.dropped_metrics[m] = "ncu does not know this metric on this device"
            metrics = [m for m in metrics if m not in bad]
            if not metrics:
                raise NcuError(f"none of the requested metrics is known to ncu here: {bad}")
            pending = batch + pending
            continue
        if not started and (rc == EXIT_UNUSABLE or rc not in (0, None) or timed_out):
            tail = " | ".join(text.strip().splitlines()[-4:])[:800]
            raise NcuError(f"ncu could not run the harness ({describe_exit(rc, timed_out, opts.timeout_s)}): {tail}")
        verdict = describe_exit(rc, timed_out, opts.timeout_s)
        profiled_rows, report_read, verdict = _read_into(out, rep, opts.domain, metrics, verdict)
        profiled = {r["record_id"] for r in profiled_rows}
        accepted, errors, retry = settle(batch, started, done, profiled, report_read, verdict, tries)
        for rid in retry:
            if rid in done:  # ran, but its report was lost: counts as a try
                tries[rid] = tries.get(rid, 0) + 1
        ok = set(accepted)
        part = Outcome(kernels=[r for r in profiled_rows if r["record_id"] in ok], errors=errors,
                       units=out.units, string_metrics=out.string_metrics, metrics=out.metrics,
                       dropped_metrics=out.dropped_metrics, reports=[str(rep)] if rep.exists() else [],
                       host=out.host or harness.host_identity(opts.device))
        out.kernels += part.kernels
        out.errors.update(errors)
        if on_batch:
            on_batch(part, [by_id[r] for r in accepted + list(errors)])
        pending = retry + pending
    return out


def gpu_present() -> bool:
    """An NVIDIA driver is installed and a device node exists (no CUDA context made)."""
    return os.path.exists("/dev/nvidiactl") or bool(shutil.which("nvidia-smi") and
                                                     subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0)



class NcuProfiler:
    """collect.profiler=ncu: Nsight Compute features of built kernels, written per invocation
    to the per-record and per-kernel tables (`features/ncu*/device=<d>/`)."""

    name = "ncu"

    def __init__(self, options: Options, report_dir: Path, section_set: str | None = None, tag: str = "batch",
                 target_name: str = "h100"):
        self.options, self.report_dir, self.section_set = options, Path(report_dir), section_set
        self.tag, self.target_name = tag, target_name

    # a device bundle part runs this profiler on the host (pipeline/runner/part.py)
    on_device_host = True

    def tables(self) -> tuple[Table, Table]:
        return ncu_tables(self.section_set)

    def host_command(self, section_folder: str) -> dict:
        """What a bundle part runs: the ncu arguments (its report path `{report}` filled in on
        the host, the section files in `section_folder`) and the nvtx instrument's options."""
        o = self.options
        argv = command.build_command([], "{report}.ncu-rep", ncu="ncu", metrics=o.metrics, section_set=o.section_set,
                                     clock_control=o.clock_control, cache_control=o.cache_control,
                                     replay_mode=o.replay_mode, domain=o.domain, extra_args=o.extra_args,
                                     section_folder=section_folder)
        return dict(args=argv[1:], options=dict(domain=o.domain, warmup=o.warmup))

    def import_host(self, folder: Path, wanted: dict, write) -> tuple[int, int, set] | None:
        """The rows of the records in `wanted` (record_id -> task_id) that a bundle part's
        results folder holds, handed to `write`: (rows, error rows, the records settled); None
        when ncu did not run there."""
        part = read_host_results(folder, self.options.domain, self.options.metrics)
        if part is None:
            return None
        keep = {rid for rid in {k["record_id"] for k in part.kernels} | set(part.errors) if rid in wanted}
        part = Outcome(kernels=[k for k in part.kernels if k["record_id"] in keep],
                       errors={r: e for r, e in part.errors.items() if r in keep}, units=part.units,
                       string_metrics=part.string_metrics, metrics=part.metrics, host=part.host)
        settled = [dict(record_id=r, task_id=wanted[r]) for r in sorted(keep)]
        ok, bad = write_outcome(part, settled, self.tables(), self.options.metrics, write)
        return ok, bad, keep

    @property
    def batch_size(self) -> int:
        """Kernels per ncu invocation (the collect stage's executor job)."""
        return self.options.batch_size

    def profile(self, jobs: list[dict], errors: list[dict], *, root, write, progress=None) -> dict:
        """Profile `jobs` (record_id, task_id, artifact, args); `write(table, rows, schema)` gets
        each invocation's rows, `errors` (rows of records that cannot run) first."""
        counts = {"ncu": 0, "ncu_errors": 0}
        if not gpu_present():
            log.warning("no NVIDIA GPU on this machine: Nsight Compute features are not collected. Run "
                        "`python -m pipeline stage=collect target=%s` on the GPU host (collect.static=false "
                        "skips what is already here), or set collect.profiler=none.", self.target_name)
            counts["ncu_skipped_no_gpu"] = len(jobs)
            return counts

        def settled(part: Outcome, settled_jobs: list[dict]) -> None:
            ok, bad = write_outcome(part, settled_jobs, self.tables(), self.options.metrics, write)
            counts["ncu"] += ok
            counts["ncu_errors"] += bad
            if progress:
                progress(len(settled_jobs))

        if errors:
            settled(Outcome(kernels=[], errors={e["record_id"]: e["error"] for e in errors}), errors)
        if jobs:
            try:
                outcome = profile(jobs, root, self.report_dir, self.options, on_batch=settled, tag=self.tag)
            except NcuError as e:
                raise PipelineError(f"stage=collect: {e}") from e
            counts["ncu_invocations"] = outcome.invocations
            if outcome.dropped_metrics:
                log.warning("metrics unknown to ncu on this device (null columns): %s", sorted(outcome.dropped_metrics))
        return counts


def write_outcome(part: Outcome, settled_jobs: list[dict], tables: tuple[Table, Table], metrics: list[str] | None,
                  write) -> tuple[int, int]:
    """Write one profiling outcome with `write(table, rows, schema)`: kernel rows, per-record
    aggregates, error rows in both; returns (records profiled, records failed).

    Columns: the requested metric list, or (for a section set) every metric of the reports
    so far. ncu's units and the reasons for metrics left null go into the file metadata
    (`pipeline.units`, `pipeline.null_reasons`, JSON)."""
    records, kernels = tables
    cols = list(metrics) if metrics else list(part.metrics)
    meta = {b"pipeline.units": json.dumps(part.units).encode(),
            b"pipeline.null_reasons": json.dumps(part.dropped_metrics).encode()}
    ks, rs = (S.ncu_schema(t.name, cols, frozenset(part.string_metrics), per_kernel)
              for t, per_kernel in ((kernels, True), (records, False)))
    ks, rs = (s.with_metadata({**s.metadata, **meta}) for s in (ks, rs))
    task_of = {j["record_id"]: j["task_id"] for j in settled_jobs}
    krows = [dict(r, task_id=task_of[r["record_id"]], **part.host) for r in part.kernels]
    rrows = [dict(r, task_id=task_of[r["record_id"]], **part.host)
             for r in report.aggregate(part.kernels, cols, part.string_metrics)]
    err = [dict(record_id=rid, task_id=task_of[rid], error=e, **part.host) for rid, e in part.errors.items()]
    write(kernels, krows + err, ks)
    write(records, rrows + err, rs)
    return len(rrows), len(err)


# The reason a kernel that ran under ncu on a device host has no profile.
NO_LAUNCH = ("ncu recorded no kernel launch in the record's NVTX range, or the report of its ncu run was "
             "lost (see ncu.log in the results)")


def read_host_results(folder: Path, domain: str, metrics: list[str] | None) -> Outcome | None:
    """The profiles of a device bundle part's results folder (its ncu.jsonl events and the
    ncu-*.ncu-rep reports, read here), as one Outcome; None when ncu did not run there.

    A kernel whose done event has an error keeps that error; one that ran but is in no
    report gets NO_LAUNCH; a kernel profiled twice (a run resumed after a crash) keeps
    the rows of the latest report."""
    done = harness.done_events(folder / "ncu.jsonl")
    if not done:
        return None
    out = Outcome(kernels=[], errors={}, metrics=list(metrics or []))
    rows: dict[str, list[dict]] = {}
    for rep in sorted(folder.glob("ncu-*.ncu-rep")):
        try:
            parsed = report.read(str(rep), domain, metrics)
        except report.ReportError as e:
            log.warning("%s", e)
            continue
        out.reports.append(str(rep))
        out.units.update(parsed.units)
        out.string_metrics |= parsed.string_metrics
        out.metrics += [m for m in parsed.metrics if m not in out.metrics]
        fresh: dict[str, list[dict]] = {}
        for r in parsed.rows:
            if r["record_id"]:
                fresh.setdefault(r["record_id"], []).append(r)
        rows.update(fresh)
    for rid, ev in done.items():
        if ev.get("error"):
            out.errors[rid] = f"under ncu: {ev['error']}"
        elif rid in rows:
            out.kernels += rows[rid]
        else:
            out.errors[rid] = NO_LAUNCH
        if not out.host and ev.get("hardware"):
            out.host = {k: ev.get(k) for k in harness.HOST_FIELDS}
    return out
