#!/usr/bin/env python3
"""Run one part of a device bundle on the GPU host: install, measure, profile (`run_part.py`).

This file is copied into every part as `run_part.py` and needs nothing but Python's
standard library to start (the host needs NumPy for the harness). One command per part:

    python3 run_part.py [--results DIR] [--pack FILE.tar.gz] [--resume FILE.tar.gz] [--time-limit-s S]

1. install: the part's wheels (`wheels/`, made for the host's Python and platform) go
   into `site/` with `pip install --no-index --find-links wheels --target site` (no
   registry is asked); skipped when `site/` already holds them.
2. measure: the kernel harness (`python -m harness`, timer instrument) times every kernel of
   `jobs.jsonl` into `<results>/measure.jsonl` (start/done events).
3. ncu (when the part asks for it and `ncu` is on PATH): the harness again over the same
   kernels, NVTX instrument, under `ncu --nvtx --nvtx-include ...` in chunks of
   `ncu_chunk` kernels; events in `<results>/ncu.jsonl`, one `.ncu-rep` per ncu run. The
   reports are read back on the build machine (`collect.mode=import`), so the host needs
   neither the report reader nor the project. Without ncu the part says so in one line
   and the measurements still come back.

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


def environment(site: Path) -> dict:
    """The harness's environment: the runtime-only TVM and the installed wheels first on the
    path, the CUDA runtime of a shipped wheel (libcudart) visible to the loader."""
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PYTHONUNBUFFERED="1")
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
                    help="start no further ncu chunk after this many seconds (then pack; resume later)")
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
        env = environment(site)
        meas = res / "measure.jsonl"
        m = spec["measure"]
        say("measure: timer instrument")
        status["measure_rc"] = harness(spec, HERE / "jobs.jsonl", meas, "timer", m["options"], m["timeout_s"], env)
        progress("measure", meas, len(jobs), t0)
        if spec.get("ncu"):
            status["ncu"] = profile(spec, jobs, res, env, a, t0)
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


def profile(spec: dict, jobs: list[dict], res: Path, env: dict, a, t0: float) -> str:
    """The ncu step; returns what became of it (for status.json)."""
    n = spec["ncu"]
    exe = shutil.which(a.ncu)
    if not exe:
        say(NCU_ABSENT.format(exe=a.ncu))
        return "ncu absent"
    events, log = res / "ncu.jsonl", res / "ncu.log"  # the harness logs its children to <out>.log
    wrap = [exe] + [arg.replace("{report}", str(res / "ncu-{n}")).replace("{part}", str(HERE)) for arg in n["args"]]
    size = max(1, int(n["chunk"]))
    todo = [j for j in jobs if j["record_id"] not in done_ids(events)]
    say(f"ncu: {len(todo)} kernels to profile, {size} per ncu run")
    for start in range(0, len(todo), size):
        if a.time_limit_s is not None and time.monotonic() - t0 > a.time_limit_s:
            say(f"ncu: time limit of {a.time_limit_s:g} s reached; run the command again (--resume) for the rest")
            return "stopped at the time limit"
        chunk = res / "ncu-chunk.jsonl"
        chunk.write_text("".join(json.dumps(j) + "\n" for j in todo[start:start + size]))
        harness(spec, chunk, events, "nvtx", n["options"], n["timeout_s"], env, wrap)
        chunk.unlink()
        text = log.read_text(errors="replace") if log.exists() else ""
        if "ERR_NVGPUCTRPERM" in text:
            say(NCU_PERMISSION)
            return "no permission"
        progress("ncu", events, len(jobs), t0)
    return "done"


if __name__ == "__main__":
    sys.exit(main())
