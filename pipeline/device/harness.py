#!/usr/bin/env python3
"""The kernel harness: load exported kernels, make seeded inputs, run them under an
instrument, write start/done events; and the supervisor that isolates crashes and hangs.

This file is self-contained (Python's standard library, NumPy, the TVM runtime; `nvtx`
only for the NVTX instrument; no project imports) so that a GPU host with a
runtime-only TVM (`TVM_USE_RUNTIME_LIB=1`) runs it on shipped artifacts:

    python harness.py --jobs jobs.jsonl --out events.jsonl --instrument timer --device cuda

jobs.jsonl: one JSON object a line: `record_id`, `artifact` (path relative to --root),
`args` ([[dtype, shape], ...]) and optionally `reference` (.npz relative to --root: the
seed of the inputs and sampled outputs of the unscheduled workload).
events.jsonl: a `start` line before each kernel and a `done` line after it (with `error`
when the kernel failed, crashed the process or ran past --timeout-s), flushed at once.
Every `done` line says where it ran (`hardware`, `cpu_model`, `cpu_count`, `gpu_name`,
`gpu_driver`: read from /proc/cpuinfo, the TVM device and `nvidia-smi`). Jobs that already
have a `done` line are skipped, so an interrupted run resumes.

Instruments:
  timer  MetaSchedule's runner: `time_evaluator` with --number calls per repeat, --repeat
         repeats, each at least --min-repeat-ms; results in seconds per call. On a CPU the
         cache is flushed before every repeat (--cache-flush 1, the default; MetaSchedule's
         `enable_cpu_cache_flush`). With a reference, the outputs are compared first
         (--rtol/--atol).
  nvtx   --warmup calls, then one call inside an NVTX push/pop range named by the record
         id in domain --domain, so `ncu --nvtx --nvtx-include` profiles exactly that call.
  perf   calibrate N calls to last --min-time-s (at most --max-calls), then run them with
         `perf stat` (--perf, --perf-events) attached to this process and switched on and
         off around them through its control FIFO; getrusage deltas and wall time per call.

--rounds N (timer) times every job once per round, N interleaved rounds each in a new
order (events of round r in `<out stem>.round-<r>.jsonl`), and writes one done line per job
to --out: its best round (lowest mean), with `rounds` and `round_means_s`.

By default the jobs run in a child process (this file with --in-process) whose output
goes to `<out>.log`: a kernel that crashes the child or runs past --timeout-s becomes a
`done` line with its error and a new child goes on with the rest. --in-process runs them
in this process, as under ncu, which then watches the process itself. A child dies with
the process that started it (Linux PR_SET_PDEATHSIG, else a thread that watches its
parent), so a supervisor killed even with SIGKILL leaves no kernel running behind it.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import math
import os
import platform
import random
import resource
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HARNESS = Path(__file__).resolve()
# Exit code when the harness cannot run at all (no device, missing package): every job
# fails the same way.
EXIT_UNUSABLE = 3
# Exit code after a kernel failed on a GPU: its CUDA context may be unusable, so the
# supervisor starts a fresh process for the kernels that remain.
EXIT_CONTEXT_LOST = 4
# Seconds a fresh child may take to import TVM before its first kernel starts.
STARTUP_S = 180.0
# Seconds between two looks at a running child.
POLL_S = 0.05


# ----------------------------------------------------------------------------- process lifetime

# prctl option: the signal this process gets when the thread that started it exits.
PR_SET_PDEATHSIG = 1
# Exit code of a child whose parent was already gone when it started.
EXIT_ORPHANED = 5

# `harness.py EXEC_WITH_PARENT <pid> <command...>`: arm die_with_parent, then exec the command.
EXEC_WITH_PARENT = "--exec-with-parent"


def die_with_parent(parent: int | None = None) -> None:
    """Have this process killed when its parent dies: PR_SET_PDEATHSIG on Linux, else a
    daemon thread that watches the parent id. `parent`: the pid this process must still be
    a child of (a parent that died before this call is caught too)."""
    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        armed = False
    first = os.getppid()
    if parent is not None and first != parent:
        os._exit(EXIT_ORPHANED)
    if not armed:
        def watch():
            while os.getppid() == first:
                time.sleep(0.5)
            os._exit(EXIT_ORPHANED)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def orphan_safe(cmd: list[str]) -> list[str]:
    """`cmd`, started so that it dies with this process: this file arms PR_SET_PDEATHSIG
    and execs it (the setting survives exec, so ncu or any program is covered)."""
    return [sys.executable, str(HARNESS), EXEC_WITH_PARENT, str(os.getpid()), *cmd]


# ----------------------------------------------------------------------------- where it runs

# The columns that say where a kernel ran, in every `done` event and every measurement and
# profiler row. `hardware` is what the label tables compare: the GPU's name on a GPU, the
# CPU model and its logical CPU count on a CPU.
HOST_FIELDS = ("hardware", "cpu_model", "cpu_count", "gpu_name", "gpu_driver")


def cpu_model() -> str:
    """The CPU's model string (/proc/cpuinfo's `model name`, `Model` or `Hardware`), else
    what `platform` knows."""
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except OSError:
        fields = {}
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def nvidia_smi_gpus() -> list[dict]:
    """index, uuid, name, driver_version of every GPU `nvidia-smi` lists (none without it)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=index,uuid,name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.count(",") >= 3]
    return [dict(index=r[0], uuid=r[1], name=",".join(r[2:-1]), driver_version=r[-1]) for r in rows] \
        if out.returncode == 0 else []


