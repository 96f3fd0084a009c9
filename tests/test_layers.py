"""The layers of the code run one way: the data layer (pipeline/core) at the
bottom, the libraries (features/, models/) on it, the stages on top, each on its own."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGES = ("pipeline", "features", "models")


@functools.lru_cache(maxsize=None)
def modules(root: Path) -> list[tuple[Path, ast.AST]]:
    return [(f.relative_to(root), ast.parse(f.read_text(), str(f)))
            for package in PACKAGES for f in sorted((root / package).rglob("*.py"))]


def imports(root: Path) -> list[tuple[Path, int, str]]:
    """(file, line, module) of every import in the packages; `from a import b` counts as `a` and `a.b`."""
    out = []
    for rel, tree in modules(root):
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                out += [(rel, n.lineno, a.name) for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                out += [(rel, n.lineno, n.module)] + [(rel, n.lineno, f"{n.module}.{a.name}") for a in n.names]
    return out


def under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def libraries_importing_stages(root: Path) -> list[str]:
    return [f"{f}:{line}: {m}" for f, line, m in imports(root)
            if f.parts[0] in ("features", "models") and under(m, "pipeline.stages")]


def stages_importing_stages(root: Path) -> list[str]:
    """A stage module importing another stage (the registry, stages/__init__.py, imports them all)."""
    bad = []
    for f, line, m in imports(root):
        if f.parts[:2] == ("pipeline", "stages") and f.name != "__init__.py" and under(m, "pipeline.stages") \
                and m != "pipeline.stages" and not under(m, f"pipeline.stages.{f.stem}"):
            bad.append(f"{f}:{line}: {m}")
    return bad


def core_importing_upper_layers(root: Path) -> list[str]:
    return [f"{f}:{line}: {m}" for f, line, m in imports(root)
            if f.parts[:2] == ("pipeline", "core") and under(m, "features", "models", "pipeline.stages")]


def sys_path_edits(root: Path) -> list[str]:
    return [f"{rel}:{n.lineno}" for rel, tree in modules(root) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("insert", "append", "extend")
            and isinstance(n.value, ast.Attribute) and n.value.attr == "path"
            and getattr(n.value.value, "id", "") == "sys"]


RULES = {
    "features/ and models/ take data and return data; they never import a stage": libraries_importing_stages,
    "stages meet only through the workspace's tables; no stage imports another": stages_importing_stages,
    "pipeline/core imports nothing from features, models or the stages": core_importing_upper_layers,
    "packages import each other by name, never through sys.path edits": sys_path_edits,
}


@pytest.mark.parametrize("rule", list(RULES))
def test_layer_rule_holds(rule):
    bad = RULES[rule](ROOT)
    assert not bad, f"{rule}:\n" + "\n".join(bad)


def test_the_checks_find_what_they_forbid(tmp_path):
    files = {
        "pipeline/stages/replay.py": "from pipeline.stages.sample import draw_candidates\n",
        "pipeline/stages/measure.py": "from pipeline.stages import replay\nfrom pipeline.stages.measure import x\n",
        "pipeline/stages/__init__.py": "from pipeline.stages import measure, replay\n",
        "pipeline/core/harness.py": "import sys\nsys.path.insert(0, '.')\nfrom features.ncu import report\n",
        "features/static.py": "import pipeline.stages.collect\n",
        "models/tables.py": "from pipeline.core import schema\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert stages_importing_stages(tmp_path) == ["pipeline/stages/measure.py:1: pipeline.stages.replay",
                                                 "pipeline/stages/replay.py:1: pipeline.stages.sample",
                                                 "pipeline/stages/replay.py:1: pipeline.stages.sample.draw_candidates"]
    assert core_importing_upper_layers(tmp_path) == ["pipeline/core/harness.py:3: features.ncu",
                                                     "pipeline/core/harness.py:3: features.ncu.report"]
    assert libraries_importing_stages(tmp_path) == ["features/static.py:1: pipeline.stages.collect"]
    assert sys_path_edits(tmp_path) == ["pipeline/core/harness.py:2"]
