"""The entry point on real workspaces: bad settings refused before any data is touched,
Ctrl-C keeps finished rows and says how to resume, faults of the environment in one line,
sweeps that survive a failing job, the `pipeline` console script and its log file."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import failures
from pipeline.config import GRAMMAR, compose, override_errors, quoted, validate
from pipeline.core import schema as S
from pipeline.core.workspace import read_table

from conftest import ROOT, SMOKE_OVERRIDES, copy_workspace, pipeline_in_a_terminal


def start(args: list[str], *, cmd: list[str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([*(cmd or [sys.executable, "-m", "pipeline"]), *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def cli(args: list[str], timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    proc = start(args, **kw)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------ bad settings

BAD_SETTINGS = [
    (["budget.candidates_per_task=-1"], "budget.candidates_per_task=-1", "an integer >= 1"),
    (["budget.candidates_per_task=0"], "budget.candidates_per_task=0", "an integer >= 1"),
    (["budget.candidates_per_task=abc"], "budget.candidates_per_task='abc'", "an integer >= 1"),
    (["budget.max_tasks=-1"], "budget.max_tasks=-1", "or null (every task)"),
    (["sample.strategies=[nope]"], "sample.strategies=['nope']", "replay-trace, evolutionary"),
    (["jobs=-1"], "jobs=-1", "an integer >= 0"),
    (["shard.index=5", "shard.count=2"], "shard.index=5", "[0, 2)"),
    (["split.test_fraction=1.7"], "split.test_fraction=1.7", "a number in (0, 1)"),
    (["split.test_fraction=0.5", "split.val_fraction=0.6"], "split.test_fraction=0.5 + split.val_fraction=0.6",
     "sum must be < 1"),
    (["measure.timeout_s=0"], "measure.timeout_s=0", "a number > 0"),
    (["measure.repeat=0"], "measure.repeat=0", "an integer >= 1"),
    (["force=yes"], "force='yes'", "true or false"),
]


@pytest.mark.parametrize("overrides,shown,valid", BAD_SETTINGS, ids=[c[1] for c in BAD_SETTINGS])
def test_each_bad_setting_is_one_line_naming_key_value_and_range(overrides, shown, valid):
    bad = validate(compose(overrides))
    assert len(bad) == 1, bad
    assert bad[0].startswith(shown) and valid in bad[0]


def test_valid_settings_and_every_group_option_pass():
    for overrides in ([], ["budget.max_tasks=null"], ["budget=transfer", "executor=ray", "collect=ncu"],
                      ["split=by_network", "sample.strategies=[evolutionary,replay-trace]", "jobs=0"]):
        assert validate(compose(overrides)) == [], overrides


def test_bad_settings_are_refused_before_force_touches_the_workspace(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    ws, over = copy_workspace(root, overrides, tmp_path / "data", "lib")
    before = snapshot(ws)
    # every case at once, each its own process (the real entry point), with force=true
    procs = [(case, start(["stage=sample", "force=true", *over, *case[0], f"hydra.run.dir={tmp_path / str(i)}"]))
             for i, case in enumerate(BAD_SETTINGS)]
    for (_, shown, valid), proc in procs:
        out, err = proc.communicate(timeout=300)
        text = out + err
        assert proc.returncode == 2, text[-2000:]
        lines = [line for line in text.splitlines() if "bad setting" in line]
        assert len(lines) == 1 and shown in lines[0] and valid in lines[0], text[-2000:]
        assert "Traceback" not in text
    assert snapshot(ws) == before, "a refused run changed the workspace"


def test_an_unquoted_non_ascii_value_is_refused_with_the_quoting_that_reads_it(tmp_path):
    """Hydra's override grammar reads letters outside ASCII only in quoted values, and says so
    with a lexer trace and exit code 1: the entry point names the override and its quoted form,
    which works as given."""
    data = tmp_path / "dätä"
    out = cli(["stage=tasks", f"paths.data={data}", *SMOKE_OVERRIDES, f"hydra.run.dir={tmp_path / 'run'}"])
    fix = f"'paths.data=\"{data}\"'"
    assert out.returncode == 2 and (out.stdout + out.stderr).strip() == (
        f"bad setting paths.data={data}: Hydra's override grammar reads 'ä' only in a quoted value; write {fix} "
        f"(the outer quotes are the shell's)"), out.stdout + out.stderr
    assert not data.exists()
    out = cli(["stage=tasks", *shlex.split(fix), *SMOKE_OVERRIDES, f"hydra.run.dir={tmp_path / 'run'}"])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert len(list(data.glob("*/tasks.parquet"))) == 1
    # the items of a list or a sweep are quoted one by one, so it stays one
    assert quoted("dataset.ops=[GMM,ä]") == 'dataset.ops=[GMM,"ä"]'
    assert compose(['dataset.ops=[GMM,"ä"]']).dataset.ops == ["GMM", "ä"]
    assert quoted("paths.data=/a/ä,/b/ö") == 'paths.data="/a/ä","/b/ö"'
    # what quoting cannot mend is named with the grammar's page; readable overrides pass
    assert override_errors(["dätä=1"]) == [f"bad setting dätä=1: Hydra's override grammar cannot read 'ä' there "
                                           f"(see {GRAMMAR})"]
    assert override_errors(["-m", "stage=train", "model=lgbm,xgb", "paths.data=/a b", "--cfg", "job"]) == []


# ------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_during_replay_keeps_finished_rows_and_the_rerun_builds_the_rest(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    ws, over = copy_workspace(root, overrides, tmp_path / "data", "kernels", "lib", "measurements", "runner")
    # rows are written every 100 kernels or hour: the ones finished when Ctrl-C comes are still buffered
    args = [*over, "stage=replay", "jobs=1", "replay.flush_rows=100", "replay.flush_s=3600"]  # one worker: still running
    with pipeline_in_a_terminal([*args, f"hydra.run.dir={tmp_path / 'run'}"]) as proc:
        deadline = time.time() + 300
        while len(list((ws / "lib").glob("*.so"))) < 3:
            assert time.time() < deadline and proc.poll() is None, "replay built nothing"
            time.sleep(0.02)
        # The build worker is held where it is (on a fast machine the remaining builds would
        # otherwise finish before the Ctrl-C), so the Ctrl-C comes while the replay builds.
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers, "the replay runs no build worker process"
        for w in workers:  # a compiler the worker ran may have exited since it was listed
            with contextlib.suppress(psutil.NoSuchProcess):
                w.suspend()
        time.sleep(1.2)  # the driver has taken the first finished builds' rows (it looks every second)
        on_disk = read_table(ws / "kernels", S.KERNELS) if (ws / "kernels").exists() else []
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the process group
        for w in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.resume()
        out, err = proc.communicate(timeout=120)
    text = out + err
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "interrupted during stage=replay" in line]
    assert len(lines) == 1, text[-3000:]
    kept = read_table(ws / "kernels", S.KERNELS)
    cands = read_table(ws / "candidates", S.CANDIDATES).dropna(subset=["trace_json"])
    assert 2 <= len(kept) < len(cands) and kept["record_id"].is_unique
    assert len(kept) > len(on_disk), "the buffered finished rows were not written on Ctrl-C"
    assert f"kernels/ {len(kept)} rows" in lines[0]
    resume = lines[0].split("resume with `")[1].split("`")[0]
    assert resume.startswith("python -m pipeline stage=replay") and "jobs=1" in resume
    again = cli([*shlex.split(resume)[3:], f"hydra.run.dir={tmp_path / 'again'}"], timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"new {len(cands) - len(kept)}," in again.stdout
    assert set(read_table(ws / "kernels", S.KERNELS)["record_id"]) == set(cands["record_id"])


# ------------------------------------------------------------------ faults of the environment


def test_corrupt_parquet_part_is_named_with_the_stage_that_writes_it(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    ws, over = copy_workspace(root, overrides, tmp_path / "data", "runner")
    part = sorted((ws / "kernels").glob("part-*.parquet"))[0]
    part.write_bytes(b"not parquet at all")
    out = cli(["stage=replay", *over, f"hydra.run.dir={tmp_path / 'run'}"])
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"{part} is not a readable Parquet file" in text
    assert "delete it and re-run `python -m pipeline stage=replay`" in text


def test_corrupt_mlflow_database_is_named_with_the_fix(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"this is not a SQLite database" * 100)
    out = cli(["stage=compare", *overrides, f"mlflow.tracking_uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'run'}"])
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"the MLflow tracking database {db} is not a readable SQLite database" in text
    assert "mv mlflow.db mlflow.db.corrupt" in text


def test_unusable_paths_data_is_named(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    out = cli(["stage=tasks", f"paths.data={not_a_folder}", f"hydra.run.dir={tmp_path / 'run'}"])
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"cannot use {not_a_folder}" in text and "paths.data=" in text


def test_unwritable_paths_data_is_named(tmp_path):
    target = Path("/sys/pipeline-data")  # sysfs refuses new folders, even to root
    try:
        target.mkdir()
        target.rmdir()
        pytest.skip("/sys accepts new folders here")
    except PermissionError:
        pass
    out = cli(["stage=tasks", f"paths.data={target}", f"hydra.run.dir={tmp_path / 'run'}"])
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"cannot write {target}" in text and "set paths.data=<a writable folder>" in text


def test_a_full_disk_is_named_with_the_fix(tmp_path):
    """/dev/full answers every write with ENOSPC: the real error of a full disk."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    cfg = compose([f"paths.data={tmp_path}"])
    with pytest.raises(OSError) as plain:
        with open("/dev/full", "wb") as f:
            f.write(b"x" * 65536)
    with pytest.raises(OSError) as arrow:  # pyarrow's own error, as a part file write raises it
        pq.write_table(pa.table({"a": list(range(100000))}), "/dev/full")
    for exc in (plain.value, arrow.value):
        outcome = failures.explain(exc, cfg, "replay")
        assert outcome is not None and outcome.code == 1, exc
        assert outcome.message.startswith("no space left on the device holding")
        assert "re-run stage=replay afterwards (finished part files are kept)" in outcome.message
    assert plain.value.errno == errno.ENOSPC


