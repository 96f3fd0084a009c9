"""CPU counters of llvm kernels: `perf stat` around N calls, getrusage and wall time.

A worker process (this module run with `--worker`; TVM runtime and NumPy only) loads one
kernel at a time, makes its inputs the way the measure stage's runner does, warms it up
and picks N so that the counted loop lasts `min_time_s`. The collector then attaches
`perf stat -p <worker>` with counting disabled, and the worker itself switches counting
on and off around the loop through perf's control FIFO, so the counts cover exactly the N
calls (per call = count / N) and not loading or input generation.

Where the machine does not expose an event (hardware counters in VMs and containers:
perf_event_open fails), or perf is not installed, the value is null and `<col>.reason`
says why; a counter is never reported as zero when it was not counted. getrusage deltas
(page faults, context switches, user/system time) and wall time need nothing and are
always there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from pipeline.core.schema import PERF_EVENTS, RUSAGE_FIELDS

PERF_MISSING = ("perf not installed: install it (Debian: apt-get install linux-perf; Ubuntu: "
                "apt-get install linux-tools-$(uname -r)) or set collect.perf.executable")

# Seconds a fresh worker may take to import TVM.
STARTUP_S = 180.0


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


# ----------------------------------------------------------------------------- worker side


def _worker(root: str) -> int:
    """Serve prepare/run requests, one JSON line each, on the original stdout."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the protocol
    import resource

    import numpy as np
    import tvm

    from pipeline.runner.kernel_runner import random_array

    dev = tvm.cpu(0)
    state: dict = {}

    def reply(**kw):
        proto.write(json.dumps(kw) + "\n")

    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "prepare":
                mod = tvm.runtime.load_module(os.path.join(root, req["artifact"]))
                func = mod["main"]
                rng = np.random.default_rng(0)
                args = [tvm.runtime.tensor(random_array(np, d, s, rng), dev) for d, s in req["args"]]
                func(*args)  # warm-up (also starts the thread pool that perf then attaches to)
                n, t0 = 0, time.perf_counter()
                while True:
                    func(*args)
                    n += 1
                    one = (time.perf_counter() - t0) / n
                    if time.perf_counter() - t0 >= min(0.01, req["min_time_s"]) or n >= req["max_calls"]:
                        break
                calls = int(min(req["max_calls"], max(1, math.ceil(req["min_time_s"] / max(one, 1e-9)))))
                state.update(func=func, args=args)
                reply(ok=True, calls=calls, one_call_s=one)
            elif req["op"] == "run":
                func, args, calls = state["func"], state["args"], int(req["calls"])
                ctl = ack = None
                if req.get("ctl"):
                    ctl, ack = _open_control(req["ctl"], req["ack"], float(req.get("timeout_s", 30)))
                    _command(ctl, ack, b"enable\n")
                r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                for _ in range(calls):
                    func(*args)
                t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
                if ctl is not None:
                    _command(ctl, ack, b"disable\n")
                    os.close(ctl)
                    os.close(ack)
                ru = {col: (getattr(r1, f) - getattr(r0, f)) / calls for col, f in RUSAGE_FIELDS.items()}
                reply(ok=True, calls=calls, wall_s=(t1 - t0) / calls, rusage=ru, max_rss_bytes=int(r1.ru_maxrss) * 1024)
                state.clear()
            else:
                reply(ok=False, error=f"unknown op {req['op']!r}")
        except Exception as e:  # noqa: BLE001 - a failing kernel is a result
            msg = str(e).strip().splitlines()
            state.clear()
            reply(ok=False, error=f"{type(e).__name__}: {msg[-1] if msg else ''}"[:2000])
    return 0


