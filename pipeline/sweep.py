"""Sweeps (`-m`) that survive a failing job and end by naming the jobs that failed.

Hydra's sweepers stop a sweep when a job raises (the basic sweeper re-raises the first
failure after its batch, and `sys.exit` in a job ends the process at once). So a job of a
multirun does not raise for a fault it can name: the entry point logs the fault, writes
it to `FAILED` in the job's output folder (`record_failure`) and returns NaN as the
job's metric (Optuna marks such a trial failed). `FailedJobs`, a Hydra callback that
conf/config.yaml registers, reads those files when the sweep ends, logs one line listing
the failed jobs with their overrides, and exits with code 1 when any job failed. Files,
not memory: the joblib launcher runs jobs in other processes.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("pipeline.sweep")

#: the file in a job's output folder that says why the job failed
FAILED = "FAILED"


def record_failure(message: str) -> Path:
    """Write `message` to the running job's `FAILED` file; returns its path."""
    hc = HydraConfig.get()
    path = Path(hc.runtime.output_dir) / FAILED
    overrides = " ".join(hc.overrides.task)
    path.write_text(f"{hc.job.num}\t{overrides}\t{' | '.join(message.splitlines())}\n")
    return path


def failed_jobs(sweep_dir: Path) -> list[tuple[int, str, str]]:
    """(job number, overrides, message) of every job of a sweep that recorded a failure."""
    out = []
    for f in Path(sweep_dir).rglob(FAILED):
        num, overrides, message = (f.read_text().rstrip("\n").split("\t", 2) + ["", ""])[:3]
        out.append((int(num) if num.isdigit() else -1, overrides, message))
    return sorted(out)


class FailedJobs(Callback):
    """At the end of a multirun: one line naming the failed jobs, and exit code 1 if any."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        failed = failed_jobs(sweep_dir)
        if not failed:
            return
        jobs = len(list(sweep_dir.rglob(".hydra")))
        listed = "; ".join(f"#{num} ({overrides}): {message}" for num, overrides, message in failed)
        log.error("%d of %d sweep jobs failed (the others ran): %s", len(failed), jobs or len(failed), listed)
        sys.exit(1)
