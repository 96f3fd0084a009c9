"""How the harness's processes start and end: children in their own process group that die
with their parent (PR_SET_PDEATHSIG, even when it is SIGKILLed), whose output goes to a file
and who are killed when a kernel runs too long; the exit codes they speak with."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .events import EventTail

# The package's import name: `pipeline.device.harness` in the project, `harness` in a bundle.
PACKAGE = __package__
# The folder it is imported from, put on the PYTHONPATH of every process it starts.
IMPORT_ROOT = Path(__file__).resolve().parents[PACKAGE.count(".") + 1]


def command(python: str = sys.executable) -> list[str]:
    """The command that runs the harness (its command line, `cli.py`) with `python`."""
    return [python, "-m", PACKAGE]


def child_env(env: dict | None = None) -> dict:
    """`env` (default: this process's) with the harness importable: its import root first on
    PYTHONPATH, so a child finds the package wherever it starts."""
    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT)] + [p for p in paths if p != str(IMPORT_ROOT)])
    return env


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

# prctl option: the signal this process gets when the thread that started it exits.
PR_SET_PDEATHSIG = 1

# Exit code of a child whose parent was already gone when it started.
EXIT_ORPHANED = 5

# `python -m harness EXEC_WITH_PARENT <pid> <command...>`: arm die_with_parent, then exec the command.
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
    """`cmd`, started so that it dies with this process: the harness arms PR_SET_PDEATHSIG
    and execs it (the setting survives exec, so ncu or any program is covered)."""
    return [*command(sys.executable), EXEC_WITH_PARENT, str(os.getpid()), *cmd]


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
                                env=child_env(env), start_new_session=True)
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
