"""The console shows a failure as one line; the job's log file keeps its traceback."""

from __future__ import annotations

import logging
import logging.config

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pipeline import config


def test_console_one_line_log_file_traceback(tmp_path, capsys):
    """The project's own Hydra job logging (conf/config.yaml), applied as Hydra applies it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config.conf_source(), version_base="1.3"):
        cfg = hydra_compose(config_name="config", return_hydra_config=True)
    logging_cfg = OmegaConf.to_container(cfg.hydra.job_logging, resolve=False)
    logging_cfg["handlers"]["file"]["filename"] = str(tmp_path / "job.log")
    root, console = logging.getLogger(), logging.getLogger("pipeline.console")
    saved = root.handlers[:], root.level, console.handlers[:], console.propagate, console.level
    try:
        logging.config.dictConfig(logging_cfg)
        log = logging.getLogger("pipeline.tuning")
        try:
            raise ValueError("need at least one array to concatenate")
        except ValueError:
            log.error("tune C1D-1 with mlp failed: %s", "ValueError: need at least one array", exc_info=True)
        log.info("tune C1D-1 with random (seed 0)")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:], console.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        console.propagate, console.level = saved[3], saved[4]
    shown = capsys.readouterr().out
    assert "Traceback" not in shown, shown
    lines = [line for line in shown.splitlines() if "C1D-1" in line]
    assert len(lines) == 2 and lines[0].endswith(
        "tune C1D-1 with mlp failed: ValueError: need at least one array (traceback in the job's log file)")
    kept = (tmp_path / "job.log").read_text()
    assert "Traceback (most recent call last)" in kept and 'raise ValueError("need at least one array' in kept
    assert "(traceback in the job's log file)" not in kept
