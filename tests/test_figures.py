"""Figures built from real data: a workspace made by the real stages, real tuning tables and
the public Nsight Compute reports; each test checks what is drawn, not only that a file exists."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models import dataset_figures as D
from models import plots


def test_collect_draws_the_dataset_overview_and_label_noise(collected_workspace):
    from pipeline.core.workspace import Workspace

    root, _ = collected_workspace
    ws = Workspace(root)
    for name in (D.OVERVIEW_PNG, D.NOISE_PNG):  # written by stage=collect
        assert (root / "reports" / name).read_bytes()[:4] == b"\x89PNG"
    table, latencies = D.per_task(ws)
    cands, meas = ws.read("candidates"), ws.read("measurements")
    assert len(table) == 3 and table["candidates"].sum() == len(cands)
    assert table[["build_failed", "run_failed", "incorrect"]].sum().sum() == (
        ws.read("kernels")["error"].notna().sum() + meas["error"].notna().sum()
        + (meas["correct"].astype("boolean") == False).sum())  # noqa: E712
    fig = plots.dataset_overview(table, latencies)
    bars, _, boxes = fig.axes
    assert sorted(p.get_width() for p in bars.patches) == sorted(table["candidates"])
    medians = [line.get_xdata()[0] for line in boxes.lines if line.get_color() in ("C1", "#ff7f0e")]
    per_task = latencies.groupby("task")["latency_s"].median() * 1e6
    assert sorted(medians) == pytest.approx(sorted(per_task))
    # label noise: the first two repeats of every usable measurement (measure.repeat=2)
    pairs, what = D.noise_pairs(ws)
    assert what == "repeat" and len(pairs) == latencies.shape[0]
    first = meas.set_index("record_id")["run_secs"].map(lambda v: v[0])
    assert pairs.set_index("record_id")["first_s"].to_dict() == pytest.approx(first[pairs["record_id"]].to_dict())
    dots = plots.label_noise(pairs, what).axes[0].collections[0].get_offsets()
    assert len(dots) == len(pairs) and np.isfinite(dots).all()
    # before any timing (a collect bundle exported from an unmeasured workspace): bars, no boxes
    bare = plots.dataset_overview(table, latencies.iloc[:0])
    assert len(bare.axes[0].patches) == len(table) and not bare.axes[2].lines


def test_comparison_chart_leaves_missing_values_out():
    from models import evaluation as E

    frame = pd.DataFrame({"split": "by_task", "features": "static", "model": ["lgbm", "lgbm", "mlp", "mlp"],
                          "seed": [0, 1, 0, 1], "test_top1_score": [0.5, 0.7, 0.4, 0.6],
                          "test_spearman": [0.3, 0.5, np.nan, np.nan]})
    splits = E.split_table(frame, ("top1_score", "spearman"))
    chart = splits.assign(run=splits["model"] + "/" + splits["features"] + "/" + splits["split"])
    ax = plots.compare_chart(chart, ["test_top1_score", "test_spearman"]).axes[0]
    top1, spearman = (c.lines[0].get_xdata() for c in ax.containers)
    assert list(top1) == pytest.approx([0.6, 0.5]) and list(spearman) == pytest.approx([0.4])  # mlp's: not 0
    low, high = (seg[:, 0] for seg in np.transpose([s for s in ax.containers[0].lines[2][0].get_segments()], (1, 0, 2)))
    assert list(low) == pytest.approx([0.5, 0.4]) and list(high) == pytest.approx([0.7, 0.6])
    assert "no value (not drawn): 1" in ax.get_title()


def _ncu_tables(shared_fixtures, tmp_path, metrics: str) -> tuple[pd.DataFrame, dict]:
    """The kernel table of the public H100 report (`--set full`), written and drawn by the CLI."""
    pytest.importorskip("ncu_report", reason="the `cuda` extra (ncu-report) is not installed")
    from features.ncu.report import main
    from pipeline.core.workspace import read_table

    report = shared_fixtures / "ncu-public" / "h100-full-silu.ncu-rep"
    plots_dir = tmp_path / f"plots-{metrics}"
    assert main([str(report), "--metrics", metrics, "--out", str(tmp_path / metrics), "--plots", str(plots_dir)]) == 0
    return read_table(tmp_path / metrics / "h100-full-silu.parquet"), {p.name: p for p in plots_dir.glob("*.png")}


def test_ncu_roofline_from_a_public_report(shared_fixtures, tmp_path):
    from features.ncu import plots as P

    curated, drawn = _ncu_tables(shared_fixtures, tmp_path, "default")
    full, drawn_full = _ncu_tables(shared_fixtures, tmp_path, "all")
    assert {"h100-full-silu_roofline.png", "h100-full-silu_stalls.png"} <= set(drawn) & set(drawn_full)
    # the curated counts over the duration and ncu's per-cycle rates times the clock agree
    a, b = P.roofline_points(curated), P.roofline_points(full)
    assert list(a["precision"]) == ["fp32"] * 3 + ["fp16"] * 3 and list(b["precision"]) == list(a["precision"])
    assert list(a["flops_per_s"]) == pytest.approx(list(b["flops_per_s"]), rel=0.01)
    t = curated.iloc[0]
    fp32 = (t["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"]
            + 2 * t["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]) / (t["gpu__time_duration.sum"] * 1e-9)
    assert a["flops_per_s"].iloc[0] == pytest.approx(fp32)
    # H100 PCIe under ncu's clock: 114 SMs x 128 FMA lanes x 2, and 2 TB/s of DRAM
    peak = P.peaks(full)
    assert P.peaks(curated) == {}
    assert peak["fp32"] == pytest.approx(2 * 14592 * full["sm__cycles_elapsed.avg.per_second"].median())
    assert peak["dram_bytes_per_s"] == pytest.approx(2.04e12, rel=0.01)
    ax = P.roofline(b, peak, "t").axes[0]
    dots = np.vstack([c.get_offsets() for c in ax.collections])
    assert list(dots[:, 1]) == pytest.approx(list(b["flops_per_s"])) and (dots[:, 1] < peak["fp32"] * 2).all()
    roof = {line.get_label().split()[0]: line.get_ydata() for line in ax.get_lines() if "peak" in line.get_label()}
    assert roof["fp32"].max() == pytest.approx(peak["fp32"]) and set(roof) == {"fp32", "fp64", "fp16"}


def test_ncu_stall_breakdown_from_a_public_report(shared_fixtures, tmp_path):
    from features.ncu import plots as P

    curated, _ = _ncu_tables(shared_fixtures, tmp_path, "default")
    stalls = P.stall_table(curated)
    assert list(stalls.index) == ["silu_kernel_vector"] and stalls.idxmax(axis=1).iloc[0] == "long_scoreboard"
    ratio = [c for c in curated if P.STALL.match(c)]
    assert stalls.sum(axis=1).iloc[0] == pytest.approx(curated[ratio].astype(float).mean().sum())
    ax = P.stall_breakdown(stalls, "t").axes[0]
    ends = max(p.get_x() + p.get_width() for p in ax.patches)
    assert ends == pytest.approx(stalls.sum(axis=1).iloc[0]) and len(ax.patches) == stalls.shape[1]
    # reports without those metrics: no picture, and the reason
    from features.ncu.report import main

    other = shared_fixtures / "ncu-public" / "rtx3070-nvtx-daxpy.ncu-rep"
    assert main([str(other), "--out", str(tmp_path / "o"), "--plots", str(tmp_path / "op")]) == 0
    assert not list((tmp_path / "op").glob("*.png"))
