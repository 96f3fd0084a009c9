"""The installable package: the wheel carries the configs and an installed `pipeline` composes
them through Hydra's `pkg://pipeline.conf`; what a run writes lands under the working folder (or
$PIPELINE_HOME), never under the folder the package is installed in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

from models import tracking
from pipeline import config
from pipeline.core import release as R
from pipeline.core.home import HOME_ENV, home
from pipeline.options import tracking_store, workspace_of

from conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "conf", "ncu_profiles", "pipeline", "features", "models")


def conf_files() -> set[str]:
    """Every config file of the checkout, as `pipeline/conf/...` (its place in the wheel)."""
    conf = ROOT / "conf"
    return {f"pipeline/conf/{p.relative_to(conf).as_posix()}" for p in conf.rglob("*")
            if p.is_file() and p.suffix in (".yaml", ".py") and "__pycache__" not in p.parts}


def test_pyproject_lists_every_package_and_config_group():
    """setuptools cannot map conf/ into a package found by `packages.find`, so the packages are
    listed by hand: a new subpackage or config group missing there would be left out of the wheel."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    code = set(find_packages(str(ROOT), include=["pipeline*", "features*", "models*"]))
    groups = {"pipeline.conf", "features.ncu.profiles"} | {f"pipeline.conf.{d.name}" for d in (ROOT / "conf").iterdir()
                                                           if d.is_dir() and d.name != "__pycache__"}
    assert listed == code | groups, (
        f"pyproject.toml [tool.setuptools] packages: add {sorted(code | groups - listed)}, "
        f"remove {sorted(listed - code - groups)}")
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"pipeline.conf": "conf",
                                                              "features.ncu.profiles": "ncu_profiles"}


def test_ci_wheel_smoke_copies_the_same_sources():
    """CI builds its wheel from the files .ci/wheel_smoke copies: a source the wheel needs and
    that copy leaves out fails only there, after the whole test suite."""
    script = (ROOT / ".ci" / "wheel_smoke").read_text()
    (line,) = [l for l in script.splitlines() if "git ls-files" in l and " -- " in l]
    copied = line.split(" -- ", 1)[1].split(")", 1)[0].split()
    assert copied == list(SOURCES), f".ci/wheel_smoke copies {copied}; the wheel is built from {list(SOURCES)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of the sources (a build writes build/ and *.egg-info
    next to pyproject.toml; the checkout stays as it is), with the venv's setuptools."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                          str(src), "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("tensor_cost_pipeline-*.whl")
    return whl


