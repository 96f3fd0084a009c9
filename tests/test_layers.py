"""The floors of the code (docs/architecture.md) and the rule that imports run one way, down:
the device program and the TVM shims at the bottom, the data layer on them, compute on it,
the libraries, tuning, the stages and the entry point on top; no stage imports another."""

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


#: package (or module) -> floor; a module's floor is that of its longest matching name
FLOORS = {
    "pipeline.device": 0, "pipeline.shims": 0,  # the device program (no project import at all), TVM shims
    "pipeline.core": 1,  # the data layer
    "pipeline.compute": 2,  # executors, builder, progress
    "features": 3, "models": 3, "pipeline.workloads": 3, "pipeline.runner": 3, "pipeline.tenset": 3,  # libraries
    "pipeline.tuning": 4,
    "pipeline.stages": 5, "pipeline.options": 5, "pipeline.summary": 5,
    "pipeline": 6,  # the entry point: composing the config, dispatching, the console
}


def floor(module: str) -> tuple[str, int] | None:
    """(package, floor) of a project module, None for a module of another project."""
    found = [(p, f) for p, f in FLOORS.items() if under(module, p)]
    return max(found, key=lambda x: len(x[0])) if found else None


def imports_upward(root: Path) -> list[str]:
    """An import of a module on a higher floor than the importing one."""
    bad = []
    for f, line, m in imports(root):
        here, there = floor(".".join(f.with_suffix("").parts)), floor(m)
        if here and there and there[1] > here[1]:
            bad.append(f"{f}:{line}: {m} ({there[0]}, floor {there[1]} > {here[0]}, floor {here[1]})")
    return bad


def device_importing_the_project(root: Path) -> list[str]:
    """The device program is shipped alone: it imports no project module."""
    return [f"{f}:{line}: {m}" for f, line, m in imports(root)
            if f.parts[:2] == ("pipeline", "device") and floor(m) is not None]


def stages_importing_stages(root: Path) -> list[str]:
    """A stage module importing another stage (the registry, stages/__init__.py, imports them all;
    the config turned into typed options, `pipeline.options`, is beside the stages, not one of them)."""
    bad = []
    for f, line, m in imports(root):
        if f.parts[:2] == ("pipeline", "stages") and f.name != "__init__.py" and under(m, "pipeline.stages") \
                and m != "pipeline.stages" and not under(m, f"pipeline.stages.{f.stem}"):
            bad.append(f"{f}:{line}: {m}")
    return bad


def sys_path_edits(root: Path) -> list[str]:
    return [f"{rel}:{n.lineno}" for rel, tree in modules(root) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("insert", "append", "extend")
            and isinstance(n.value, ast.Attribute) and n.value.attr == "path"
            and getattr(n.value.value, "id", "") == "sys"]


RULES = {
    "imports run down the floors (FLOORS), never up": imports_upward,
    "the device program imports no project module (a bundle ships it alone)": device_importing_the_project,
    "stages meet only through the workspace's tables; no stage imports another": stages_importing_stages,
    "packages import each other by name, never through sys.path edits": sys_path_edits,
}


@pytest.mark.parametrize("rule", list(RULES))
def test_layer_rule_holds(rule):
    bad = RULES[rule](ROOT)
    assert not bad, f"{rule}:\n" + "\n".join(bad)


def test_the_checks_find_what_they_forbid(tmp_path):
    files = {
        "pipeline/stages/replay.py": "from pipeline.stages.sample import draw_candidates\n",
        "pipeline/stages/measure.py": "from pipeline.stages import replay\nfrom pipeline.stages.measure import x\n"
                                      "from pipeline.options import tracking_store\n",
        "pipeline/stages/__init__.py": "from pipeline.stages import measure, replay\n",
        "pipeline/device/harness.py": "import sys\nsys.path.insert(0, '.')\nfrom pipeline.shims import targets\n",
        "pipeline/core/workspace.py": "from pipeline.compute import executor\nfrom pipeline.shims import targets\n",
        "features/static.py": "import pipeline.stages.collect\n",
        "models/tables.py": "from pipeline.core import schema\nfrom features import static\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert stages_importing_stages(tmp_path) == ["pipeline/stages/measure.py:1: pipeline.stages.replay",
                                                 "pipeline/stages/replay.py:1: pipeline.stages.sample",
                                                 "pipeline/stages/replay.py:1: pipeline.stages.sample.draw_candidates"]
    assert sorted(b.split(" (")[0] for b in imports_upward(tmp_path)) == [
        "features/static.py:1: pipeline.stages.collect", "pipeline/core/workspace.py:1: pipeline.compute",
        "pipeline/core/workspace.py:1: pipeline.compute.executor"]
    assert device_importing_the_project(tmp_path) == ["pipeline/device/harness.py:3: pipeline.shims",
                                                      "pipeline/device/harness.py:3: pipeline.shims.targets"]
    assert sys_path_edits(tmp_path) == ["pipeline/device/harness.py:2"]


def test_every_project_package_has_a_floor():
    packages = {".".join(d.relative_to(ROOT).parts) for pkg in PACKAGES for d in [ROOT / pkg, *(ROOT / pkg).rglob("*")]
                if d.is_dir() and (d / "__init__.py").is_file() and "conf" not in d.relative_to(ROOT).parts}
    assert not [p for p in packages if floor(p) is None or (floor(p)[0] == "pipeline" and p != "pipeline")]
