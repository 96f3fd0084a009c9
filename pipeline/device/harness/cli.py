"""The harness's command line (`python -m harness` in a bundle): the jobs run in this process
(`--in-process`, as under ncu) or under the supervisor; see the package's docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .instruments import INSTRUMENT_OPTIONS, INSTRUMENTS, run_in_process
from .lifetime import EXEC_WITH_PARENT, STARTUP_S, die_with_parent
from .supervisor import supervise_rounds

DESCRIPTION = """The kernel harness: load exported kernels, make seeded inputs, run them under an
instrument, write start/done events; the supervisor isolates crashes and hangs.

jobs.jsonl: one JSON object a line: `record_id`, `artifact` (path relative to --root), `args`
([[dtype, shape], ...]) and optionally `reference` (.npz relative to --root). events.jsonl: a
`start` line before each kernel and a `done` line after it (with `error` when the kernel
failed, crashed the process or ran past --timeout-s). Jobs that already have a `done` line are
skipped, so an interrupted run resumes."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [EXEC_WITH_PARENT]:  # see orphan_safe
        die_with_parent(int(argv[1]))
        os.execvp(argv[2], argv[2:])
    p = argparse.ArgumentParser(prog=f"python -m {__package__}", description=DESCRIPTION,
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