def test_wheel_carries_the_configs_and_the_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = conf_files() - names
    assert not missing, f"configs left out of the wheel: {sorted(missing)}"
    assert "pipeline/conf/config.yaml" in names and "pipeline/conf/budget/smoke.yaml" in names
    assert not any(n.startswith(("conf/", "tests/", "data/", "ncu_profiles/")) for n in names), "only the packages install"
    sections = {f"features/ncu/profiles/{p.name}" for p in (ROOT / "ncu_profiles").glob("*.section")}
    assert sections and sections <= names, "the ncu section files install with features.ncu"
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_installed_package_composes_from_pkg(wheel, tmp_path):
    """Installed (here: unpacked into a folder first on the path, as site-packages would hold it)
    and started from an empty folder, the configs come from `pkg://pipeline.conf`, a user's own
    config folder joins through `hydra.searchpath`, and every default path is under that folder."""
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                          "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    work = tmp_path / "work"
    (work / "mine" / "budget").mkdir(parents=True)
    (work / "mine" / "budget" / "tiny.yaml").write_text("name: tiny\nmax_tasks: 1\ncandidates_per_task: 2\n")
    script = f"""
from pipeline import config
from pipeline.options import tracking_store, workspace_of
assert config.conf_source() == "pkg://pipeline.conf", config.conf_source()
from features.ncu import sections
assert str(sections.folder()).startswith({str(site)!r}), sections.folder()
assert sections.folder_metrics() == list(sections.M.DEFAULT_METRICS)
assert str(config.CONF_DIR).startswith({str(site)!r}), config.CONF_DIR
cfg = config.compose(["budget=smoke"])
assert cfg.budget.name == "smoke"
print("WS", workspace_of(cfg).root)
print("URI", tracking_store(cfg).uri)
"""
    env = {k: v for k, v in os.environ.items() if k not in (HOME_ENV, "PYTHONPATH")} | {"PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"WS {work.resolve() / 'data' / 'ops-llvm'}" in out.stdout
    assert f"URI sqlite:///{work.resolve() / 'mlflow.db'}" in out.stdout
    out = subprocess.run([sys.executable, "-m", "pipeline", f"hydra.searchpath=[file://{work / 'mine'}]",
                          "budget=tiny", "--cfg", "job", "--package", "budget"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "name: tiny" in out.stdout and "candidates_per_task: 2" in out.stdout
    assert sorted(p.name for p in work.iterdir()) == ["mine"], "composing a config writes nothing"
    assert not (site / "mlflow.db").exists() and not (site / "data").exists()


def test_defaults_follow_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = config.compose([])
    assert home() == tmp_path
    assert workspace_of(cfg).root == tmp_path.resolve() / "data" / "ops-llvm"
    assert tracking_store(cfg).uri == tracking.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert tracking.artifact_root(tracking.tracking_uri()) == tmp_path.resolve() / "mlruns"
    assert tracking.artifact_root("http://mlflow.example:5000") == tmp_path / "mlruns"
    assert Path(cfg.paths.releases).resolve() == tmp_path.resolve() / "data" / "releases"
    assert Path(cfg.paths.ncu_profiles).resolve() == tmp_path.resolve() / "ncu_profiles"
    # Run from the checkout (`make run`), the checkout's own releases are still found.
    assert R.PROJECT_RELEASES in R.search_path() and (tmp_path / "data" / "releases") in R.search_path()


def test_pipeline_home_moves_every_default(tmp_path, monkeypatch):
    there = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(there))
    monkeypatch.chdir(tmp_path)
    cfg = config.compose([])
    assert workspace_of(cfg).root == there / "data" / "ops-llvm"
    assert tracking_store(cfg).uri == f"sqlite:///{there / 'mlflow.db'}"
    assert Path(cfg.paths.releases) == there / "data" / "releases"
    assert Path(cfg.paths.ncu_profiles) == there / "ncu_profiles"
    assert R.search_path()[0] == there / "data" / "releases"
    # An explicit setting still wins.
    cfg = config.compose([f"paths.data={tmp_path / 'elsewhere'}", "mlflow.tracking_uri=sqlite:////x/y.db"])
    assert workspace_of(cfg).root == tmp_path / "elsewhere" / "ops-llvm"
    assert tracking_store(cfg).uri == "sqlite:////x/y.db"


def test_checkout_reads_its_own_conf():
    assert config.conf_source() == str(ROOT / "conf")
    assert config.CONF_DIR == ROOT / "conf"


def test_a_missing_extra_names_the_extra(monkeypatch):
    """A feature whose optional package is absent stops with the extra to install, not a bare
    ImportError (the package hidden as an uninstalled one is: None in sys.modules)."""
    from pipeline.core.extras import MissingExtra, require
    from pipeline.compute.ray_executor import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtra, match=r"executor=ray needs the package 'ray'.*pip install "
                                           r"'tensor-cost-pipeline\[ray\]'"):
        import_ray()
    monkeypatch.setitem(sys.modules, "ncu_report", None)
    from features.ncu.report import _load

    with pytest.raises(MissingExtra, match=r"tensor-cost-pipeline\[cuda\]"):
        _load(Path("any.ncu-rep"))
    assert require("json", "x", "y") is sys.modules["json"]


def test_a_broken_optional_package_keeps_its_own_error(tmp_path, monkeypatch):
    """Installed but failing on an import of its own: that error is the one to read."""
    from pipeline.core.extras import require

    (tmp_path / "halfpkg").mkdir()
    (tmp_path / "halfpkg" / "__init__.py").write_text("import no_such_module_of_halfpkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_module_of_halfpkg"):
        require("halfpkg", "x", "y")


def test_an_installed_package_ignores_a_foreign_conf_beside_it(wheel, tmp_path):
    """site-packages may hold another project's top-level `conf/config.yaml`: an installed
    pipeline still reads its own `pkg://pipeline.conf`."""
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                          "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (site / "conf").mkdir()
    (site / "conf" / "config.yaml").write_text("stage: not-ours\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", "from pipeline import config; print(config.conf_source(), "
                          "config.compose([]).stage)"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["pkg://pipeline.conf", "all"]
