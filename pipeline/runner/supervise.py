"""Drive kernel_runner.py in a child process; isolate kernels that crash or hang.

The child writes a `start` line before each kernel and a `done` line after it. When the
child dies or stays silent past the timeout, the kernel with a start and no done gets
an error row and a new child goes on with the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

RUNNER = Path(__file__).with_name("kernel_runner.py")
# Seconds a fresh runner may take to import TVM before its first kernel starts.
STARTUP_S = 180.0


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def run_jobs(jobs: list[dict], workdir: Path, root: Path, device: str, opts: dict, timeout_s: float,
             python: str = sys.executable, env: dict | None = None) -> list[dict]:
    """Run `jobs` through kernel_runner.py; returns one `done` result per job."""
    workdir.mkdir(parents=True, exist_ok=True)
    jobs_file, out_file = workdir / "jobs.jsonl", workdir / "results.jsonl"
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    out_file.unlink(missing_ok=True)
    results: dict[str, dict] = {}
    cmd = [python, str(RUNNER), "--jobs", str(jobs_file), "--out", str(out_file), "--root", str(root),
           "--device", device] + [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    wanted = {j["record_id"] for j in jobs}
    while True:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        start_size = out_file.stat().st_size if out_file.exists() else 0
        last_size, last_change, verdict = start_size, time.monotonic(), None
        while True:
            rc = proc.poll()
            size = out_file.stat().st_size if out_file.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            if rc is not None:
                verdict = None if rc == 0 else f"crashed: runner exited with {_describe(rc)}"
                break
            limit = STARTUP_S if size == start_size else timeout_s
            if time.monotonic() - last_change > limit:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                verdict = (f"timeout: no result within {timeout_s:g} s" if size != start_size
                           else f"timeout: the runner did not start within {STARTUP_S:g} s")
                break
            time.sleep(0.05)
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        events = _events(out_file)
        for ev in events:
            if ev.get("event") == "done":
                results[ev["record_id"]] = ev
        started = [ev["record_id"] for ev in events if ev.get("event") == "start" and ev["record_id"] not in results]
        if verdict is None:
            if rc == 0:
                break
        if rc == 3 or (verdict and not started):
            # The runner could not start at all (no device, broken install): every job fails the same way.
            msg = verdict or "runner failed"
            tail = output.strip().splitlines()[-1:] if output.strip() else []
            for rid in wanted - set(results):
                results[rid] = {"record_id": rid, "error": f"{msg}{': ' + tail[0] if tail else ''}"}
            break
        for rid in started:
            results[rid] = {"record_id": rid, "error": verdict, "event": "done"}
            with out_file.open("a") as f:
                f.write(json.dumps(results[rid]) + "\n")
        if wanted <= set(results):
            break
    return [results[j["record_id"]] for j in jobs if j["record_id"] in results]


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"