def _open_control(ctl_path: str, ack_path: str, timeout_s: float) -> tuple[int, int]:
    """Open perf's control FIFO (writer) and ack FIFO (reader) without blocking forever."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ctl = os.open(ctl_path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:  # ENXIO: perf has not opened it yet
            if time.monotonic() > deadline:
                raise TimeoutError("perf did not open its control FIFO") from None
            time.sleep(0.005)
    os.set_blocking(ctl, True)
    ack = os.open(ack_path, os.O_RDONLY | os.O_NONBLOCK)
    return ctl, ack


def _command(ctl: int, ack: int, cmd: bytes, timeout_s: float = 30.0) -> None:
    os.write(ctl, cmd)
    sel = selectors.DefaultSelector()
    sel.register(ack, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    buf = b""
    while b"ack" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
            raise TimeoutError(f"perf did not acknowledge {cmd.strip().decode()}")
        chunk = os.read(ack, 64)
        if chunk:
            buf += chunk
        else:
            time.sleep(0.001)
    sel.close()


# ----------------------------------------------------------------------------- collector side


class Worker:
    """A worker process and its line protocol, with timeouts."""

    def __init__(self, root: str, python: str = sys.executable):
        self.proc = subprocess.Popen(
            [python, "-m", "features.cpu_counters", "--worker", "--root", root],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.buf = b""
        self.fresh = True

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, limit_s: float, **req) -> dict:
        """Send one request; the reply, or an error dict for a crash or a timeout."""
        limit = limit_s + (STARTUP_S if self.fresh else 0.0)
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"ok": False, "dead": True, "error": f"crashed: worker exited with {self._rc()}"}
        deadline = time.monotonic() + limit
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return {"ok": False, "dead": True, "error": f"timeout: no result within {limit_s:g} s"}
            if self.sel.select(min(left, 1.0)):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.proc.wait()
                    return {"ok": False, "dead": True, "error": f"crashed: worker exited with {self._rc()}"}
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.fresh = False
        return json.loads(line)

    def _rc(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            return "no exit code"
        if rc < 0:
            try:
                return f"signal {signal.Signals(-rc).name}"
            except ValueError:
                return f"signal {-rc}"
        return f"exit code {rc}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, OSError):
            self.kill()
        self.sel.close()


def _perf_attached(perf: str, pid: int, events: list[str], workdir: str):
    ctl, ack, out = (os.path.join(workdir, n) for n in ("ctl.fifo", "ack.fifo", "perf.csv"))
    for p in (ctl, ack):
        if os.path.exists(p):
            os.unlink(p)
        os.mkfifo(p)
    if os.path.exists(out):
        os.unlink(out)
    proc = subprocess.Popen(
        [perf, "stat", "-x", ",", "-e", ",".join(events), "-p", str(pid), "-D", "-1",
         "--control", f"fifo:{ctl},{ack}", "-o", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )
    return proc, ctl, ack, out


def _stop_perf(proc) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.stderr.read().decode(errors="replace") if proc.stderr else ""


def collect(jobs: list[dict], root: str, opts: dict, on_row=None, progress=None) -> list[dict]:
    """One CPU_COUNTERS row per job (record_id, task_id, artifact, args).

    opts: perf (executable), events, min_time_s, max_calls, timeout_s, batch_size."""
    events = list(opts["events"])
    selected = set(events)
    perf, usable, reasons = probe_perf(str(opts.get("perf", "perf")), events)
    version = perf_version(perf) if perf else None
    for col, ev in PERF_EVENTS.items():
        if ev not in selected:
            reasons[ev] = "not selected (collect.perf.events)"
    rows = []
    worker, served = None, 0
    batch = max(1, int(opts.get("batch_size", 64)))
    timeout = float(opts.get("timeout_s", 60))
    with tempfile.TemporaryDirectory(prefix="perf-") as tmp:
        for job in jobs:
            if worker is None or served >= batch:
                if worker is not None:
                    worker.close()
                worker, served = Worker(root), 0
            served += 1
            row = {"record_id": job["record_id"], "task_id": job["task_id"], "perf_version": version}
            res = worker.request(timeout, op="prepare", artifact=job["artifact"], args=job["args"],
                                 min_time_s=float(opts["min_time_s"]), max_calls=int(opts["max_calls"]))
            counted = {}
            if res.get("ok"):
                perf_proc = None
                run_req = dict(op="run", calls=res["calls"], timeout_s=timeout)
                if perf and usable:
                    perf_proc, ctl, ack, out = _perf_attached(perf, worker.pid, usable, tmp)
                    run_req.update(ctl=ctl, ack=ack)
                res = worker.request(timeout + 10 * res.get("one_call_s", 0) * res["calls"], **run_req)
                if perf_proc is not None:
                    err = _stop_perf(perf_proc)
                    text = open(out).read() if os.path.exists(out) else ""
                    counted = parse_perf_csv(text)
                    if not counted and res.get("ok"):
                        why = " ".join(err.strip().splitlines()[-2:])[:300] or "no output"
                        counted = {ev: (None, f"perf stat -p failed: {why}") for ev in usable}
            if res.get("dead"):
                worker.kill()
                worker = None
            if not res.get("ok"):
                row["error"] = f"run: {res.get('error')}"
            else:
                row.update(calls=res["calls"], wall_s=res["wall_s"], **{"rusage.max_rss_bytes": res["max_rss_bytes"]})
                row.update({f"rusage.{k}": v for k, v in res["rusage"].items()})
                for col, ev in PERF_EVENTS.items():
                    value, reason = counted.get(ev, (None, reasons.get(ev, "perf printed no value for this event")))
                    row[f"perf.{col}"] = None if value is None else value / res["calls"]
                    row[f"perf.{col}.reason"] = reason if value is None else None
            rows.append(row)
            if on_row:
                on_row(row)
            if progress:
                progress()
    if worker is not None:
        worker.close()
    return rows


def load(ws, device: str) -> tuple["pd.DataFrame", dict[str, str]]:  # noqa: F821
    """(per-record counters, column -> why it has no value) of a workspace, error rows left out."""
    from pipeline.core.schema import CPU_COUNTERS
    from pipeline.core.workspace import read_table

    df = read_table(ws.features / "cpu" / f"device={device}", CPU_COUNTERS)
    df = df[df["error"].isna()].drop_duplicates("record_id", keep="last").reset_index(drop=True)
    reasons = {}
    for col in PERF_EVENTS:
        r = df[f"perf.{col}.reason"].dropna()
        if len(r):
            reasons[f"perf.{col}"] = str(r.iloc[0])
    keep = [c for c in df.columns if not c.endswith(".reason") and c not in ("error", "perf_version")]
    return df[keep], reasons


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="CPU counter worker (TVM runtime + NumPy)")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--root", required=True, help="folder that artifact paths are relative to")
    opts = p.parse_args(argv)
    return _worker(opts.root)


if __name__ == "__main__":
    sys.exit(main())
