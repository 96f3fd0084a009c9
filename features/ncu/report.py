"""Read .ncu-rep reports (NVIDIA's `ncu_report` package; no GPU needed) into rows.

Each profiled kernel launch becomes one row keyed by the record id of the NVTX range it
ran in (the harness names each range by its record), or by None for a launch outside
the pipeline's domain (a report captured by anyone else); the collect stage keeps only
the launches with a record id. A curated metric that a report publishes under another
name (`metrics.ALIASES`) is read from there and stored under the curated name. The
per-record aggregate sums additive counters (`*.sum`: time, bytes, instructions) over the
record's kernels and takes the GPU-time-weighted mean of everything else (rates,
percentages, launch configuration).

`python -m features.ncu.report FILE... --out DIR` writes the kernel table of any report.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from features.ncu import command
from features.ncu.metrics import ALIASES, METRICS_ONLY, TIME_METRIC, is_additive, resolve
from pipeline.core.extras import require
from pipeline.core.schema import ncu_launches_schema
from pipeline.core.workspace import read_table, write_table

DEFAULT_DOMAIN = "<default domain>"  # ncu_report's name of NVTX's unnamed domain
DEVICE_METRIC = "device__attribute_display_name"
MAGIC = b"NVR\0"  # first bytes of every .ncu-rep


class ReportError(ValueError):
    """A file that is no readable Nsight Compute report; the message names it."""


@dataclass
class Report:
    rows: list[dict]  # record_id, kernel_index, kernel_name, launch_index, device, nvtx_ranges, <metric>: value
    units: dict[str, str] = field(default_factory=dict)  # metric -> ncu unit (e.g. ns, byte, %)
    string_metrics: set = field(default_factory=set)  # metrics whose values are text
    metrics: list[str] = field(default_factory=list)  # metric columns in order of first appearance
    sources: dict[str, str] = field(default_factory=dict)  # curated metric -> the name it was read from
    domains: set = field(default_factory=set)  # NVTX domains with push/pop ranges around some launch
    nvtx: bool = False  # captured with --nvtx (ncu recorded the NVTX state of launches)


def _domains(action) -> dict[str, list[str]] | None:
    """NVTX domain name -> push/pop ranges (outermost first) around a launch; None when
    the report was captured without --nvtx."""
    state = action.nvtx_state()
    if state is None:
        return None
    out = {}
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is not None:
            out[str(dom.name())] = [str(r) for r in dom.push_pop_ranges()]
    return out


def range_path(domains: dict[str, list[str]]) -> str | None:
    """`a/b` for the default domain, `dom@a/b` for a named one (ncu's --nvtx-include
    spelling), `; ` between domains."""
    parts = [("" if d == DEFAULT_DOMAIN else f"{d}@") + "/".join(r) for d, r in domains.items() if r]
    return "; ".join(parts) or None


def _value(metric):
    if metric is None or not metric.has_value():
        return None
    v = metric.value()
    if isinstance(v, (int, float)):
        return float(v)
    return v


def lookup(action, name: str):
    """(value, unit, source name) of `name` on a launch, through its alias when the report
    publishes it under another name; None when the report has neither."""
    m = action.metric_by_name(name)
    if m is not None and m.has_value():
        return _value(m), str(m.unit()), name
    alias = ALIASES.get(name)
    src = action.metric_by_name(alias.name) if alias else None
    if src is None or not src.has_value():
        return (None, str(m.unit()), name) if m is not None else None
    if alias.times is None:
        return _value(src), str(src.unit()), alias.name
    factor = action.metric_by_name(alias.times)
    rate, cycles = _value(src), _value(factor)
    if not (isinstance(rate, float) and isinstance(cycles, float)):
        return None
    unit, per = str(src.unit()), f"/{factor.unit()}"
    if not unit.endswith(per):
        return None  # not a rate per these cycles: no exact conversion
    return rate * cycles, unit[: -len(per)], f"{alias.name} x {alias.times}"


def _load(path: Path):
    # lazy: the NVIDIA package loads a native library, and only Nsight Compute's reports need it
    ncu_report = require("ncu_report", "cuda", "reading Nsight Compute reports (.ncu-rep)")

    if not path.is_file():
        raise ReportError(f"{path}: no such report file" if not path.exists() else f"{path}: not a file")
    with path.open("rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ReportError(f"{path}: not an Nsight Compute report (.ncu-rep files begin with {MAGIC!r})")
    try:
        return ncu_report.load_report(str(path))
    except Exception as e:  # noqa: BLE001 - ncu_report raises plain exceptions for unreadable files
        raise ReportError(f"{path}: ncu_report cannot read it ({type(e).__name__}: {e})") from e


def read(path: str, domain: str, metrics: list[str] | None = None) -> Report:
    """Rows of every launch (record_id None outside `domain`); `metrics` None = every
    metric in the report under its own name, else these names (through their aliases)."""
    path = Path(path)
    ctx = _load(path)
    out = Report(rows=[])
    seen: dict[str | None, int] = {}
    order: dict[str, None] = dict.fromkeys(metrics or [])
    launch = 0
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            names = list(metrics) if metrics else [str(n) for n in action.metric_names()]
            if action.name() is None or not names or len(action.metric_names()) == 0:
                raise ReportError(f"{path}: launch {launch} has no kernel name or no metric: the report is "
                                  "cut short or corrupt; profile again")
            domains = _domains(action)
            out.nvtx |= domains is not None
            domains = domains or {}
            out.domains |= {d for d, r in domains.items() if r}
            rid = domains[domain][-1] if domains.get(domain) else None  # the innermost range names the record
            device = action.metric_by_name(DEVICE_METRIC)
            row = {"record_id": rid, "kernel_index": seen.get(rid, 0), "kernel_name": str(action.name()),
                   "launch_index": launch, "device": None if device is None else str(device.value()),
                   "nvtx_ranges": range_path(domains)}
            seen[rid] = row["kernel_index"] + 1
            launch += 1
            for name in names:
                found = lookup(action, name)
                v = found[0] if found else None
                row[name] = v
                order.setdefault(name, None)
                if found and name not in out.units:
                    out.units[name] = found[1]
                if found and found[2] != name:
                    out.sources.setdefault(name, found[2])
                if isinstance(v, str):
                    out.string_metrics.add(name)
            out.rows.append(row)
    out.metrics = list(order)
    return out


def aggregate(rows: list[dict], metrics: list[str], string_metrics: set = frozenset()) -> list[dict]:
    """One row per record: n_kernels, kernel_names and each metric combined over kernels."""
    by_record: dict[str, list[dict]] = {}
    for r in rows:
        by_record.setdefault(r["record_id"], []).append(r)
    out = []
    for rid, ks in by_record.items():
        ks = sorted(ks, key=lambda r: r["kernel_index"])
        times = [r.get(TIME_METRIC) for r in ks]
        weights = times if all(isinstance(t, float) and t > 0 for t in times) else [1.0] * len(ks)
        row = {"record_id": rid, "n_kernels": len(ks), "kernel_names": ";".join(r["kernel_name"] for r in ks)}
        for m in metrics:
            vals = [r.get(m) for r in ks]
            if m in string_metrics:
                row[m] = next((v for v in vals if v is not None), None)
                continue
            pairs = [(v, w) for v, w in zip(vals, weights) if isinstance(v, float)]
            if not pairs:
                row[m] = None
            elif is_additive(m):
                row[m] = sum(v for v, _ in pairs)
            else:
                total = sum(w for _, w in pairs)
                row[m] = sum(v * w for v, w in pairs) / total if total > 0 else pairs[0][0]
        out.append(row)
    return out


# ----------------------------------------------------------------------------- command line


def no_domain_message(path, rep: Report, domain: str) -> str:
    """One line for a report none of whose launches ran in a range of `domain`."""
    found = (f"its ranges are in {', '.join(sorted(rep.domains))}" if rep.domains else
             "it has no NVTX range" if rep.nvtx else "it was captured without --nvtx")
    return (f"{path}: none of its {len(rep.rows)} launches ran in an NVTX range of domain {domain!r} ({found}); "
            f"they are written with record_id null. The pipeline captures with "
            f"`ncu --nvtx --nvtx-include \"{command.nvtx_filter(domain)}\"` (features/ncu/command.py); "
            f"--domain NAME reads another domain's ranges ({DEFAULT_DOMAIN!r} for unnamed ones)")


def null_reasons(rep: Report) -> dict[str, str]:
    """Metric column -> why it is null on every launch of the report."""
    out = {}
    for m in rep.metrics:
        if all(r.get(m) is None for r in rep.rows):
            out[m] = METRICS_ONLY.get(m, "not in this report")
            if m in METRICS_ONLY:
                out[m] = f"not in this report: {out[m]}; collect it with --metrics"
    return out


def write_launches(rep: Report, path: Path, report_name: str) -> Path:
    """The kernel table of one report: `ncu_launches_schema`, with ncu's units, the names
    aliased columns were read from and the reasons for all-null columns in the metadata."""
    strings = set(rep.string_metrics)
    rows = [dict(r, report=report_name, gpu_name=r["device"], hardware=r["device"],  # all a report says of its host
                 **{m: str(r[m]) for m in strings if r.get(m) is not None}) for r in rep.rows]
    schema = ncu_launches_schema(rep.metrics, frozenset(strings))
    meta = {b"pipeline.units": json.dumps(rep.units).encode(),
            b"pipeline.metric_sources": json.dumps(rep.sources).encode(),
            b"pipeline.null_reasons": json.dumps(null_reasons(rep)).encode()}
    return write_table(rows, schema.with_metadata({**schema.metadata, **meta}), path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m features.ncu.report",
        description="Write the kernel table (one row per profiled launch, Parquet) of Nsight Compute reports.")
    ap.add_argument("reports", nargs="+", type=Path, metavar="FILE", help=".ncu-rep reports")
    ap.add_argument("--out", type=Path, required=True, help="folder for <report name>.parquet")
    ap.add_argument("--domain", default=command.NVTX_DOMAIN,
                    help=f"NVTX domain whose innermost push/pop range names a launch's record_id (default "
                         f"{command.NVTX_DOMAIN!r}, the pipeline's; {DEFAULT_DOMAIN!r} for unnamed ranges)")
    ap.add_argument("--metrics", default="default",
                    help="`default`: the curated list of collect=ncu (aliases resolved); `all`: every metric of "
                         "the report under its own name; or a comma-separated list of ncu metric names")
    ap.add_argument("--plots", type=Path, metavar="FOLDER",
                    help="also draw <report name>_roofline.png and _stalls.png there (features/ncu/plots.py)")
    a = ap.parse_args(argv)
    metrics = None if a.metrics == "all" else resolve(a.metrics)
    failed, taken = 0, set()
    for path in a.reports:
        try:
            rep = read(path, a.domain, metrics)
        except ReportError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
            continue
        if not rep.rows:
            print(f"error: {path}: the report holds no kernel launch (ncu profiled nothing, or the file is "
                  "cut short); profile again", file=sys.stderr)
            failed += 1
            continue
        if not any(r["record_id"] for r in rep.rows):
            print(f"warning: {no_domain_message(path, rep, a.domain)}", file=sys.stderr)
        stem, n = path.stem, 1
        while stem in taken:
            n += 1
            stem = f"{path.stem}-{n}"
        taken.add(stem)
        out = write_launches(rep, a.out / f"{stem}.parquet", path.name)
        kernels = len({r["kernel_name"] for r in rep.rows})
        devices = ", ".join(sorted({r["device"] for r in rep.rows if r["device"]})) or "unknown"
        filled = sum(1 for m in rep.metrics if any(r.get(m) is not None for r in rep.rows))
        records = sum(1 for r in rep.rows if r["record_id"])
        print(f"{path}: launches {len(rep.rows)}, kernels {kernels}, device {devices}, in domain {a.domain!r} "
              f"{records}, metric columns with values {filled} of {len(rep.metrics)} -> {out}")
        if a.plots is not None:
            from features.ncu import plots

            for what, done in plots.write(read_table(out, None), a.plots, stem).items():
                print(f"  {what}: {done}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
