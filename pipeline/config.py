"""Compose the pipeline's Hydra config outside the command line (tests, benchmarks)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from pipeline import stages

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str] | None = None):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides or []), return_hydra_config=False)


def run_stage(name: str, overrides: list[str] | None = None) -> dict:
    cfg = compose([f"stage={name}", *(overrides or [])])
    return stages.run_of(name)(cfg) or {}
