"""`python -m pipeline stage=<name>`: composes the Hydra config and dispatches."""

from __future__ import annotations

import logging
import sys
import time

import hydra
from omegaconf import DictConfig

from pipeline import stages
from pipeline.core.errors import PipelineError
from pipeline.summary import print_summary

log = logging.getLogger("pipeline")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    name = str(cfg.stage)
    try:
        names = stages.stages_for_all(cfg) if name == "all" else [name]
        runs = [stages.run_of(n) for n in names]
    except ValueError as e:
        log.error("%s", e)
        sys.exit(2)
    t0 = time.time()
    results = {}
    try:
        for n, run in zip(names, runs):
            log.info("stage=%s workspace=%s", n, cfg.workspace)
            results[n] = run(cfg) or {}
    except PipelineError as e:
        log.error("%s", e)
        sys.exit(2)
    print_summary(cfg, results, time.time() - t0)


if __name__ == "__main__":
    main()
