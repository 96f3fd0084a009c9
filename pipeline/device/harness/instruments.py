"""What runs a kernel: its seeded inputs and the check against the reference, the three
instruments (timer, nvtx, perf) and the in-process loop that writes an event per kernel."""

from __future__ import annotations

import json
import math
import os
import resource
import selectors
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .events import done_events
from .host import device_identity, load_average
from .lifetime import EXIT_CONTEXT_LOST, EXIT_UNUSABLE, die_with_parent


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


# The CUDA architecture exported kernels were built for (a bundle's part.json `cuda_arch`,
# e.g. sm_90a); without it, the device's own (sm_<major><minor>).
CUDA_ARCH_ENV = "TCP_CUDA_ARCH"


def cuda_arch(dev) -> str:
    return os.environ.get(CUDA_ARCH_ENV) or "sm_" + str(dev.compute_version).replace(".", "")


def nvcc_cubin(code: str, arch: str, nvcc: str = "nvcc") -> bytes:
    """`code` compiled to a cubin by the CUDA toolkit's nvcc (no TVM compiler involved)."""
    with tempfile.TemporaryDirectory(prefix="tcp-nvcc-") as d:
        src, out = os.path.join(d, "kernels.cu"), os.path.join(d, "kernels.cubin")
        with open(src, "w") as f:
            f.write(code)
        run = subprocess.run([nvcc, "--cubin", "-O3", f"-arch={arch}", "-o", out, src], capture_output=True,
                             text=True)
        if run.returncode != 0:
            raise RuntimeError(f"nvcc failed for {arch}: {(run.stderr or run.stdout).strip()[-1500:]}")
        with open(out, "rb") as f:
            return f.read()


def use_cuda_compiler(dev) -> str:
    """Exported CUDA kernels hold CUDA source that TVM compiles when the module is loaded,
    through the callback `tvm_callback_cuda_compile`. TVM's own callback asks the compiler
    library for the current target and pass context, which a runtime-only TVM lacks; this
    one is given the architecture. NVRTC (the `cuda-bindings` package) where it is
    installed, else nvcc (`TVM_CUDA_COMPILE_MODE=nvcc|nvrtc` chooses). Returns
    "<compiler> <arch>"."""
    import tvm_ffi

    arch = cuda_arch(dev)
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "").lower()
    if not mode:
        try:
            import cuda.bindings.nvrtc  # noqa: F401 - optional: only its presence is asked
            mode = "nvrtc"
        except ImportError:
            mode = "nvcc"
    if mode == "nvrtc":
        from tvm.support import nvcc as tvm_nvcc

        def compile_cuda(code):
            return tvm_nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc")
    elif mode == "nvcc":
        exe = shutil.which("nvcc") or "nvcc"

        def compile_cuda(code):
            return nvcc_cubin(code, arch, exe)
    else:
        raise ValueError(f"TVM_CUDA_COMPILE_MODE={mode!r}; valid: nvrtc, nvcc")
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)
    return f"{mode} {arch}"


def cuda_device(tvm):
    """CUDA device 0. The runtime-only TVM of a bundle (TVM_USE_RUNTIME_LIB=1) loads
    libtvm_runtime.so alone; its CUDA runtime library beside it is loaded here, once."""
    dev = tvm.cuda(0)
    lib = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    if not dev.exist and lib.exists():
        import ctypes

        try:
            ctypes.CDLL(str(lib), ctypes.RTLD_GLOBAL)
        except OSError:  # no CUDA driver (libcuda) on this host: no device
            return dev
        dev = tvm.cuda(0)
    return dev


def short_error(prefix: str, e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{prefix}: {type(e).__name__}: {msg[-1] if msg else ''}"[:2000]


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


def run_in_process(jobs: list[dict], out: Path, root: str, device: str, instrument: str, options: dict) -> int:
    """Run `jobs` here under one instrument, a start and a done event each; returns the exit code."""
    die_with_parent()  # started by a supervisor, or by ncu: never outlive it
    import tvm  # the runtime is needed only here: a supervising parent never loads it

    dev = cuda_device(tvm) if device == "cuda" else tvm.cpu(0)
    if not dev.exist:
        print(f"harness: no {device} device on this host", file=sys.stderr)
        return EXIT_UNUSABLE
    if device == "cuda":
        try:
            print(f"harness: CUDA source compiled at load by {use_cuda_compiler(dev)}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - no compiler: every kernel fails the same way
            print(f"harness: no CUDA compiler for the exported kernels ({type(e).__name__}: {e}); install "
                  "cuda-bindings (NVRTC) or put the CUDA toolkit's nvcc on PATH", file=sys.stderr)
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
