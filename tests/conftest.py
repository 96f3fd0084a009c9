"""Shared fixtures: a tiny real workspace built by the real stages (ops suite, llvm)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from pipeline.config import run_stage
from pipeline.options import workspace_of

# Tests time kernels on a busy host by design: stage=measure does not wait for it to quieten
# (measure.settle_s; tests/test_stages.py checks the wait itself).
os.environ["PIPELINE_MEASURE_SETTLE_S"] = "0"

ROOT = Path(__file__).resolve().parent.parent
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"

# Three small operators, 8 candidates each: the smallest workspace that has several
# tasks and enough records per task to rank.
SMOKE_OVERRIDES = ["dataset.ops=[GMM,C1D,SFM]", "dataset.configs=[0]", "budget=smoke",
                   "budget.candidates_per_task=8", "measure.repeat=2", "measure.min_repeat_ms=5"]


def gpu_available() -> bool:
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001
        return False


# The fixtures below run the real stages (sampling, building and timing kernels): a test
# that uses one is an end-to-end test, marked `slow` (`pytest -m "not slow"` leaves them out).
STAGE_FIXTURES = {"measured_workspace", "collected_workspace"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if STAGE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with the CUDA driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def pipeline_in_a_terminal(args: list[str]) -> Iterator[subprocess.Popen]:
    """`python -m pipeline <args>` started as a terminal starts it: a process group of its own
    and SIGINT's default disposition (a test run in the background passes an ignored SIGINT
    on to its children, and Python then never raises Ctrl-C). Killed, group and all, on leaving."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def ctrl_c(proc: subprocess.Popen, timeout: float = 180) -> str:
    """Ctrl-C as a terminal sends it (to the process group); the process's output once it ends."""
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return out + err


def copy_workspace(root: Path, overrides: list[str], data: Path, *skip: str) -> tuple[Path, list[str]]:
    """(root, overrides) of a copy of the workspace at `root` under the data folder `data`,
    without the entries named in `skip` (e.g. "measurements", "runner")."""
    import shutil

    shutil.copytree(root, data / root.name, ignore=shutil.ignore_patterns(*skip) if skip else None)
    return data / root.name, [o for o in overrides if not o.startswith("paths.data=")] + [f"paths.data={data}"]


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.exists():
        pytest.skip(f"{SHARED_FIXTURES} is absent (the shared fixtures folder sits beside the project)")
    return SHARED_FIXTURES


@pytest.fixture(scope="session")
def smoke_overrides(tmp_path_factory) -> list[str]:
    data = tmp_path_factory.mktemp("data")
    return [f"paths.data={data}", *SMOKE_OVERRIDES]


@pytest.fixture(scope="session")
def measured_workspace(smoke_overrides) -> tuple[Path, list[str]]:
    """(workspace root, overrides) after tasks, sample, replay and measure."""
    for stage in ("tasks", "sample", "replay", "measure"):
        run_stage(stage, smoke_overrides)
    from pipeline.config import compose

    return workspace_of(compose(smoke_overrides)).root, smoke_overrides


@pytest.fixture(scope="session")
def collected_workspace(measured_workspace, tmp_path_factory) -> tuple[Path, list[str]]:
    """(workspace root, overrides) of a copy of the measured workspace after stage=collect.

    A copy, so that tests of collect itself (which re-run it with shards and force) and
    tests that read its output do not depend on each other's order."""
    import shutil

    from pipeline.config import compose

    root, overrides = measured_workspace
    data = tmp_path_factory.mktemp("collected")
    shutil.copytree(root, data / root.name)
    over = [o for o in overrides if not o.startswith("paths.data=")] + [f"paths.data={data}"]
    run_stage("collect", [*over, "collect.perf.min_time_s=0.01", "collect.perf.max_calls=50"])
    return workspace_of(compose(over)).root, over
