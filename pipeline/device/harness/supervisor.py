"""The supervisor: the jobs run in child processes, a kernel that crashes its child or hangs
becomes a `done` event with its error and a fresh child goes on with the rest; interleaved
rounds; the executor's job of a batch of kernels."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from .events import append_event, done_events
from .host import HOST_FIELDS, host_identity
from .lifetime import EXIT_UNUSABLE, STARTUP_S, command, log_tail, run_child


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
    cmd = [*command(python), "--in-process", "--jobs", str(jobs_file), "--out", str(out), "--root", str(root),
           "--device", device, "--instrument", instrument]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in (options or {}).items()]
    got = _Seen({j["record_id"] for j in jobs}, device, on_done)
    got.results.update((rid, ev) for rid, ev in done_events(out).items() if rid in got.wanted)
    results = got.results
    while not got.wanted <= set(results):
        got.started.clear()
        before = len(results)
        prefix = [a.replace("{n}", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{len(results)}")
                  for a in wrap or ()]
        child = run_child(prefix + cmd, log, env=env, events=out, kernel_timeout_s=timeout_s, startup_s=startup_s,
                          on_events=got.seen)
        in_flight = [rid for rid in got.started if rid not in results]
        if child.rc == EXIT_UNUSABLE or (child.verdict and not got.started) or (
                not child.verdict and len(results) == before):
            # The runner could not start at all, or made no progress: every job fails the same way.
            msg = child.verdict or "runner failed"
            tail = log_tail(log)
            got.seen([{"event": "done", "record_id": rid, "error": f"{msg}{': ' + tail if tail else ''}",
                       **got.where()} for rid in (j["record_id"] for j in jobs) if rid not in results])
            break
        failed = [{"event": "done", "record_id": rid, "error": child.verdict, **got.where()}
                  for rid in in_flight if child.verdict]
        for ev in failed:
            append_event(out, ev)
        got.seen(failed)
    return [results[j["record_id"]] for j in jobs if j["record_id"] in results]


class _Seen:
    """The events of the children as they come: the kernels started in the current child and
    the first `done` event of every wanted kernel."""

    def __init__(self, wanted: set[str], device: str, on_done=None):
        self.wanted, self.device, self.on_done = wanted, device, on_done
        self.results: dict[str, dict] = {}
        self.started: list[str] = []
        self.host: dict = {}

    def where(self) -> dict:
        """Where the kernels run: as the children report it, else this host's own view (the
        supervisor shares the host; it only lacks the TVM device's own name for its GPU)."""
        return self.host or host_identity(self.device)

    def seen(self, events: list[dict]) -> None:
        for ev in events:
            rid = ev.get("record_id")
            if ev.get("event") == "start":
                self.started.append(rid)
            elif ev.get("event") == "done" and rid in self.wanted and rid not in self.results:
                if not self.host and ev.get("hardware"):
                    self.host.update({k: ev.get(k) for k in HOST_FIELDS})
                self.results[rid] = ev
                if self.on_done:
                    self.on_done(ev)


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