def visible_gpu(gpus: list[dict]) -> dict | None:
    """The GPU that CUDA calls device 0: the first of CUDA_VISIBLE_DEVICES (index or UUID)."""
    if not gpus:
        return None
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    for g in gpus:
        if first and (g["index"] == first or g["uuid"].startswith(first)):
            return g
    return gpus[0]


@functools.lru_cache(maxsize=None)
def host_identity(device: str = "cpu", gpu_name: str | None = None, gpu_driver: str | None = None) -> dict:
    """Where kernels of `device` run on this host (HOST_FIELDS). On a GPU, the name CUDA
    gives device 0 (`gpu_name`, from the TVM device) wins over `nvidia-smi`'s; the driver is
    `nvidia-smi`'s (the same for every GPU of a host), else the TVM device's."""
    out = dict(cpu_model=cpu_model(), cpu_count=os.cpu_count(), gpu_name=None, gpu_driver=None)
    if device == "cuda":
        smi = visible_gpu(nvidia_smi_gpus()) or {}
        out.update(gpu_name=gpu_name or smi.get("name"), gpu_driver=smi.get("driver_version") or gpu_driver)
        out["hardware"] = out["gpu_name"] or "unknown GPU"
    else:
        out["hardware"] = f"{out['cpu_model']}, {out['cpu_count']} CPUs"
    return {k: out[k] for k in HOST_FIELDS}


def device_identity(device: str, dev) -> dict:
    """host_identity with what the TVM device `dev` says of itself."""
    if device != "cuda":
        return host_identity(device)
    name = driver = None
    try:
        name, driver = dev.device_name, dev.driver_version
    except Exception:  # noqa: BLE001 - a runtime without these attributes: nvidia-smi tells
        pass
    return host_identity(device, str(name) if name else None, str(driver) if driver else None)


