"""The one-screen summary printed at the end of a run."""

from __future__ import annotations


def print_summary(cfg, results: dict[str, dict], wall_s: float) -> None:
    lines = [f"workspace {cfg.workspace} ({cfg.paths.data}), wall time {wall_s:.1f} s"]
    for stage, counts in results.items():
        shown = ", ".join(f"{k} {v}" for k, v in counts.items() if not isinstance(v, (dict, list)))
        lines.append(f"  {stage:<8} {shown}")
    width = max(len(l) for l in lines)
    print("=" * width)
    print("\n".join(lines))
    print("=" * width)
