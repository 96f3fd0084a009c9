"""Nsight Compute side: command line, harness, isolation logic and report parser.

Everything except the profiling itself runs without a GPU. The parser runs on every real
report under tests/fixtures/ncu/ and the shared fixtures' ncu-public/ (none is made up here:
a .ncu-rep can only come from ncu on a GPU); the end-to-end test needs a GPU and ncu.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_FIXTURES
from features.ncu import command, metrics, profile, report, sections
from pipeline.options import profiler_settings, workspace_of

# Reports the pipeline captured (tests/fixtures/ncu/, none yet) and the public reports of
# the shared fixtures, read where they are.
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ncu"
REPORTS = sorted(p for folder in (FIXTURES, SHARED_FIXTURES / "ncu-public") if folder.exists()
                 for p in folder.glob("*.ncu-rep"))


def test_command_with_metric_list():
    cmd = command.build_command(["python", "h.py", "--manifest", "m.json"], "/r/b.ncu-rep", ncu="/opt/ncu",
                                metrics=["gpu__time_duration.sum", "dram__bytes_read.sum"],
                                clock_control="none", cache_control="all")
    assert cmd[0] == "/opt/ncu" and cmd[-4:] == ["python", "h.py", "--manifest", "m.json"]
    opts = dict(zip(cmd, cmd[1:]))
    assert opts["--export"] == "/r/b.ncu-rep" and "--force-overwrite" in cmd
    assert "--nvtx" in cmd and opts["--nvtx-include"] == f"regex:{command.NVTX_DOMAIN}@.+/"
    assert opts["--clock-control"] == "none" and opts["--cache-control"] == "all"
    assert opts["--metrics"] == "gpu__time_duration.sum,dram__bytes_read.sum" and "--set" not in cmd


def test_command_with_section_set_and_bad_values():
    cmd = command.build_command(["x"], "b.ncu-rep", section_set="full", extra_args=["--target-processes", "all"])
    assert cmd[cmd.index("--set") + 1] == "full" and "--metrics" not in cmd
    assert cmd[-3:] == ["--target-processes", "all", "x"]
    with pytest.raises(ValueError, match="clock_control"):
        command.build_command(["x"], "b.ncu-rep", metrics=["a"], clock_control="boost")
    with pytest.raises(ValueError, match="cache_control"):
        command.build_command(["x"], "b.ncu-rep", metrics=["a"], cache_control="some")
    with pytest.raises(ValueError, match="not both"):
        command.build_command(["x"], "b.ncu-rep", metrics=["a"], section_set="full")
    with pytest.raises(ValueError, match=".ncu-rep"):
        command.build_command(["x"], "b.rep", metrics=["a"])


def test_section_files_hold_the_curated_list():
    """ncu_profiles/ is what metrics.GROUPS generates, file for file: the sections collect
    exactly the curated list, one section per group, in the list's order."""
    folder = sections.folder()
    assert folder == sections.CHECKOUT
    on_disk = {p.name: p.read_text() for p in folder.glob("*.section")}
    assert on_disk == sections.files(), "ncu_profiles/ drifted from metrics.GROUPS: run python -m features.ncu.sections"
    assert sections.folder_metrics(folder) == list(metrics.DEFAULT_METRICS)
    for name, text in on_disk.items():
        ident, names = sections.read(text)
        assert name == f"{ident}.section" and names == list(metrics.GROUPS[ident[len(sections.PREFIX):]])
        # the protobuf text format of ncu's own sections: a header table of Label / Name pairs
        assert text.count("Metrics {") == len(names) and "\nHeader {\n" in text and "\nOrder: " in text


def test_command_collects_the_curated_list_through_the_section_files(tmp_path):
    cmd = command.build_command(["x"], "b.ncu-rep", metrics=list(metrics.DEFAULT_METRICS))
    assert "--metrics" not in cmd and cmd[cmd.index("--section-folder") + 1] == str(sections.folder())
    named = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--section"]
    assert named == sections.identifiers()
    assert sections.folder_metrics(Path(cmd[cmd.index("--section-folder") + 1])) == list(metrics.DEFAULT_METRICS)
    # what `collect=ncu` builds from its config: the same files
    from pipeline.config import compose

    opts = profiler_settings(compose(["collect=ncu", "target=h100", f"paths.data={tmp_path}"])).ncu
    assert sections.covers(opts.metrics)
    # another folder (a bundle's), and a list the device cut short or of one's own: --metrics
    cmd = command.build_command(["x"], "b.ncu-rep", metrics=list(metrics.DEFAULT_METRICS), section_folder="{part}/s")
    assert cmd[cmd.index("--section-folder") + 1] == "{part}/s"
    short = list(metrics.DEFAULT_METRICS)[1:]
    cmd = command.build_command(["x"], "b.ncu-rep", metrics=short)
    assert "--section" not in cmd and cmd[cmd.index("--metrics") + 1] == ",".join(short)


