"""The curated metric list (metrics.GROUPS) as Nsight Compute section files, one per group.

The files live in the project's top-level `ncu_profiles/` (installed as the package
`features.ncu.profiles`), so that by hand

    ncu --section-folder ncu_profiles --section regex:^tcp_ ./app

collects what `collect=ncu` collects, and the pipeline's own command line names the same
files (command.build_command). They are generated from metrics.GROUPS
(`python -m features.ncu.sections` writes them again); tests/test_ncu.py checks that the
files and the list agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from features.ncu import metrics as M

PACKAGE = "features.ncu.profiles"
CHECKOUT = Path(__file__).resolve().parents[2] / "ncu_profiles"
PREFIX = "tcp_"  # as the NVTX domain (command.NVTX_DOMAIN): the project's own sections
SUFFIX = ".section"
# Where the pipeline's sections come first in ncu's output (its own sections use 10-100).
FIRST_ORDER = 1000


def identifier(group: str) -> str:
    return f"{PREFIX}{group}"


def identifiers() -> list[str]:
    """The section identifiers of the curated list, in the list's order."""
    return [identifier(g) for g in M.GROUPS]


def render(group: str, names: tuple[str, ...], order: int) -> str:
    """One section file (protobuf text format, as the sections ncu ships): the group's
    metrics in its header, which ncu both collects and prints."""
    title = group.replace("_", " ")
    lines = [
        "# Generated from features/ncu/metrics.py (GROUPS) by `python -m features.ncu.sections`; do not edit.",
        f'Identifier: "{identifier(group)}"',
        f'DisplayName: "Cost model features: {title}"',
        f'Description: "The {title} metrics of the tensor-cost pipeline\'s curated ncu list (collect=ncu)."',
        f"Order: {order}",
        "Header {",
    ]
    for name in names:
        lines += ["  Metrics {", f'    Label: "{name}"', f'    Name: "{name}"', "  }"]
    return "\n".join(lines + ["}", ""])


def files() -> dict[str, str]:
    """File name -> text of every section file of the curated list."""
    return {f"{identifier(g)}{SUFFIX}": render(g, names, FIRST_ORDER + i)
            for i, (g, names) in enumerate(M.GROUPS.items())}


def read(text: str) -> tuple[str, list[str]]:
    """(identifier, metric names) of a section file's text."""
    ident = re.search(r'^Identifier:\s*"([^"]+)"', text, re.M)
    if not ident:
        raise ValueError("not a section file: no top-level Identifier")
    return ident.group(1), re.findall(r'^\s*Name:\s*"([^"]+)"', text, re.M)


def folder() -> Path:
    """The section folder: the checkout's ncu_profiles/, else the installed package's copy."""
    if (CHECKOUT.parent / "pyproject.toml").is_file() and any(CHECKOUT.glob(f"{PREFIX}*{SUFFIX}")):
        return CHECKOUT
    from importlib.resources import files as package_files

    return Path(str(package_files(PACKAGE)))


def folder_metrics(path: Path | None = None) -> list[str]:
    """Every metric the project's section files in `path` name, in section order."""
    out = []
    for ident in identifiers():
        file = Path(path or folder()) / f"{ident}{SUFFIX}"
        out += read(file.read_text())[1]
    return out


def covers(metrics) -> bool:
    """Whether `metrics` is the curated list, which the section files collect as a whole."""
    return metrics is not None and list(metrics) == list(M.DEFAULT_METRICS)


def write(path: Path) -> list[Path]:
    """Write the section files into `path` (a folder)."""
    path.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files().items():
        (path / name).write_text(text)
        out.append(path / name)
    return out


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else CHECKOUT):
        print(p)
