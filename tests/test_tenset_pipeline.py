"""TenSet in the pipeline: its Ansor programs become candidates that stage=replay builds
and stage=measure checks against the unscheduled reference (llvm)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pipeline.config import compose, run_stage
from pipeline.core.sharding import Shard
from pipeline.options import target_of, tenset_copy, workspace_of
from pipeline.tenset import candidates as C

pytestmark = pytest.mark.slow  # builds and times TenSet's programs


@pytest.fixture(scope="module")
def workspace(shared_fixtures, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tenset")
    # One joined ResNet-50 record, once as logged and once with a step that cannot apply.
    src = shared_fixtures / "ansor_records" / "resnet-50-NHWC-B1-llvm.json"
    line = src.read_text().splitlines()[16]  # line 17: a 3x3 convolution on 56x56x64
    good, bad = json.loads(line), json.loads(line)
    bad["i"][1][1].insert(0, ["SP", 99, 0, 8, [2], 1])
    log = tmp / "records.json"
    log.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    ov = ["dataset=tenset", f"dataset.path={shared_fixtures / 'tenset'}", f"paths.data={tmp / 'data'}",
          "budget=full", f"dataset.records.files=[{log}]", "measure.repeat=2", "measure.min_repeat_ms=5"]
    assert run_stage("download", ov)["records_joined"] == 2
    run_stage("tasks", ov)
    return ov


def test_records_become_candidates_kernels_and_correct_measurements(workspace):
    cfg = compose(workspace)
    args = (workspace_of(cfg), Shard(), target_of(cfg))
    counts = C.add_records(*args, tenset_root=tenset_copy(cfg))
    assert counts == {"tenset_candidates": 1, "tenset_failed": 1}
    again = C.add_records(*args, tenset_root=tenset_copy(cfg))
    assert again == {"tenset_candidates": 0, "tenset_failed": 0}  # once each
    ws = compose(workspace)
    root = f"{ws.paths.data}/{ws.workspace}"
    cands = pd.read_parquet(f"{root}/candidates")
    assert list(cands["strategy"]) == ["tenset", "tenset"]
    err = cands[cands["error"].notna()].iloc[0]["error"]
    assert "tenset replay (records.json:2)" in err and "stage 99 does not exist" in err
    assert run_stage("replay", workspace)["built"] == 1
    m = run_stage("measure", workspace)
    assert m["measured"] == 1 and m["checked"] == 1 and m["incorrect"] == 0
    meas = pd.read_parquet(f"{root}/measurements")
    assert bool(meas.iloc[0]["correct"]) and meas.iloc[0]["mean_s"] > 0
