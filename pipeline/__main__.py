"""`pipeline stage=<name>` (the console script) or `python -m pipeline stage=<name>`:
composes the Hydra config, checks it, and dispatches to the stages.

A run that stops says so in one line (pipeline/failures.py): a bad setting or an override
that Hydra's parser cannot read (exit code 2, before any stage touches the workspace), Ctrl-C (130, with what was kept and the command
that resumes), a corrupt file or an unusable path (1). In a multirun a failing job is
logged and recorded and the sweep goes on (pipeline/sweep.py). The task function returns
the run's metric for sweepers: stage=train's `mlflow.best_metric` of its best run.
"""

from __future__ import annotations

import logging
import math
import sys
import time

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import pipeline.docs_config  # noqa: F401  (registers ${pipeline_help:}: the stages and groups --help lists)
from pipeline import config, failures, stages
from pipeline.logs import console_to_log, quiet_dependencies
from pipeline.summary import OBJECTIVE, print_summary
from pipeline.sweep import record_failure

log = logging.getLogger("pipeline")


def objective(results: dict[str, dict]) -> float | None:
    """The metric a sweeper optimizes (higher is better): the last stage's that gives one."""
    for counts in reversed(list(results.values())):
        if OBJECTIVE in counts:
            return float(counts[OBJECTIVE]["value"])
    return None


# An absolute folder (a checkout) or `pkg://pipeline.conf` (installed): as a console script this
# module is `pipeline.__main__`, not `__main__`, and Hydra would read a relative config_path as
# a Python package.
@hydra.main(version_base="1.3", config_path=config.conf_source(), config_name="config")
def app(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    sweeping = hc.mode == RunMode.MULTIRUN
    quiet_dependencies(cfg.get("log", {}).get("quiet") or [])
    try:
        config.check(cfg)  # before any stage opens the workspace (force=true deletes parts)
        names = stages.stages_for_all(cfg) if str(cfg.stage) == "all" else [str(cfg.stage)]
        runs = [stages.run_of(n) for n in names]
    except (config.ConfigError, ValueError) as e:  # a bad setting or stage name
        outcome = failures.Outcome(failures.USER_ERROR, str(e))
    else:
        outcome = run_stages(cfg, names, runs, list(hc.overrides.task), sweeping)
    if not isinstance(outcome, failures.Outcome):
        return outcome
    for line in outcome.message.splitlines():
        log.error("%s", line)
    if sweeping and outcome.code != failures.INTERRUPTED:
        record_failure(outcome.message)  # the sweep goes on; FailedJobs names this job at its end
        return math.nan
    sys.exit(outcome.code)


def run_stages(cfg, names: list[str], runs: list, overrides: list[str], sweeping: bool):
    """Run the stages in order and print the summary; returns the run's metric (None when no
    stage gives one), or the Outcome of a run that stopped."""
    stage, results, t0 = None, {}, time.time()
    try:
        with console_to_log():
            for stage, run in zip(names, runs):
                log.info("stage=%s workspace=%s", stage, cfg.workspace)
                results[stage] = run(cfg) or {}
            print_summary(cfg, results, time.time() - t0)
        return objective(results)
    except KeyboardInterrupt:
        return failures.interrupted(cfg, stage, overrides)
    except Exception as e:  # noqa: BLE001 - explained in one line, or shown in full
        outcome = failures.explain(e, cfg, stage)
        if outcome is not None:
            return outcome
        if not sweeping:
            raise
        log.exception("stage=%s failed", stage)  # a bug: its traceback in the job's log
        return failures.Outcome(1, f"stage={stage} failed: {type(e).__name__}: {e}")


def main() -> None:
    """The console script `pipeline` (pyproject.toml), same as `python -m pipeline`."""
    unreadable = config.override_errors(sys.argv[1:])  # before Hydra, which names no fix
    if unreadable:
        print("\n".join(unreadable), file=sys.stderr)
        sys.exit(failures.USER_ERROR)
    try:
        app()
    except KeyboardInterrupt:  # before a stage started: while Hydra composed the config
        print(failures.interrupted(None, None, []).message, file=sys.stderr)
        sys.exit(failures.INTERRUPTED)


if __name__ == "__main__":
    main()
