"""The one-screen summary printed at the end of a run."""

from __future__ import annotations

import textwrap

import pandas as pd

#: a stage's result key whose text is a statement about the run, printed in full on its own lines
NOTE = "note"
#: a stage's result key {"name": metric, "value": number}: the metric the run returns to a sweeper
OBJECTIVE = "objective"


def with_values(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`df` without the columns that hold no value in any row (NaN, None or an empty string),
    and their names: a table shows what was measured, and one line says what is missing."""
    def empty(col: pd.Series) -> bool:
        return bool(col.map(lambda v: v is None or (isinstance(v, float) and v != v) or
                            (isinstance(v, str) and not v.strip())).all())

    dropped = [c for c in df.columns if len(df) and empty(df[c])]
    return df.drop(columns=dropped), dropped


def summary_lines(cfg, results: dict[str, dict], wall_s: float) -> list[str]:
    lines = [f"workspace {cfg.workspace} ({cfg.paths.data}), wall time {wall_s:.1f} s"]
    for stage, counts in results.items():
        shown = ", ".join(f"{k} {v}" for k, v in counts.items() if k != NOTE and not isinstance(v, (dict, list)))
        lines.append(f"  {stage:<8} {shown}")
        if OBJECTIVE in counts:
            lines.append(f"{'':11}returned to sweepers: {counts[OBJECTIVE]['name']} = {counts[OBJECTIVE]['value']:.4g}")
        if counts.get(NOTE):
            lines += textwrap.wrap(f"NOTE: {counts[NOTE]}", width=96, initial_indent=" " * 11,
                                   subsequent_indent=" " * 17, break_on_hyphens=False, break_long_words=False)
    return lines


def print_summary(cfg, results: dict[str, dict], wall_s: float) -> None:
    lines = summary_lines(cfg, results, wall_s)
    width = max(len(line) for line in lines)
    print("=" * width)
    print("\n".join(lines))
    print("=" * width)