# ------------------------------------------------------------------ sweeps, console script, logs


def test_a_failing_sweep_job_does_not_stop_the_others(measured_workspace, tmp_path):
    root, overrides = measured_workspace
    _, over = copy_workspace(root, overrides, tmp_path / "data", "runner")
    sweep = tmp_path / "sweep"
    # job 0 fails (a bad setting), job 1 runs (nothing left to build: it only checks)
    out = cli(["-m", "stage=replay", *over, "budget.candidates_per_task=0,8", f"hydra.sweep.dir={sweep}"])
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text
    assert "1 of 2 sweep jobs failed (the others ran): #0 (stage=replay" in text
    assert "budget.candidates_per_task=0" in text and "is not valid" in text
    assert (sweep / "0" / "FAILED").is_file() and not (sweep / "1" / "FAILED").exists()
    log = (sweep / "1" / "__main__.log").read_text()
    assert "replay   new 0," in log, "the summary is not in the job's log file"


def test_console_script_runs_the_entry_point_with_tab_completion(tmp_path):
    """The `pipeline` launcher that pip generates from pyproject.toml's [project.scripts]."""
    from pip._vendor.distlib.scripts import ScriptMaker

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["pipeline"]
    maker = ScriptMaker(None, str(tmp_path / "bin"), add_launchers=False)
    maker.executable, maker.variants = sys.executable, {""}
    (script,) = maker.make(f"pipeline = {spec}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    helped = cli(["--help"], cmd=[script], env=env)
    assert helped.returncode == 0 and "Usage: pipeline stage=<stage>" in helped.stdout
    installed = cli(["-sc", "install=bash"], cmd=[script], env=env)
    assert installed.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion pipeline" in \
        installed.stdout
    query = cli(["-sc", "query=bash"], cmd=[script], env=dict(env, COMP_LINE="pipeline sta", COMP_POINT="12"))
    assert "stage=" in query.stdout.split()
    query = cli(["-sc", "query=bash"], cmd=[script], env=dict(env, COMP_LINE="pipeline budget=", COMP_POINT="16"))
    assert {"budget=smoke", "budget=full"} <= set(query.stdout.split())
    refused = cli(["stage=sample", "jobs=-1", f"hydra.run.dir={tmp_path / 'run'}"], cmd=[script], env=env)
    assert refused.returncode == 2 and "bad setting jobs=-1 is not valid: an integer >= 0" in refused.stderr + \
        refused.stdout
