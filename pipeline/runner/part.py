#!/usr/bin/env python3
"""Run one part of a device bundle on the GPU host: install, measure, profile (`run_part.py`).

This file is copied into every part as `run_part.py` and needs nothing but Python's
standard library to start (the host needs NumPy for the harness). One command per part:

    python3 run_part.py [--results DIR] [--pack FILE.tar.gz] [--resume FILE.tar.gz] [--time-limit-s S]

1. install: the part's wheels (`wheels/`, made for the host's Python and platform) go
   into `site/` with `pip install --no-index --find-links wheels --target site` (no
   registry is asked); skipped when `site/` already holds them.
2. measure and profile, chunk after chunk (`ncu_chunk` kernels, `measure_chunk` without
   ncu): the kernel harness (`python -m harness`, timer instrument) times the chunk's
   kernels into `<results>/measure.jsonl` (start/done events); then, when the part asks
   for ncu and `ncu` is on PATH, the harness again over the same kernels, NVTX instrument,
   under `ncu --nvtx --nvtx-include ...`: events in `<results>/ncu.jsonl`, one `.ncu-rep`
   per chunk. A run cut short by `--time-limit-s` thus leaves every finished kernel with
   both its time and its profile. The reports are read back on the build machine
   (`collect.mode=import`), so the host needs neither the report reader nor the project.
   Without ncu the part says so in one line and the measurements still come back.

Both steps resume: the harness skips kernels that already have a `done` event in the
results folder, so the same command after an interruption (or with `--resume` of the
packed results of an earlier run) goes on where it stopped. Progress goes to stdout;
`<results>/status.json` says what ran.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The harness's variable for the CUDA architecture of the kernels (harness/instruments.py).
CUDA_ARCH_ENV = "TCP_CUDA_ARCH"
# Kernels per chunk of a part without ncu (with ncu: its `chunk`).
DEFAULT_MEASURE_CHUNK = 64
# The first-line answers of the steps that cannot run, with the fix.
NCU_ABSENT = ("ncu: not found on PATH ({exe!r}): the Nsight Compute step is skipped, the measurements "
              "come back; install Nsight Compute or pass --ncu /path/to/ncu and run this command again")
NCU_PERMISSION = ("ncu: no permission to read the GPU performance counters (ERR_NVGPUCTRPERM): run as root "
                  "or set NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


def say(msg: str) -> None:
    print(f"[part] {msg}", flush=True)


def done_ids(events: Path) -> dict[str, str | None]:
    """record_id -> error (None when it ran) of the done events written so far."""
    out = {}
    if events.exists():
        for line in events.read_bytes().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("event") == "done" and "record_id" in ev:
                out[ev["record_id"]] = ev.get("error")
    return out


def install(spec: dict, site: Path) -> None:
    """The part's wheels into `site` (pip, no registry); nothing to do when already there."""
    wheels = sorted((HERE / "wheels").glob("*.whl"))
    marker = site / ".installed"
    if not wheels or (marker.exists() and marker.read_text() == "\n".join(w.name for w in wheels)):
        return
    want = spec.get("python")
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and want != have:
        raise SystemExit(f"[part] this part's wheels are for Python {want}, this is Python {have}: run it with "
                         f"python{want}, or export the bundle again with bundle.python={have}")
    say(f"install: {len(wheels)} wheels into {site}")
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--upgrade", "--target", str(site), *map(str, wheels)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"[part] install failed: {' '.join(cmd)}\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    marker.write_text("\n".join(w.name for w in wheels))


def environment(site: Path, spec: dict | None = None) -> dict:
    """The harness's environment: the runtime-only TVM and the installed wheels first on the
    path, the CUDA runtime of a shipped wheel (libcudart) visible to the loader, and the CUDA
    architecture the kernels were built for (their source is compiled for it when loaded)."""
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONUNBUFFERED="1")
    if spec and spec.get("cuda_arch"):
        env.setdefault(CUDA_ARCH_ENV, str(spec["cuda_arch"]))
    paths = [str(p) for p in (HERE / "runtime", site) if p.exists()]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    libs = sorted(glob.glob(str(site / "nvidia" / "*" / "lib"))) + sorted(glob.glob(str(site / "nvidia" / "cu*" /
                                                                                      "lib")))
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
                                                         if p])
    return env