def load_average() -> float | None:
    """The host's 1-minute load average (None where the OS has none): above the CPU count,
    other processes shared the cores while a kernel was timed, and its run time is noisy."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def timed_busy(row: dict) -> bool:
    """Whether a measurement row was timed while the load average exceeded its CPU count."""
    load, cpus = row.get("load_avg"), row.get("cpu_count")
    return load is not None and bool(cpus) and not math.isnan(load) and load > cpus


# ----------------------------------------------------------------------------- inputs


def random_array(dtype: str, shape: list, rng: np.random.Generator) -> np.ndarray:
    """One input array; the generator draws exactly what the references were made with."""
    if dtype.startswith("float") or dtype.startswith("bfloat"):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 8, size=shape).astype(dtype)


def seeded_inputs(args: list, seed: int = 0) -> list[np.ndarray]:
    """Every argument of a kernel ([[dtype, shape], ...]) drawn from one generator seeded with `seed`."""
    rng = np.random.default_rng(seed)
    return [random_array(d, s, rng) for d, s in args]


def check_outputs(got: list[np.ndarray], ref, rtol: float, atol: float) -> dict:
    """Compare every argument after the call with the reference at its sampled positions."""
    errs, correct = [], True
    for i, arr in enumerate(got):
        vals = arr.ravel()[ref[f"idx{i}"]]
        want = ref[f"out{i}"]
        if vals.dtype.kind in "fc":
            ok = bool(np.allclose(vals, want, rtol=rtol, atol=atol, equal_nan=True))
            diff = np.abs(vals.astype("float64") - want.astype("float64"))
        else:
            ok = bool(np.array_equal(vals, want))
            diff = np.abs(vals.astype("int64") - want.astype("int64"))
        errs.append(float(np.nanmax(diff)) if diff.size else 0.0)
        correct = correct and ok
    return {"checked": True, "correct": correct, "max_abs_err": max(errs) if errs else 0.0}


def choose_cuda_compiler() -> None:
    """Exported CUDA kernels hold CUDA source that TVM compiles when the module is loaded;
    its default compiler (NVRTC) needs the `cuda-bindings` package. Without it, use nvcc
    where it is installed."""
    try:
        import tvm.support.nvcc  # noqa: F401 - registers the compile callback
    except ImportError:
        pass
    if os.environ.get("TVM_CUDA_COMPILE_MODE"):
        return
    try:
        import cuda.bindings  # noqa: F401 - optional: only its presence is asked
    except ImportError:
        if shutil.which("nvcc"):
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


# ----------------------------------------------------------------------------- events


def read_events(path: Path, bad: list | None = None) -> list[dict]:
    """Every event of an events file. A line that is not a JSON object (cut by a crash, or
    damaged bytes) is skipped; with `bad`, its `(line number, reason)` is appended there."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not a JSON object")
            out.append(event)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if bad is not None:
                bad.append((i, f"{type(e).__name__}: {e}"[:200]))
    return out


def done_events(path: Path, bad: list | None = None) -> dict[str, dict]:
    """record_id -> its (last) `done` event."""
    return {ev["record_id"]: ev for ev in read_events(path, bad) if ev.get("event") == "done" and "record_id" in ev}


class EventTail:
    """The events appended to a file since the last look (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.size = Path(path), 0, 0

    def skip_existing(self) -> "EventTail":
        self.offset = self.size = self.path.stat().st_size if self.path.exists() else 0
        return self

    def new(self) -> list[dict]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.size = self.offset + len(data)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # damaged bytes: read_events names the line
                continue
            if isinstance(event, dict):
                out.append(event)
        return out


def append_event(path: Path, event: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def short_error(prefix: str, e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{prefix}: {type(e).__name__}: {msg[-1] if msg else ''}"[:2000]


# ----------------------------------------------------------------------------- kernels


@dataclass
class Kernel:
    """A loaded kernel with its inputs on the device."""

    record_id: str
    module: object  # tvm.runtime.Module
    func: object  # its `main`
    args: list  # tvm.runtime.Tensor per parameter
    device: object  # tvm.runtime.Device
    reference: object = None  # the reference .npz (NpzFile) or None


def load_kernel(tvm, dev, job: dict, root: str) -> Kernel:
    """Load `job`'s library and make its inputs (seeded by its reference, else seed 0)."""
    module = tvm.runtime.load_module(os.path.join(root, job["artifact"]))
    ref = np.load(os.path.join(root, job["reference"])) if job.get("reference") else None
    host = seeded_inputs(job["args"], int(ref["seed"]) if ref is not None else 0)
    return Kernel(job["record_id"], module, module["main"], [tvm.runtime.tensor(a, dev) for a in host], dev, ref)


# ----------------------------------------------------------------------------- instruments


