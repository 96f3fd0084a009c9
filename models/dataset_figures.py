"""Figures of a workspace's dataset (stage=collect and stage=compare write them in reports/):
what each task contributes (candidates, failures, latency spread) and how noisy its labels
are (two timings of the same kernels: rounds of measure.rounds, else repeats)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from models import plots
from models.tables import usable_rows

OVERVIEW_PNG = "dataset-overview.png"
NOISE_PNG = "label-noise.png"
# Tasks drawn in the overview (those with the most candidates): a TenSet workspace has thousands.
MAX_TASKS = 60


def _names(ws) -> pd.Series:
    tasks = ws.read("tasks")
    return tasks.set_index("task_id")["name"] if len(tasks) else pd.Series(dtype=str)


def per_task(ws) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per task: candidates, build_failed, run_failed, incorrect; one row per usable
    measurement: task, latency_s), tasks named as in the task table, in its order."""
    names = _names(ws)
    cands, kernels, meas = ws.read("candidates"), ws.read("kernels"), ws.read("measurements")
    meas = meas.drop_duplicates("record_id", keep="last")
    wrong = meas["correct"].astype("boolean").fillna(True) == False  # noqa: E712 - a nullable column

    def count(frame: pd.DataFrame) -> pd.Series:
        return frame.groupby("task_id").size().reindex(names.index, fill_value=0)

    table = pd.DataFrame({"task": names.to_numpy(), "candidates": count(cands).to_numpy(),
                          "build_failed": count(kernels[kernels["error"].notna()]).to_numpy(),
                          "run_failed": count(meas[meas["error"].notna()]).to_numpy(),
                          "incorrect": count(meas[meas["error"].isna() & wrong]).to_numpy()})
    good = meas[usable_rows(meas)]
    latencies = pd.DataFrame({"task": good["task_id"].map(names).to_numpy(),
                              "latency_s": good["mean_s"].astype(float).to_numpy()})
    return table, latencies


def noise_pairs(ws) -> tuple[pd.DataFrame, str] | None:
    """(task, record_id, first_s, second_s) of every usable measurement timed at least twice,
    with what the two timings are (the first two rounds, else the first two repeats); None
    when no kernel was timed twice."""
    meas = ws.read("measurements").drop_duplicates("record_id", keep="last")
    meas = meas[usable_rows(meas)]
    for column, what in (("round_means_s", "round mean"), ("run_secs", "repeat")):
        if column not in meas:
            continue
        twice = meas[meas[column].map(lambda v: v is not None and len(v) >= 2)]
        if len(twice):
            first = twice[column].map(lambda v: float(v[0]))
            second = twice[column].map(lambda v: float(v[1]))
            ok = (first > 0) & (second > 0) & np.isfinite(first) & np.isfinite(second)
            return pd.DataFrame({"task": twice["task_id"].map(_names(ws)).to_numpy(),
                                 "record_id": twice["record_id"].to_numpy(),
                                 "first_s": first.to_numpy(), "second_s": second.to_numpy()})[ok.to_numpy()], what
    return None


def write(ws, folder: Path | None = None) -> dict[str, Path]:
    """The dataset figures of `ws` as PNGs in `folder` (default: its reports/); which were written."""
    folder = folder or ws.root / "reports"
    files = {}
    table, latencies = per_task(ws)
    if len(table):
        shown = table if len(table) <= MAX_TASKS else table.nlargest(MAX_TASKS, "candidates")
        note = "" if len(shown) == len(table) else f" ({len(shown)} of {len(table)} tasks: most candidates)"
        files["overview"] = plots.save(plots.dataset_overview(shown, latencies, note), folder / OVERVIEW_PNG)
    pairs = noise_pairs(ws)
    if pairs is not None and len(pairs[0]):
        files["noise"] = plots.save(plots.label_noise(*pairs), folder / NOISE_PNG)
    return files


def main(argv=None) -> int:
    """`python -m models.dataset_figures WORKSPACE [--out FOLDER]`: the figures of a workspace
    folder without running a stage (e.g. of a release's workspace)."""
    import argparse

    from pipeline.core.workspace import Workspace

    ap = argparse.ArgumentParser(prog="python -m models.dataset_figures", description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path, help="a workspace folder (<paths.data>/<workspace>)")
    ap.add_argument("--out", type=Path, help="folder for the PNGs (default: the workspace's reports/)")
    a = ap.parse_args(argv)
    for what, path in write(Workspace(a.workspace), a.out).items():
        print(f"{what}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
