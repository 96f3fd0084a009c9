"""Where kernels run: the host's CPU and GPU as every `done` event and every measurement row
names them, and the load average that says whether a kernel was timed on a busy host."""

from __future__ import annotations

import functools
import math
import os
import platform
import shutil
import subprocess
import time


# The columns that say where a kernel ran, in every `done` event and every measurement and
# profiler row. `hardware` is what the label tables compare: the GPU's name on a GPU, the
# CPU model and its logical CPU count on a CPU; `cpu_signature` tells apart two CPUs that
# share a model name (a cloud VM's "Intel(R) Xeon(R) Processor" is several).
HOST_FIELDS = ("hardware", "cpu_model", "cpu_count", "cpu_signature", "gpu_name", "gpu_driver")


def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields (of its last processor; empty where there is none)."""
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except OSError:
        return {}


def cpu_model() -> str:
    """The CPU's model string (/proc/cpuinfo's `model name`, `Model` or `Hardware`), else
    what `platform` knows."""
    fields = _cpuinfo()
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_signature() -> str | None:
    """The CPU's identity below its model name: an x86 CPU's vendor, family, model and
    stepping (CPUID), an Arm core's implementer, part, variant and revision; None where
    /proc/cpuinfo says neither."""
    f = _cpuinfo()
    if f.get("vendor_id") and f.get("cpu family") and f.get("model"):
        return f"{f['vendor_id']} family {f['cpu family']} model {f['model']} stepping {f.get('stepping', '?')}"
    if f.get("CPU implementer") and f.get("CPU part"):
        return (f"implementer {f['CPU implementer']} part {f['CPU part']} variant {f.get('CPU variant', '?')} "
                f"revision {f.get('CPU revision', '?')}")
    return None


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
    out = dict(cpu_model=cpu_model(), cpu_count=os.cpu_count(), cpu_signature=cpu_signature(), gpu_name=None,
               gpu_driver=None)
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


def settle(below: float, limit_s: float, poll_s: float = 5.0) -> tuple[float | None, float]:
    """Wait until the 1-minute load average is at most `below`, or `limit_s` seconds have
    passed: what ran just before (a build's compiler processes, another job) still weighs on
    the cores when timing begins, and the first kernels' times would carry it. Returns the
    last load read (None where the OS has none: nothing to wait for) and the seconds waited."""
    start = time.monotonic()
    while True:
        load, waited = load_average(), time.monotonic() - start
        if load is None or load <= below or waited >= limit_s:
            return load, waited
        time.sleep(max(0.0, min(poll_s, limit_s - waited)))


def timed_busy(row: dict) -> bool:
    """Whether a measurement row was timed while the load average exceeded its CPU count."""
    load, cpus = row.get("load_avg"), row.get("cpu_count")
    return load is not None and bool(cpus) and not math.isnan(load) and load > cpus