def harness(spec: dict, jobs: Path, out: Path, instrument: str, options: dict, timeout_s: float, env: dict,
            wrap: list[str] | None = None) -> int:
    cmd = [sys.executable, "-m", "harness", "--jobs", str(jobs), "--out", str(out), "--root", str(HERE),
           "--device", spec["device"], "--instrument", instrument, "--timeout-s", str(timeout_s)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    if wrap:
        cmd += ["--wrap", json.dumps(wrap)]
    return subprocess.run(cmd, env=env, cwd=HERE).returncode


def progress(step: str, events: Path, total: int, t0: float) -> None:
    done = done_ids(events)
    failed = sum(1 for e in done.values() if e)
    say(f"{step}: {len(done)}/{total} kernels done ({failed} failed), {time.monotonic() - t0:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results", help="results folder (resumed)")
    ap.add_argument("--pack", type=Path, help="write the results folder as this .tar.gz at the end")
    ap.add_argument("--resume", type=Path, help="unpack an earlier run's packed results first")
    ap.add_argument("--ncu", default="ncu", help="the ncu executable")
    ap.add_argument("--time-limit-s", type=float, default=None,
                    help="start no further chunk after this many seconds (then pack; resume later)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    spec = json.loads((HERE / "part.json").read_text())
    res = a.results.resolve()
    res.mkdir(parents=True, exist_ok=True)
    if a.resume and a.resume.exists():
        with tarfile.open(a.resume) as tar:
            tar.extractall(res, filter="data")
        say(f"resumed from {a.resume}")
    jobs = [json.loads(line) for line in (HERE / "jobs.jsonl").read_text().splitlines() if line.strip()]
    status = {"part": spec["part"], "parts": spec["parts"], "kernels": len(jobs), "python": sys.version.split()[0]}
    say(f"part {spec['part'] + 1} of {spec['parts']}: {len(jobs)} kernels, device {spec['device']}")
    try:
        site = HERE / "site"
        install(spec, site)
        status.update(run_chunks(spec, jobs, res, environment(site, spec), a, t0))
    finally:
        status["seconds"] = round(time.monotonic() - t0, 1)
        (res / "status.json").write_text(json.dumps(status, indent=1) + "\n")
        if a.pack:
            a.pack.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(a.pack, "w:gz") as tar:
                for f in sorted(res.iterdir()):
                    tar.add(f, arcname=f.name)
            say(f"results packed into {a.pack}")
    say(f"results in {res}")
    return 0


def ncu_state(spec: dict, a) -> tuple[str | None, str | None]:
    """(the ncu executable, None) when the part profiles here, else (None, why not)."""
    if not spec.get("ncu"):
        return None, "not asked"
    exe = shutil.which(a.ncu)
    if not exe:
        say(NCU_ABSENT.format(exe=a.ncu))
        return None, "ncu absent"
    return exe, None


def run_chunks(spec: dict, jobs: list[dict], res: Path, env: dict, a, t0: float) -> dict:
    """Measure, then profile, one chunk of kernels after the other, until all are done or
    the time limit is passed; returns what ran (for status.json)."""
    meas, events = res / "measure.jsonl", res / "ncu.jsonl"
    m, n = spec["measure"], spec.get("ncu")
    exe, why_not = ncu_state(spec, a)
    ncu_status = why_not or "done"
    size = max(1, int(n["chunk"] if n else m.get("chunk", DEFAULT_MEASURE_CHUNK)))
    say(f"measure{' and ncu' if exe else ''}: chunks of {size} kernels")
    out = {"measure_rc": 0}
    for start in range(0, len(jobs), size):
        chunk = jobs[start:start + size]
        measured, profiled = done_ids(meas), done_ids(events)
        if all(j["record_id"] in measured and (not exe or j["record_id"] in profiled) for j in chunk):
            continue
        if a.time_limit_s is not None and time.monotonic() - t0 > a.time_limit_s:
            say(f"time limit of {a.time_limit_s:g} s reached; run the command again (--resume) for the rest")
            out["stopped"] = "time limit"
            break
        chunk_file = res / "chunk.jsonl"
        chunk_file.write_text("".join(json.dumps(j) + "\n" for j in chunk))
        rc = harness(spec, chunk_file, meas, "timer", m["options"], m["timeout_s"], env)
        out["measure_rc"] = out["measure_rc"] or rc
        progress("measure", meas, len(jobs), t0)
        if exe:
            ncu_status = profile_chunk(spec, chunk_file, res, env, exe)
            progress("ncu", events, len(jobs), t0)
            if ncu_status != "done":
                exe = None
        chunk_file.unlink()
    if n:
        out["ncu"] = "stopped at the time limit" if out.get("stopped") and ncu_status == "done" else ncu_status
    return out


def ncu_command(spec: dict, exe: str, report_stem: Path, section_set: str | None = None) -> list[str]:
    """The part's ncu command line writing `<report_stem>.ncu-rep` (`{n}` in the stem: one
    report per harness child); with `section_set` (e.g. full) instead of the part's sections."""
    args = spec["ncu"]["args"]
    if section_set:
        picks = {i for i, a in enumerate(args) if a in ("--section", "--section-folder", "--metrics")}
        args = [a for i, a in enumerate(args) if i not in picks and i - 1 not in picks] + ["--set", section_set]
    return [exe] + [a.replace("{report}", str(report_stem)).replace("{part}", str(HERE)) for a in args]


def profile_chunk(spec: dict, chunk: Path, res: Path, env: dict, exe: str) -> str:
    """One ncu run of the harness over the kernels of `chunk`; "done", or why ncu cannot go on."""
    n = spec["ncu"]
    log = res / "ncu.log"  # the harness logs its children to <out>.log
    wrap = ncu_command(spec, exe, res / "ncu-{n}")
    harness(spec, chunk, res / "ncu.jsonl", "nvtx", n["options"], n["timeout_s"], env, wrap)
    text = log.read_text(errors="replace") if log.exists() else ""
    if "ERR_NVGPUCTRPERM" in text:
        say(NCU_PERMISSION)
        return "no permission"
    return "done"


if __name__ == "__main__":
    sys.exit(main())
