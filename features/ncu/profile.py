"""Profile kernels with Nsight Compute: one ncu process per batch, with isolation.

A batch of kernels runs in one harness process under one ncu invocation (loading TVM
and starting ncu once per batch instead of once per kernel). The harness logs a start
and a done line per kernel; when the process crashes, hangs (killed after the timeout)
or fails a kernel, the kernel with a start and no done (or with an error) becomes an
error row and a fresh invocation goes on with the kernels that remain, so one bad
kernel costs one retry, not the batch. A missing ncu or missing permission to read the
GPU counters stops everything with a message that says what to install or set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from features.ncu import command, report
from features.ncu.harness import EXIT_UNUSABLE

HARNESS = Path(__file__).with_name("harness.py")


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


def read_progress(path: Path) -> tuple[list[str], dict[str, str | None]]:
    """(record ids started, record id -> error or None for those done)."""
    started, done = [], {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if ev.get("event") == "start":
                started.append(ev["record_id"])
            elif ev.get("event") == "done":
                done[ev["record_id"]] = ev.get("error")
    return started, done


def settle(batch: list[str], started: list[str], done: dict[str, str | None], profiled: set[str],
           report_written: bool, verdict: str | None, tries: dict[str, int], max_tries: int = 2):
    """Decide what a finished invocation means for each record of its batch (pure).

    Returns (accepted, errors {record: reason}, retry): accepted records have profiles,
    errors are final, retry go into the next invocation."""
    accepted, errors, retry = [], {}, []
    for rid in batch:
        if rid in done:
            if done[rid]:
                errors[rid] = f"run under ncu: {done[rid]}"
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


def _run(cmd: list[str], timeout_s: float, env: dict) -> tuple[int | None, str, bool]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out.decode(errors="replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out.decode(errors="replace"), True


def describe_exit(rc: int | None, timed_out: bool, timeout_s: float) -> str | None:
    if timed_out:
        return f"timeout: ncu and the harness were killed after {timeout_s:g} s"
    if rc == 0:
        return None
    if rc is not None and rc < 0:
        try:
            return f"crashed: signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"crashed: signal {-rc}"
    return f"crashed: exit code {rc}"


def profile(jobs: list[dict], root: Path, report_dir: Path, opts: Options, python: str = sys.executable,
            on_batch=None, tag: str = "batch") -> Outcome:
    """Profile `jobs` (record_id, artifact, args); reports are kept in `report_dir`.

    `on_batch(outcome_part)` gets each invocation's accepted kernel rows and errors, so
    that the caller can write them as they come."""
    ncu = find_ncu(opts.ncu)
    metrics = list(opts.metrics) if opts.metrics else None
    out = Outcome(kernels=[], errors={}, metrics=list(metrics or []))
    report_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    pending = [j["record_id"] for j in jobs]
    by_id = {j["record_id"]: j for j in jobs}
    tries: dict[str, int] = {}
    while pending:
        batch, pending = pending[: max(1, opts.batch_size)], pending[max(1, opts.batch_size):]
        name = f"{tag}-{uuid.uuid4().hex[:10]}"
        manifest, progress = report_dir / f"{name}.json", report_dir / f"{name}.progress.jsonl"
        rep = report_dir / f"{name}.ncu-rep"
        manifest.write_text(json.dumps({"domain": opts.domain, "warmup": opts.warmup,
                                        "kernels": [{k: by_id[r][k] for k in ("record_id", "artifact", "args")}
                                                    for r in batch]}))
        harness = [python, str(HARNESS), "--manifest", str(manifest), "--progress", str(progress),
                   "--root", str(root), "--device", opts.device]
        cmd = command.build_command(harness, str(rep), ncu=ncu, metrics=metrics, section_set=opts.section_set,
                                    clock_control=opts.clock_control, cache_control=opts.cache_control,
                                    replay_mode=opts.replay_mode, domain=opts.domain, extra_args=opts.extra_args)
        rc, text, timed_out = _run(cmd, opts.timeout_s, env)
        out.invocations += 1
        check_output(text)
        started, done = read_progress(progress)
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
        profiled_rows: list[dict] = []
        report_read = False
        if rep.exists():
            try:
                parsed = report.read(str(rep), opts.domain, metrics)
                profiled_rows = parsed.rows
                out.units.update(parsed.units)
                out.string_metrics |= parsed.string_metrics
                for m in parsed.metrics:
                    if m not in out.metrics:
                        out.metrics.append(m)
                out.reports.append(str(rep))
                report_read = True
            except Exception as e:  # noqa: BLE001 - a truncated report counts as no report
                verdict = f"{verdict or 'ok'}; the report could not be read ({type(e).__name__}: {e})"
        profiled = {r["record_id"] for r in profiled_rows}
        accepted, errors, retry = settle(batch, started, done, profiled, report_read, verdict, tries)
        for rid in retry:
            if rid in done:  # ran, but its report was lost: counts as a try
                tries[rid] = tries.get(rid, 0) + 1
        ok = set(accepted)
        part = Outcome(kernels=[r for r in profiled_rows if r["record_id"] in ok], errors=errors,
                       units=out.units, string_metrics=out.string_metrics, metrics=out.metrics,
                       dropped_metrics=out.dropped_metrics, reports=[str(rep)] if rep.exists() else [])
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

