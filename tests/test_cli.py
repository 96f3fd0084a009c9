"""The Hydra entry point: help, validation of names, clear errors."""

from __future__ import annotations

import subprocess
import sys

from pipeline import stages

from conftest import ROOT


def cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_help_lists_stages_and_groups():
    out = cli("--help")
    assert out.returncode == 0, out.stderr
    for name in stages.STAGES:
        assert f"  {name} " in out.stdout, name
    for group in ("dataset   ops*, relax, release, tenset, zoo", "target    h100, h200, llvm*", "budget    default*, full, smoke"):
        assert group in out.stdout


def test_unknown_dataset_lists_valid_ones():
    out = cli("dataset=nope", "stage=tasks")
    assert out.returncode != 0
    assert "dataset/nope" in out.stderr and "ops" in out.stderr and "tenset" in out.stderr


def test_unknown_stage_lists_valid_ones(tmp_path):
    out = cli("stage=nope", f"paths.data={tmp_path}")
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "stage='nope' is not a stage" in text and "replay" in text


def test_unknown_target_lists_valid_ones():
    out = cli("target=tpu", "stage=tasks")
    assert out.returncode != 0 and "llvm" in out.stderr and "h100" in out.stderr


def test_missing_prerequisite_names_the_stage_to_run(tmp_path):
    out = cli("stage=replay", f"paths.data={tmp_path}")
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "stage=sample" in text and "Traceback" not in text