class Timer:
    """MetaSchedule's time_evaluator semantics; the outputs are checked against a reference first."""

    # time_evaluator's pre-processing function that evicts every argument but the first from
    # the CPU caches before each repeat (MetaSchedule's `enable_cpu_cache_flush`).
    CACHE_FLUSH = "cache_flush_cpu_non_first_arg"
    # DLPack's device type of a CPU.
    DL_CPU = 1

    def __init__(self, number: int = 1, repeat: int = 3, min_repeat_ms: int = 20, rtol: float = 1e-3,
                 atol: float = 1e-3, cache_flush: int = 1):
        self.number, self.repeat, self.min_repeat_ms = int(number), int(repeat), int(min_repeat_ms)
        self.rtol, self.atol, self.cache_flush = float(rtol), float(atol), bool(int(cache_flush))

    def run(self, k: Kernel) -> dict:
        out = {}
        if k.reference is not None:
            k.func(*k.args)
            k.device.sync()
            out.update(check_outputs([a.numpy() for a in k.args], k.reference, self.rtol, self.atol))
        flush = self.cache_flush and k.device.dlpack_device_type() == self.DL_CPU
        timer = k.module.time_evaluator("main", k.device, number=self.number, repeat=self.repeat,
                                        min_repeat_ms=self.min_repeat_ms, f_preproc=self.CACHE_FLUSH if flush else "")
        results = [float(x) for x in timer(*k.args).results]
        out.update(run_secs=results, mean_s=statistics.fmean(results), median_s=statistics.median(results),
                   std_s=statistics.pstdev(results) if len(results) > 1 else 0.0, min_s=min(results),
                   repeats=len(results), number=self.number, cache_flush=flush, load_avg=load_average())
        return out


class Nvtx:
    """Warm-up calls (they also JIT-compile the kernel), then one call in an NVTX range named
    by the record id: what `ncu --nvtx --nvtx-include "regex:<domain>@.+/"` profiles."""

    def __init__(self, domain: str, warmup: int = 1):
        try:  # only this instrument needs the package (absent on a plain measure host)
            import nvtx
        except ModuleNotFoundError as e:  # this file runs alone on device hosts: no pipeline imports
            raise ModuleNotFoundError("the NVTX instrument (profiling under Nsight Compute) needs the package "
                                      "'nvtx': pip install 'tensor-cost-pipeline[cuda]' (a device bundle ships "
                                      "it)", name="nvtx") from e

        self.nvtx, self.domain, self.warmup = nvtx, domain, int(warmup)

    def run(self, k: Kernel) -> dict:
        for _ in range(self.warmup):
            k.func(*k.args)
        k.device.sync()
        self.nvtx.push_range(k.record_id, domain=self.domain)
        try:
            k.func(*k.args)
            k.device.sync()
        finally:
            self.nvtx.pop_range(domain=self.domain)
        return {}


# getrusage fields reported per call by the perf instrument.
RUSAGE_DELTAS = ("ru_utime", "ru_stime", "ru_minflt", "ru_majflt", "ru_nvcsw", "ru_nivcsw")


class Perf:
    """N calls that last `min_time_s`, counted by `perf stat` attached to this process with
    counting switched on and off around exactly those calls (perf's control FIFO), so the
    counts cover the calls and not loading or input generation. The done event carries
    perf's CSV output (`perf_csv`, null without perf) for the caller to parse."""

    def __init__(self, min_time_s: float = 0.2, max_calls: int = 100000, perf: str = "", perf_events: str = ""):
        self.min_time_s, self.max_calls = float(min_time_s), int(max_calls)
        self.perf = perf or None
        self.events = [e for e in str(perf_events).split(",") if e]

    def calibrate(self, k: Kernel) -> int:
        k.func(*k.args)  # warm-up (also starts the thread pool that perf then attaches to)
        n, t0 = 0, time.perf_counter()
        while True:
            k.func(*k.args)
            n += 1
            one = (time.perf_counter() - t0) / n
            if time.perf_counter() - t0 >= min(0.01, self.min_time_s) or n >= self.max_calls:
                break
        return int(min(self.max_calls, max(1, math.ceil(self.min_time_s / max(one, 1e-9)))))

    def run(self, k: Kernel) -> dict:
        calls = self.calibrate(k)
        with tempfile.TemporaryDirectory(prefix="perf-") as tmp:
            counter = PerfCounter(self.perf, self.events, tmp) if self.perf and self.events else None
            try:
                if counter:
                    counter.enable()
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                for _ in range(calls):
                    k.func(*k.args)
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                if counter:
                    counter.disable()
            finally:
                csv, err = counter.stop() if counter else (None, None)
        return {"calls": calls, "wall_s": (t1 - t0) / calls,
                "rusage": {f: (getattr(r1, f) - getattr(r0, f)) / calls for f in RUSAGE_DELTAS},
                "max_rss_bytes": int(r1.ru_maxrss) * 1024, "perf_csv": csv, "perf_stderr": err}


