"""Pictures of an Nsight Compute kernel table (features/ncu/report.py writes one per report):
a roofline (achieved FLOP/s against arithmetic intensity, under the device's peaks when the
table has them) and the warp stall breakdown, the two views ncu's own UI opens with.

FLOPs count an FMA as two (half-precision FMA pairs as four, as ncu's roofline does). They
come from the curated instruction counts (`python -m features.ncu.report`'s default
metrics) over the kernel's duration, or, in a table of every metric (`--metrics all`), from
ncu's per-cycle rates times the clock; bytes are DRAM reads plus writes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

# (precision, op) -> FLOPs per thread instruction
OPS = {("fp32", "fadd"): 1, ("fp32", "fmul"): 1, ("fp32", "ffma"): 2, ("fp64", "dadd"): 1, ("fp64", "dmul"): 1,
       ("fp64", "dfma"): 2, ("fp16", "hadd"): 2, ("fp16", "hmul"): 2, ("fp16", "hfma"): 4}
PEAK_OP = {"fp32": ("ffma", 2), "fp64": ("dfma", 2), "fp16": ("hfma", 4)}
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
TIME = "gpu__time_duration.sum"  # ns
SM_HZ, SMSP_HZ, DRAM_HZ = ("sm__cycles_elapsed.avg.per_second", "smsp__cycles_elapsed.avg.per_second",
                           "dram__cycles_elapsed.avg.per_second")


def _col(table: pd.DataFrame, name: str) -> pd.Series:
    return table[name].astype(float) if name in table else pd.Series(np.nan, index=table.index)


def _flops_per_s(table: pd.DataFrame, precision: str) -> pd.Series:
    """Achieved FLOP/s of one precision per launch (NaN where the table says nothing of it)."""
    counts = [_col(table, f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum") * w
              for (p, op), w in OPS.items() if p == precision]
    from_counts = pd.concat(counts, axis=1).sum(axis=1, min_count=1) / (_col(table, TIME) * 1e-9)
    rates = [_col(table, f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum.per_cycle_elapsed") * w
             for (p, op), w in OPS.items() if p == precision]
    from_rates = pd.concat(rates, axis=1).sum(axis=1, min_count=1) * _col(table, SMSP_HZ)
    return from_counts.fillna(from_rates)


def roofline_points(table: pd.DataFrame) -> pd.DataFrame:
    """One row per launch and precision that did floating-point work and moved DRAM bytes:
    kernel, precision, flops_per_s, intensity (FLOPs per DRAM byte)."""
    bytes_per_s = (_col(table, "dram__bytes_read.sum") + _col(table, "dram__bytes_write.sum")) / (
        _col(table, TIME) * 1e-9)
    rows = []
    for precision in PEAK_OP:
        f = _flops_per_s(table, precision)
        ok = (f > 0) & (bytes_per_s > 0)
        rows.append(pd.DataFrame({"kernel": table["kernel_name"][ok], "precision": precision,
                                  "flops_per_s": f[ok], "intensity": (f / bytes_per_s)[ok]}))
    return pd.concat(rows, ignore_index=True)


def peaks(table: pd.DataFrame) -> dict[str, float]:
    """The device's peaks that the table holds (ncu's roofline metrics): FLOP/s per precision
    and DRAM bytes/s; empty when the table has none (the curated metric list has none)."""
    out = {}
    for precision, (op, w) in PEAK_OP.items():
        v = (_col(table, f"sm__sass_thread_inst_executed_op_{op}_pred_on.sum.peak_sustained") * w
             * _col(table, SM_HZ)).median()
        if np.isfinite(v) and v > 0:
            out[precision] = float(v)
    bw = (_col(table, "dram__bytes.sum.peak_sustained") * _col(table, DRAM_HZ)).median()
    if np.isfinite(bw) and bw > 0:
        out["dram_bytes_per_s"] = float(bw)
    return out


def roofline(points: pd.DataFrame, peak: dict[str, float], title: str) -> Figure:
    """Achieved FLOP/s against arithmetic intensity, log-log, with a roof per precision (the
    bandwidth slope up to the compute peak) where the peaks are known."""
    fig = Figure(figsize=(6, 4.5))
    ax = fig.subplots()
    colors = {"fp32": "tab:blue", "fp64": "tab:red", "fp16": "tab:green"}
    xs = points["intensity"].to_numpy()
    lo, hi = (min(xs.min(), 0.1) / 2, max(xs.max(), 100) * 2) if len(xs) else (0.01, 1000)
    bw = peak.get("dram_bytes_per_s")
    for precision, pts in points.groupby("precision", sort=False):
        ax.scatter(pts["intensity"], pts["flops_per_s"], color=colors[precision], s=25, label=f"{precision} launches")
    for precision in (p for p in PEAK_OP if p in peak):
        x = np.geomspace(lo, hi, 200)
        roof = np.minimum(peak[precision], x * bw) if bw else np.full_like(x, peak[precision])
        ax.plot(x, roof, color=colors[precision], lw=1, ls="--", label=f"{precision} peak {peak[precision]:.3g} FLOP/s")
    if bw:
        ax.plot([], [], " ", label=f"DRAM {bw:.3g} B/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(title if peak else f"{title} (no device peaks in the table)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def stall_table(table: pd.DataFrame) -> pd.DataFrame:
    """Warp stall cycles per issued instruction, by reason (columns) and kernel (rows, the mean
    over its launches); reasons that are zero or missing everywhere are left out."""
    cols = {c: STALL.match(c)["reason"] for c in table.columns if STALL.match(c)}
    stalls = table[list(cols)].astype(float).rename(columns=cols)
    stalls = stalls.groupby(table["kernel_name"], sort=False).mean()
    stalls = stalls.dropna(how="all")
    return stalls.loc[:, (stalls.fillna(0) > 0).any()]


def stall_breakdown(stalls: pd.DataFrame, title: str) -> Figure:
    """A stacked bar per kernel: where its warps wait, in cycles per issued instruction."""
    fig = Figure(figsize=(7, 1.2 + 0.45 * max(len(stalls), 1) + 0.12 * len(stalls.columns)))
    ax = fig.subplots()
    y = np.arange(len(stalls))[::-1]
    left = np.zeros(len(stalls))
    cmap = [f"C{i % 10}" for i in range(len(stalls.columns))]
    for i, reason in enumerate(stalls.sum().sort_values(ascending=False).index):
        v = stalls[reason].fillna(0).to_numpy()
        ax.barh(y, v, left=left, color=cmap[i], hatch="//" if i >= 10 else None, label=reason)
        left += v
    ax.set_yticks(y)
    ax.set_yticklabels([k if len(k) <= 40 else k[:37] + "..." for k in stalls.index], fontsize=7)
    ax.set_xlabel("warp stall cycles per issued instruction")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    fig.tight_layout()
    return fig


def write(table: pd.DataFrame, folder: Path, stem: str) -> dict[str, Path | str]:
    """<stem>_roofline.png and <stem>_stalls.png in `folder`; for a picture the table has no
    data for, the reason instead of a path."""
    from models.plots import save

    device = next(iter(table["device"].dropna()), "unknown device") if "device" in table else "unknown device"
    out: dict[str, Path | str] = {}
    points = roofline_points(table)
    out["roofline"] = save(roofline(points, peaks(table), f"{stem} ({device})"), folder / f"{stem}_roofline.png") \
        if len(points) else "no launch with both FLOP counts and DRAM bytes"
    stalls = stall_table(table)
    out["stalls"] = save(stall_breakdown(stalls, f"{stem} ({device}): warp stalls"), folder / f"{stem}_stalls.png") \
        if len(stalls) else "no warp stall metrics"
    return out