def test_default_metric_list():
    names = metrics.DEFAULT_METRICS
    assert len(names) == len(set(names)) and metrics.TIME_METRIC in names
    assert {"time", "throughput", "memory", "cache", "occupancy", "launch", "instructions", "stalls",
            "bank_conflicts"} <= set(metrics.GROUPS)
    assert sum("warps_issue_stalled" in n for n in names) == len(metrics.STALL_REASONS)
    assert metrics.resolve("default") == list(names)
    assert metrics.resolve(["a.sum", "b", "a.sum"]) == ["a.sum", "b"]
    with pytest.raises(ValueError):
        metrics.resolve([])


def test_aggregate_sums_counters_and_weights_rates_by_time():
    rows = [
        {"record_id": "r", "kernel_index": 0, "kernel_name": "main_kernel", "gpu__time_duration.sum": 1000.0,
         "dram__bytes_read.sum": 10.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 80.0, "x.str": "a"},
        {"record_id": "r", "kernel_index": 1, "kernel_name": "main_kernel_1", "gpu__time_duration.sum": 3000.0,
         "dram__bytes_read.sum": 30.0, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 40.0, "x.str": "b"},
        {"record_id": "q", "kernel_index": 0, "kernel_name": "main_kernel", "gpu__time_duration.sum": 5.0,
         "dram__bytes_read.sum": None, "sm__throughput.avg.pct_of_peak_sustained_elapsed": 10.0, "x.str": None},
    ]
    cols = ["gpu__time_duration.sum", "dram__bytes_read.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "x.str"]
    out = {r["record_id"]: r for r in report.aggregate(rows, cols, {"x.str"})}
    r = out["r"]
    assert r["n_kernels"] == 2 and r["kernel_names"] == "main_kernel;main_kernel_1"
    assert r["gpu__time_duration.sum"] == 4000.0 and r["dram__bytes_read.sum"] == 40.0
    assert r["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(50.0)
    assert r["x.str"] == "a"
    assert out["q"]["dram__bytes_read.sum"] is None and out["q"]["x.str"] is None


def test_settle_isolates_crash_hang_and_lost_reports():
    batch = ["a", "b", "c", "d"]
    # c crashed the process while running: a, b done and profiled; d never started.
    acc, err, retry = profile.settle(batch, ["a", "b", "c"], {"a": None, "b": None}, {"a", "b"}, True,
                                     "crashed: signal SIGSEGV", {})
    assert acc == ["a", "b"] and err == {"c": "crashed: signal SIGSEGV"} and retry == ["d"]
    # b raised in the harness: an error row, the others go on.
    acc, err, retry = profile.settle(batch, batch, {k: None for k in batch} | {"b": "TVMError: x"},
                                     {"a", "c", "d"}, True, None, {})
    assert acc == ["a", "c", "d"] and err == {"b": "under ncu: TVMError: x"} and retry == []
    # A hang: ncu was killed, no report: the kernels that finished run again once, the
    # one that hung is an error.
    tries: dict = {}
    acc, err, retry = profile.settle(batch, ["a", "b"], {"a": None}, set(), False, "timeout: killed", tries)
    assert acc == [] and err == {"b": "timeout: killed"} and retry == ["a", "c", "d"]
    acc, err, retry = profile.settle(["a"], ["a"], {"a": None}, set(), False, "timeout", {"a": 1})
    assert err == {"a": "ncu wrote no report (timeout)"} and retry == []
    # Done, report written, but no launch in its range: an error, not an endless retry.
    acc, err, retry = profile.settle(["a"], ["a"], {"a": None}, set(), True, None, {})
    assert "no kernel launch" in err["a"] and retry == []


def test_errors_that_no_retry_fixes():
    with pytest.raises(profile.NcuError, match="NVreg_RestrictProfilingToAdminUsers=0"):
        profile.check_output("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA "
                             "GPU Performance Counters on the target device 0.")
    with pytest.raises(profile.NcuError, match="collect.ncu.executable"):
        profile.find_ncu("/nonexistent/ncu")
    text = "==PROF== Connected\n==ERROR== Failed to find metric regex:^sm__nope.sum$\n"
    assert profile.unknown_metrics(text, ["sm__nope.sum", "gpu__time_duration.sum", "sm__nope"]) == ["sm__nope.sum"]


def test_harness_runs_kernels_in_one_process_on_cpu(measured_workspace, tmp_path):
    """The command that ncu runs, for real without ncu, on llvm kernels (NVTX ranges are
    no-ops without a profiler): events in the file that `settle` reads."""
    from pipeline.config import compose

    root, over = measured_workspace
    ws = workspace_of(compose(over))
    kernels = ws.read("kernels")
    kernels = kernels[kernels["error"].isna()].head(2)
    tasks = ws.read("tasks").set_index("task_id")
    jobs = [{"record_id": r.record_id, "artifact": r.artifact, "args": json.loads(tasks.loc[r.task_id, "args_json"])}
            for r in kernels.itertuples()]
    jobs.insert(1, {"record_id": "missing", "artifact": "lib/missing.so", "args": []})
    jobs_file, progress = tmp_path / "jobs.jsonl", tmp_path / "p.jsonl"
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    cmd = profile.harness_command(sys.executable, jobs_file, progress, ws.root, profile.Options(device="cpu"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    started, done, host = profile.read_progress(progress)
    assert started == [j["record_id"] for j in jobs]
    assert host["hardware"] and host["cpu_count"] and host["gpu_name"] is None  # where they ran: this CPU
    assert done[jobs[0]["record_id"]] is None and done[jobs[2]["record_id"]] is None
    assert "missing.so" in done["missing"]
    # A second run resumes: nothing left to do.
    proc = subprocess.run(cmd, capture_output=True, timeout=300)
    assert proc.returncode == 0 and profile.read_progress(progress)[0] == started


@pytest.mark.parametrize("path", REPORTS or [None], ids=[p.name for p in REPORTS] or ["no-report"])
def test_parse_real_reports(path):
    """Every real report: its launches in order, each with a kernel name and a run time, and
    one aggregate per record whose time is the sum of its kernels'. A report is read in the
    pipeline's NVTX domain where it has ranges there, else in the domain it has (the public
    reports were captured by others), so that launches are attributed to records."""
    if path is None:
        pytest.skip(f"no .ncu-rep under {FIXTURES} or {SHARED_FIXTURES / 'ncu-public'}")
    found = report.read(str(path), command.NVTX_DOMAIN, [metrics.TIME_METRIC])
    domain = command.NVTX_DOMAIN if command.NVTX_DOMAIN in found.domains or not found.domains else \
        sorted(found.domains)[0]
    rep = report.read(str(path), domain)
    assert rep.rows and [r["launch_index"] for r in rep.rows] == list(range(len(rep.rows)))
    for row in rep.rows:
        assert row["kernel_name"] and row[metrics.TIME_METRIC] > 0
        assert bool(row["record_id"]) == bool(rep.domains), row  # a record exactly where there are ranges
    agg = report.aggregate(rep.rows, rep.metrics, rep.string_metrics)
    assert {r["record_id"] for r in agg} == {r["record_id"] for r in rep.rows}
    assert sum(r["n_kernels"] for r in agg) == len(rep.rows)
    for a in agg:
        times = [r[metrics.TIME_METRIC] for r in rep.rows if r["record_id"] == a["record_id"]]
        assert a[metrics.TIME_METRIC] == pytest.approx(sum(times))


H200_CURATED = sorted(FIXTURES.glob("h200-curated-*.ncu-rep"))


@pytest.mark.parametrize("path", H200_CURATED, ids=[p.name for p in H200_CURATED])
def test_h200_harness_reports_hold_every_curated_metric(path):
    """Reports the part runner's harness wrote under ncu on an H200 (the project's section
    files, its NVTX domain): one range per record, every curated metric with a value on every
    kernel, and the GPU named; what collect.mode=import reads from a GPU host."""
    rep = report.read(str(path), command.NVTX_DOMAIN)
    assert rep.domains == {command.NVTX_DOMAIN}
    assert {r["device"] for r in rep.rows} == {"NVIDIA H200"}
    assert all(r["nvtx_ranges"] == f"{command.NVTX_DOMAIN}@{r['record_id']}" for r in rep.rows)
    missing = [m for m in metrics.DEFAULT_METRICS if any(r.get(m) is None for r in rep.rows)]
    assert not missing, missing
    assert len({r["record_id"] for r in rep.rows}) == len(rep.rows) >= 2
    full = report.read(str(FIXTURES / "h200-full-set-1-kernel.ncu-rep"), command.NVTX_DOMAIN)
    assert len(full.metrics) > 4 * len(rep.metrics)  # `--set full`: what the curated list leaves out


@pytest.mark.gpu
def test_ncu_end_to_end_on_gpu(tmp_path):
    """Build a tiny CUDA workspace, profile it with ncu in one invocation, read the tables."""
    if shutil.which("ncu") is None:
        pytest.skip("ncu is not installed")
    from pipeline.config import compose, run_stage
    from pipeline.core.workspace import read_table

    over = [f"paths.data={tmp_path}", f"paths.ncu_profiles={tmp_path / 'ncu'}", "target=h100",
            "dataset.ops=[GMM,SFM]", "dataset.configs=[0]", "budget=smoke", "budget.candidates_per_task=2",
            "collect=ncu"]
    for stage in ("tasks", "sample", "replay", "collect"):
        out = run_stage(stage, over)
    assert out["ncu"] + out["ncu_errors"] == 4 and out["ncu_invocations"] >= 1
    ws = workspace_of(compose(over))
    per_record = read_table(ws.features / "ncu" / "device=h100")
    ok = per_record[per_record["error"].isna()]
    assert len(ok) >= 1 and (ok[metrics.TIME_METRIC] > 0).all()
    assert list((tmp_path / "ncu").rglob("*.ncu-rep"))


def test_ncu_tables_written_from_an_outcome(tmp_path):
    """What the collect stage writes for one invocation's outcome (rows as the parser gives them)."""
    import pyarrow.parquet as pq

    from pipeline.core.workspace import Workspace, read_table

    cols = list(metrics.DEFAULT_METRICS)
    kernels = [dict({c: 1.0 for c in cols}, record_id="r1", kernel_index=i, kernel_name=f"main_kernel_{i}")
               for i in range(2)]
    part = profile.Outcome(kernels=kernels, errors={"r2": "crashed: signal SIGSEGV"},
                           units={metrics.TIME_METRIC: "nsecond"},
                           dropped_metrics={"sm__maximum_warps_per_active_cycle_pct": "unknown on this device"})
    jobs = [{"record_id": "r1", "task_id": "t"}, {"record_id": "r2", "task_id": "t"}]
    ws = Workspace(tmp_path)
    tables = profile.NcuProfiler(profile.Options(), tmp_path / "reports").tables()
    with ws.sink(0, "h100") as write:
        assert profile.write_outcome(part, jobs, tables, cols, write) == (1, 1)
    rec, ker = ws.path("ncu", "h100"), ws.path("ncu_kernels", "h100")
    assert rec == tmp_path / "features" / "ncu" / "device=h100"
    per_record = read_table(rec, metrics.NCU).set_index("record_id")
    assert per_record.loc["r1", "n_kernels"] == 2 and per_record.loc["r1", metrics.TIME_METRIC] == 2.0
    assert per_record.loc["r1", "sm__throughput.avg.pct_of_peak_sustained_elapsed"] == 1.0
    assert per_record.loc["r2", "error"].startswith("crashed") and np.isnan(per_record.loc["r2", metrics.TIME_METRIC])
    per_kernel = read_table(ker, metrics.NCU_KERNELS)
    assert len(per_kernel) == 3 and set(per_kernel["kernel_index"].dropna()) == {0, 1}
    meta = pq.read_schema(next(rec.glob("*.parquet"))).metadata
    assert json.loads(meta[b"pipeline.units"])[metrics.TIME_METRIC] == "nsecond"
    assert "sm__maximum_warps_per_active_cycle_pct" in json.loads(meta[b"pipeline.null_reasons"])
    assert list(read_table(rec, metrics.NCU).columns) == metrics.NCU.names