class PerfCounter:
    """`perf stat -p <this process>` started with counting off (-D -1), driven through its control FIFO."""

    def __init__(self, perf: str, events: list[str], workdir: str, timeout_s: float = 30.0):
        self.ctl_path, self.ack_path, self.out = (os.path.join(workdir, n)
                                                  for n in ("ctl.fifo", "ack.fifo", "perf.csv"))
        for p in (self.ctl_path, self.ack_path):
            os.mkfifo(p)
        self.proc = subprocess.Popen(
            [perf, "stat", "-x", ",", "-e", ",".join(events), "-p", str(os.getpid()), "-D", "-1",
             "--control", f"fifo:{self.ctl_path},{self.ack_path}", "-o", self.out],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.timeout_s = timeout_s
        self.ctl = self.ack = None

    def _open(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.ctl = os.open(self.ctl_path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:  # ENXIO: perf has not opened its end yet
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise TimeoutError("perf did not open its control FIFO") from None
                time.sleep(0.005)
        os.set_blocking(self.ctl, True)
        self.ack = os.open(self.ack_path, os.O_RDONLY | os.O_NONBLOCK)

    def _command(self, cmd: bytes) -> None:
        os.write(self.ctl, cmd)
        deadline = time.monotonic() + self.timeout_s
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.ack, selectors.EVENT_READ)
            while b"ack" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError(f"perf did not acknowledge {cmd.strip().decode()}")
                chunk = os.read(self.ack, 64)
                if chunk:
                    buf += chunk
                else:
                    time.sleep(0.001)

    def enable(self) -> None:
        self._open()
        self._command(b"enable\n")

    def disable(self) -> None:
        self._command(b"disable\n")

    def stop(self) -> tuple[str | None, str]:
        """(perf's CSV output or None, the tail of its stderr)."""
        for fd in (self.ctl, self.ack):
            if fd is not None:
                os.close(fd)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        text = Path(self.out).read_text() if os.path.exists(self.out) else None
        return text or None, " ".join(err.strip().splitlines()[-2:])[:300]


INSTRUMENTS = {"timer": Timer, "nvtx": Nvtx, "perf": Perf}
# Command-line options of each instrument (name, type, default).
INSTRUMENT_OPTIONS = {
    "timer": (("number", int, 1), ("repeat", int, 3), ("min_repeat_ms", int, 20), ("rtol", float, 1e-3),
              ("atol", float, 1e-3), ("cache_flush", int, 1)),
    "nvtx": (("domain", str, "tcp_collect"), ("warmup", int, 1)),
    "perf": (("min_time_s", float, 0.2), ("max_calls", int, 100000), ("perf", str, ""), ("perf_events", str, "")),
}


# ----------------------------------------------------------------------------- in-process run


def run_in_process(jobs: list[dict], out: Path, root: str, device: str, instrument: str, options: dict) -> int:
    """Run `jobs` here under one instrument, a start and a done event each; returns the exit code."""
    die_with_parent()  # started by a supervisor, or by ncu: never outlive it
    if device == "cuda":
        choose_cuda_compiler()
    import tvm  # the runtime is needed only here: a supervising parent never loads it

    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    if not dev.exist:
        print(f"harness: no {device} device on this host", file=sys.stderr)
        return EXIT_UNUSABLE
    try:
        inst = INSTRUMENTS[instrument](**options)
    except ImportError as e:
        print(f"harness: the {instrument} instrument needs a missing package ({e}); install it", file=sys.stderr)
        return EXIT_UNUSABLE
    host = device_identity(device, dev)
    done = set(done_events(out))
    with open(out, "a") as f:
        def emit(**event):
            f.write(json.dumps(event) + "\n")
            f.flush()

        for job in jobs:
            rid = job["record_id"]
            if rid in done:
                continue
            emit(event="start", record_id=rid, time=time.time())
            try:
                res = inst.run(load_kernel(tvm, dev, job, root))
            except Exception as e:  # noqa: BLE001 - a failing kernel is a result, not a stop
                emit(event="done", record_id=rid, error=short_error("run", e), **host)
                if device == "cuda":
                    return EXIT_CONTEXT_LOST
                continue
            emit(event="done", record_id=rid, **host, **res)
    return 0


# ----------------------------------------------------------------------------- supervisor


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


@dataclass
class ChildExit:
    rc: int | None  # None when it was killed for a timeout
    timed_out: bool = False
    verdict: str | None = None  # why the kernel in flight failed; None for a clean exit


def run_child(cmd: list[str], log: Path, *, env: dict | None = None, timeout_s: float | None = None,
              events: Path | None = None, kernel_timeout_s: float | None = None, startup_s: float = STARTUP_S,
              on_events=None) -> ChildExit:
    """Run `cmd` in its own process group with its output appended to `log` (a file, never
    an unread pipe: a chatty child cannot block), and kill the group when it runs past
    `timeout_s`, or, with an `events` file, when one kernel runs past `kernel_timeout_s`
    or nothing starts within `startup_s`. `on_events(list)` gets new events as they come.
    The child dies with this process (`orphan_safe`), even when this one is SIGKILLed."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    tail = EventTail(events).skip_existing() if events is not None else None
    t0 = last = time.monotonic()
    started_any = False
    with open(log, "ab") as sink:
        proc = subprocess.Popen(orphan_safe(cmd), stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            while True:
                rc = proc.poll()
                if tail is not None:
                    new = tail.new()
                    if new:
                        last = time.monotonic()
                        started_any = started_any or any(e.get("event") == "start" for e in new)
                        if on_events:
                            on_events(new)
                if rc is not None:
                    break
                now = time.monotonic()
                verdict = None
                if timeout_s is not None and now - t0 > timeout_s:
                    verdict = f"timeout: killed after {timeout_s:g} s"
                elif kernel_timeout_s is not None and started_any and now - last > kernel_timeout_s:
                    verdict = f"timeout: no result within {kernel_timeout_s:g} s"
                elif kernel_timeout_s is not None and not started_any and now - last > startup_s:
                    verdict = f"timeout: the runner did not start within {startup_s:g} s"
                if verdict:
                    kill_group(proc)
                    return ChildExit(None, True, verdict)
                time.sleep(POLL_S)
        except BaseException:  # Ctrl-C or a failing callback: the child is in its own session, stop it too
            kill_group(proc)
            raise
    if rc in (0, EXIT_CONTEXT_LOST):
        return ChildExit(rc)
    return ChildExit(rc, False, f"crashed: runner exited with {describe_exit(rc)}")


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def log_tail(log: Path, lines: int = 1) -> str:
    try:
        text = Path(log).read_text(errors="replace").strip()
    except OSError:
        return ""
    return " | ".join(text.splitlines()[-lines:])[:800]


def supervise(jobs: list[dict], out: Path, *, root: Path | str, device: str = "cpu", instrument: str = "timer",
              options: dict | None = None, timeout_s: float = 30.0, startup_s: float = STARTUP_S,
              python: str = sys.executable, env: dict | None = None, on_done=None,
              wrap: list[str] | None = None) -> list[dict]:
    """Run `jobs` in child processes (resuming `out`), one `done` event per job, in job order.

    A kernel that crashes its child or runs past `timeout_s` becomes a done event with the
    error and a new child goes on with the rest; a child that cannot run at all (no device,
    a broken install) fails every remaining job with its reason. `on_done(event)` gets each
    done event as it is written. `wrap`: a command each child runs under (e.g. ncu), with
    `{n}` replaced by a name unique to that child (one report file per child)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jobs_file = out.with_name(out.name + ".jobs")
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    log = out.with_suffix(".log")
    cmd = [python, str(HARNESS), "--in-process", "--jobs", str(jobs_file), "--out", str(out), "--root", str(root),
           "--device", device, "--instrument", instrument]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in (options or {}).items()]
    wanted = {j["record_id"] for j in jobs}
    results = {rid: ev for rid, ev in done_events(out).items() if rid in wanted}
    started: list[str] = []
    # Where the kernels run: as the children report it, else this host's own view (the
    # supervisor shares the host; it only lacks the TVM device's own name for its GPU).
    host: dict = {}

    def where() -> dict:
        return host or host_identity(device)

    def seen(events):
        for ev in events:
            rid = ev.get("record_id")
            if ev.get("event") == "start":
                started.append(rid)
            elif ev.get("event") == "done" and rid in wanted and rid not in results:
                if not host and ev.get("hardware"):
                    host.update({k: ev.get(k) for k in HOST_FIELDS})
                results[rid] = ev
                if on_done:
                    on_done(ev)

    while not wanted <= set(results):
        started.clear()
        before = len(results)
        prefix = [a.replace("{n}", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{len(results)}")
                  for a in wrap or ()]
        child = run_child(prefix + cmd, log, env=env, events=out, kernel_timeout_s=timeout_s, startup_s=startup_s,
                          on_events=seen)
        in_flight = [rid for rid in started if rid not in results]
        if child.rc == EXIT_UNUSABLE or (child.verdict and not started) or (
                not child.verdict and len(results) == before):
            # The runner could not start at all, or made no progress: every job fails the same way.
            msg = child.verdict or "runner failed"
            tail = log_tail(log)
            seen([{"event": "done", "record_id": rid, "error": f"{msg}{': ' + tail if tail else ''}", **where()}
                  for rid in (j["record_id"] for j in jobs) if rid not in results])
            break
        failed = [{"event": "done", "record_id": rid, "error": child.verdict, **where()}
                  for rid in in_flight if child.verdict]
        for ev in failed:
            append_event(out, ev)
        seen(failed)
    return [results[j["record_id"]] for j in jobs if j["record_id"] in results]


def round_events(out: Path | str, r: int) -> Path:
    """The events file of round `r` of `supervise_rounds` (beside `out`)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.round-{r}{out.suffix}")


def best_round(events: list[dict]) -> dict:
    """One `done` event from a kernel's rounds: the round with the lowest mean (its run
    times, load average and host), with `rounds` and every round's mean (`round_means_s`);
    the outputs are correct only if every checked round agreed. A round that failed fails
    the kernel (its error names the round)."""
    for r, ev in enumerate(events):
        if ev.get("error"):
            return dict(ev, error=f"round {r}: {ev['error']}" if r else ev["error"], rounds=len(events))
    best = min(events, key=lambda ev: ev["mean_s"])
    out = dict(best, rounds=len(events), round_means_s=[float(ev["mean_s"]) for ev in events])
    checked = [ev for ev in events if ev.get("checked")]
    if checked:
        out.update(checked=True, correct=all(ev.get("correct") is not False for ev in checked),
                   max_abs_err=max(float(ev.get("max_abs_err") or 0.0) for ev in checked))
    return out


def supervise_rounds(jobs: list[dict], out: Path, *, rounds: int = 1, **kw) -> list[dict]:
    """`supervise` (timer instrument) in `rounds` interleaved rounds: every job once per
    round, each round in a new order, its events in `round_events(out, r)`; then one done
    event per job from its best round (`best_round`), written to `out`. Back-to-back
    repeats share whatever else the host ran at that moment; rounds a batch apart do not,
    so the lowest round mean is a label that a burst of load on a shared host does not
    move. An interrupted run resumes each round where it stopped."""
    out = Path(out)
    if rounds <= 1:
        return supervise(jobs, out, **kw)
    if kw.get("instrument", "timer") != "timer":
        raise ValueError(f"rounds={rounds}: only the timer instrument runs in rounds")
    done = {rid: ev for rid, ev in done_events(out).items() if ev.get("rounds") == rounds}
    todo = [j for j in jobs if j["record_id"] not in done]
    per: dict[str, list[dict]] = {}
    for r in range(rounds):
        order = list(todo)
        if r:
            random.Random(r).shuffle(order)
        for ev in supervise(order, round_events(out, r), **kw):
            per.setdefault(ev["record_id"], []).append(ev)
        todo = [j for j in todo if j["record_id"] in per and not per[j["record_id"]][-1].get("error")]
    for j in jobs:
        rid = j["record_id"]
        if rid in per and rid not in done:
            done[rid] = best_round(per[rid])
            append_event(out, done[rid])
    return [done[j["record_id"]] for j in jobs if j["record_id"] in done]


def batch_jobs(jobs: list[dict], batch_size: int, events: str, **run) -> list[dict]:
    """Executor jobs for `supervise_job`: `batch_size` kernels each, with the files they read
    (`reads`: libraries and references); `run`: device, instrument, options, timeout_s."""
    out = []
    for start in range(0, len(jobs), max(1, batch_size)):
        batch = jobs[start:start + max(1, batch_size)]
        reads = sorted({j["artifact"] for j in batch} | {j["reference"] for j in batch if j.get("reference")})
        out.append(dict(jobs=batch, events=events, reads=reads, **run))
    return out


def supervise_job(job: dict, root: str) -> list[dict]:
    """One executor job (pipeline/compute/executor.py): a batch of kernels supervised under
    one instrument, its events in `<root>/<job["events"]>` (resumed: the done events of an
    interrupted run are kept), the done events returned. job: jobs, events, device,
    instrument, options, timeout_s, and optionally rounds (`supervise_rounds`)."""
    out = Path(root) / job["events"]
    return supervise_rounds(job["jobs"], out, rounds=int(job.get("rounds", 1)), root=root, device=job["device"],
                            instrument=job["instrument"], options=job["options"], timeout_s=job["timeout_s"])


def failed_job(job: dict, reason: str) -> list[dict]:
    """The done events of a batch that could not run at all (its machine was lost, ...)."""
    return [{"event": "done", "record_id": k["record_id"], "error": f"run: {reason}"} for k in job["jobs"]]


# ----------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [EXEC_WITH_PARENT]:  # see orphan_safe
        die_with_parent(int(argv[1]))
        os.execvp(argv[2], argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", required=True, help="jobs.jsonl")
    p.add_argument("--out", required=True, help="events.jsonl (appended; resumed)")
    p.add_argument("--root", default=".", help="folder that artifact and reference paths are relative to")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--instrument", default="timer", choices=list(INSTRUMENTS))
    p.add_argument("--timeout-s", type=float, default=30.0, help="seconds one kernel may take")
    p.add_argument("--startup-s", type=float, default=STARTUP_S, help="seconds a child may take to start")
    p.add_argument("--in-process", action="store_true", help="run the jobs in this process (no isolation)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every job this many times, interleaved, and keep each one's best round")
    p.add_argument("--wrap", type=json.loads, default=None,
                   help='JSON list: a command each child runs under, e.g. ["ncu", "--export", "rep-{n}.ncu-rep"]')
    for inst, opts in INSTRUMENT_OPTIONS.items():
        for name, kind, default in opts:
            p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                           help=f"{inst} (default {default})")
    args = p.parse_args(argv)
    options = {name: getattr(args, name) for name, _, _ in INSTRUMENT_OPTIONS[args.instrument]}
    with open(args.jobs) as f:
        jobs = [json.loads(line) for line in f if line.strip()]
    if args.in_process:
        return run_in_process(jobs, Path(args.out), args.root, args.device, args.instrument, options)
    res = supervise_rounds(jobs, Path(args.out), rounds=args.rounds, root=args.root, device=args.device,
                           instrument=args.instrument, options=options, timeout_s=args.timeout_s,
                           startup_s=args.startup_s, wrap=args.wrap)
    failed = sum(1 for r in res if r.get("error"))
    print(f"harness: {len(res) - failed} ran, {failed} failed; events in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
