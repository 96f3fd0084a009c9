"""The report parser on real Nsight Compute reports captured by others on real GPUs
(../shared/fixtures/ncu-public: H100 `--set full`, A100 default sections, RTX 3070 with
NVTX ranges), and `python -m features.ncu.report`, which turns any report into the
kernel table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ncu_report
import pyarrow.parquet as pq
import pytest

from features.ncu import command, metrics, report
from pipeline.core.schema import ncu_launches_schema, ncu_schema

H100, A100, RTX = "h100-full-silu.ncu-rep", "a100-sgemm.ncu-rep", "rtx3070-nvtx-daxpy.ncu-rep"
# What SOURCES.md says each report holds: launches, kernel names, device.
PUBLIC = {
    H100: (3, {"silu_kernel_vector"}, "NVIDIA H100 PCIe"),
    A100: (11, {"sgemm_128x128x8_kernel"}, "NVIDIA A100-PCIE-40GB"),
    RTX: (3, {"init_data_kernel", "daxpy_kernel", "check_results_kernel"}, "NVIDIA GeForce RTX 3070"),
}
CAPTURE_FLAGS = f'--nvtx --nvtx-include "{command.nvtx_filter()}"'
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def public(shared_fixtures):
    folder = shared_fixtures / "ncu-public"
    if not folder.exists():
        pytest.skip(f"{folder} is absent (the public Nsight Compute reports of the shared fixtures)")
    return folder


@pytest.fixture(scope="module")
def h100(public):
    return report.read(public / H100, command.NVTX_DOMAIN, list(metrics.DEFAULT_METRICS))


@pytest.mark.parametrize("name", list(PUBLIC))
def test_public_reports_parse_into_rows(public, name):
    n, kernels, device = PUBLIC[name]
    rep = report.read(public / name, command.NVTX_DOMAIN, list(metrics.DEFAULT_METRICS))
    assert len(rep.rows) == n and {r["kernel_name"] for r in rep.rows} == kernels
    assert [r["launch_index"] for r in rep.rows] == list(range(n))
    assert {r["device"] for r in rep.rows} == {device}
    # None was captured by the pipeline: every launch is outside its domain, and kept.
    assert all(r["record_id"] is None for r in rep.rows)
    assert [r["kernel_index"] for r in rep.rows] == list(range(n))
    assert rep.units[metrics.TIME_METRIC] == "ns"
    assert all(r[metrics.TIME_METRIC] > 1000 for r in rep.rows)  # microseconds at least, in ns
    assert rep.metrics == list(metrics.DEFAULT_METRICS) and not rep.string_metrics


def test_every_metric_of_a_report_under_its_own_name(public):
    rep = report.read(public / RTX, command.NVTX_DOMAIN)
    assert len(rep.metrics) == 347 and "breakdown:sm__throughput.avg.pct_of_peak_sustained_elapsed" in rep.metrics
    assert report.DEVICE_METRIC in rep.string_metrics and rep.units["dram__cycles_elapsed.avg.per_second"] == "hz"
    assert not rep.sources  # names as the report has them: no alias is read


def test_nvtx_ranges_attribute_launches_to_their_ranges(public):
    rep = report.read(public / RTX, command.NVTX_DOMAIN, [metrics.TIME_METRIC])
    assert {r["kernel_name"]: r["nvtx_ranges"] for r in rep.rows} == {
        "init_data_kernel": "run_test/init_data", "daxpy_kernel": "run_test/daxpy",
        "check_results_kernel": "run_test/check_results"}
    assert rep.nvtx and rep.domains == {report.DEFAULT_DOMAIN}
    # Read with the report's own domain, the innermost range is the record.
    own = report.read(public / RTX, report.DEFAULT_DOMAIN, [metrics.TIME_METRIC])
    assert [(r["record_id"], r["kernel_name"], r["kernel_index"]) for r in own.rows] == [
        ("init_data", "init_data_kernel", 0), ("daxpy", "daxpy_kernel", 0), ("check_results", "check_results_kernel", 0)]
    agg = {r["record_id"]: r for r in report.aggregate(own.rows, own.metrics)}
    assert agg["daxpy"]["n_kernels"] == 1 and agg["daxpy"][metrics.TIME_METRIC] == own.rows[1][metrics.TIME_METRIC]
    # Without --nvtx there is no range path and no domain.
    a100 = report.read(public / A100, command.NVTX_DOMAIN, [metrics.TIME_METRIC])
    assert a100.nvtx and not a100.domains and all(r["nvtx_ranges"] is None for r in a100.rows)
    h100 = report.read(public / H100, command.NVTX_DOMAIN, [metrics.TIME_METRIC])
    assert not h100.nvtx


def test_curated_list_holds_against_the_h100_full_set(public, h100):
    """Every curated metric has a value on every launch of a `--set full` report, read
    directly or through its alias, unless it is one that only `--metrics` collects."""
    present = set(ncu_report.load_report(str(public / H100)).range_by_idx(0).action_by_idx(0).metric_names())
    for name in metrics.DEFAULT_METRICS:
        values = [r[name] for r in h100.rows]
        if name in metrics.METRICS_ONLY:
            assert name not in present and values == [None] * 3, f"{name} is in the report: drop it from METRICS_ONLY"
            assert (metrics.ALIASES.get(name) is None or metrics.ALIASES[name].name not in present)
        else:
            assert all(isinstance(v, float) for v in values), f"{name}: not in the report, no alias resolves it"
            assert (name in present) != (name in h100.sources), name  # an alias only where the name is absent
    assert set(h100.sources) == set(metrics.ALIASES) and set(metrics.ALIASES).isdisjoint(metrics.METRICS_ONLY)
    assert len(metrics.METRICS_ONLY) + len(metrics.ALIASES) == 14  # the curated names a full set lacks


def test_rates_convert_back_to_exact_counts(public, h100):
    """`.sum.per_cycle_elapsed` x `smsp__cycles_elapsed.avg` is the count: the report's own
    pair (sm__inst_executed rate x sm cycles = smsp__inst_executed.sum) shows the identity,
    and the FP instruction counts come out as integers."""
    ctx = ncu_report.load_report(str(public / H100))
    for i, row in enumerate(h100.rows):
        action = ctx.range_by_idx(0).action_by_idx(i)
        value = lambda n: action.metric_by_name(n).value()  # noqa: E731
        assert value("sm__inst_executed.sum.per_cycle_elapsed") * value("sm__cycles_elapsed.avg") == pytest.approx(
            value("smsp__inst_executed.sum"), rel=1e-12)
        for op in ("fadd", "fmul", "ffma", "dadd", "dmul", "dfma", "hfma"):
            count = row[f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum"]
            assert count == pytest.approx(round(count), abs=1e-6)
        # 2^24 threads (launch__thread_count) of 4 floats each: whole multiples of the 2^26 elements, no FP64.
        assert row["smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"] == pytest.approx(2 ** 26)
        assert row["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == pytest.approx(10 * 2 ** 26)
        assert row["smsp__sass_thread_inst_executed_op_dfma_pred_on.sum"] == 0
    assert h100.units["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == "inst"
    assert h100.sources["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == (
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum.per_cycle_elapsed x smsp__cycles_elapsed.avg")


def test_dram_throughput_alias_on_default_sections(public):
    name = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
    rep = report.read(public / A100, command.NVTX_DOMAIN, [name])
    source = ncu_report.load_report(str(public / A100)).range_by_idx(0).action_by_idx(0).metric_by_name(metrics.ALIASES[name].name)
    assert rep.rows[0][name] == source.value() and rep.units[name] == "%"
    assert rep.sources == {name: "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"}


class _Metric:
    def __init__(self, value, unit):
        self._value, self._unit = value, unit

    def has_value(self):
        return True

    def value(self):
        return self._value

    def unit(self):
        return self._unit


class _Launch:
    """A launch with chosen metrics: only to reach the unit check, which no real report
    in the fixtures fails."""

    def __init__(self, **metrics_):
        self.metrics = metrics_

    def metric_by_name(self, name):
        return self.metrics.get(name)


def test_a_rate_converts_only_when_its_units_cancel():
    name = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
    rate, cycles = metrics.ALIASES[name].name, metrics.ALIASES[name].times
    ok = _Launch(**{rate: _Metric(2.0, "inst/cycle"), cycles: _Metric(3.0, "cycle")})
    assert report.lookup(ok, name) == (6.0, "inst", f"{rate} x {cycles}")
    assert report.lookup(_Launch(**{rate: _Metric(2.0, "inst/second"), cycles: _Metric(3.0, "cycle")}), name) is None
    assert report.lookup(_Launch(**{rate: _Metric(2.0, "inst/cycle")}), name) is None
    assert report.lookup(_Launch(**{name: _Metric(5, "inst"), rate: _Metric(2.0, "inst/cycle")}), name) == (
        5.0, "inst", name)  # the curated name wins


def test_command_line_writes_the_kernel_table_of_any_report(public, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main([str(public / n) for n in PUBLIC] + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    for name, (n, kernels, device) in PUBLIC.items():
        line = next(x for x in err.splitlines() if name in x)
        assert "record_id null" in line and CAPTURE_FLAGS in line and "--domain" in line
        path = out / name.replace(".ncu-rep", ".parquet")
        table = pq.read_table(path)
        assert table.num_rows == n and table.schema.names == ncu_launches_schema(list(metrics.DEFAULT_METRICS)).names
        meta = table.schema.metadata
        assert json.loads(meta[b"pipeline.units"])[metrics.TIME_METRIC] == "ns"
        assert meta[b"pipeline.table"] == b"ncu_launches"
        df = table.to_pandas()
        assert df["record_id"].isna().all() and set(df["kernel_name"]) == kernels and set(df["device"]) == {device}
        assert (df["report"] == name).all() and (df[metrics.TIME_METRIC] > 0).all()
    # The H100 full set: only the metrics that `--metrics` alone collects are null.
    meta = pq.read_schema(out / "h100-full-silu.parquet").metadata
    assert set(json.loads(meta[b"pipeline.null_reasons"])) == set(metrics.METRICS_ONLY)
    assert set(json.loads(meta[b"pipeline.metric_sources"])) == set(metrics.ALIASES)
    # The collect tables' columns are a subset: one reader for both.
    assert set(ncu_schema("k", list(metrics.DEFAULT_METRICS)).names) <= set(pq.read_schema(out / "a100-sgemm.parquet").names)


def test_command_line_reads_another_domain(public, tmp_path, capsys):
    assert report.main([str(public / RTX), "--out", str(tmp_path), "--domain", report.DEFAULT_DOMAIN,
                        "--metrics", f"{metrics.TIME_METRIC},launch__grid_size"]) == 0
    assert "warning" not in capsys.readouterr().err
    df = pq.read_table(tmp_path / "rtx3070-nvtx-daxpy.parquet").to_pandas()
    assert list(df["record_id"]) == ["init_data", "daxpy", "check_results"]
    assert list(df.columns[-3:]) == [metrics.TIME_METRIC, "launch__grid_size", "error"]


def test_bad_files_are_named_and_the_others_still_written(public, tmp_path):
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes((public / RTX).read_bytes()[:50_000])
    text = tmp_path / "notes.ncu-rep"
    text.write_text("not a report\n")
    missing = tmp_path / "missing.ncu-rep"
    for path, says in ((missing, "no such report file"), (text, "not an Nsight Compute report"),
                       (cut, "cut short or corrupt"), (tmp_path, "not a file")):
        with pytest.raises(report.ReportError, match=says) as e:
            report.read(path, command.NVTX_DOMAIN, [metrics.TIME_METRIC])
        assert str(path) in str(e.value)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "features.ncu.report", str(missing), str(public / RTX), str(cut),
                           "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    assert f"error: {missing}: no such report file" in proc.stderr and f"error: {cut}:" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["rtx3070-nvtx-daxpy.parquet"]


def test_collect_tables_from_real_report_rows(public, tmp_path):
    """What the collect stage writes from a real report's rows (read with the report's own
    domain, so that its launches have record ids): ncu's units, extra row keys dropped."""
    from features.ncu import profile
    from pipeline.core.catalog import ncu_tables
    from pipeline.core.workspace import Workspace, read_table

    cols = list(metrics.DEFAULT_METRICS)
    rep = report.read(public / RTX, report.DEFAULT_DOMAIN, cols)
    part = profile.Outcome(kernels=[r for r in rep.rows if r["record_id"]], errors={}, units=rep.units)
    jobs = [{"record_id": r["record_id"], "task_id": "t"} for r in rep.rows]
    ws = Workspace(tmp_path)
    with ws.sink(0, "rtx3070") as write:
        assert profile.write_outcome(part, jobs, ncu_tables(), cols, write) == (3, 0)
    rec, ker = ws.path("ncu", "rtx3070"), ws.path("ncu_kernels", "rtx3070")
    per_record = read_table(rec, metrics.NCU).set_index("record_id")
    assert per_record.loc["daxpy", metrics.TIME_METRIC] == rep.rows[1][metrics.TIME_METRIC]
    assert per_record.loc["daxpy", "kernel_names"] == "daxpy_kernel"
    assert list(read_table(ker, metrics.NCU_KERNELS).columns) == metrics.NCU_KERNELS.names
    meta = pq.read_schema(next(rec.glob("*.parquet"))).metadata
    assert json.loads(meta[b"pipeline.units"])[metrics.TIME_METRIC] == "ns"
