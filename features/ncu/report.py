"""Read .ncu-rep reports (NVIDIA's `ncu_report` package; no GPU needed) into rows.

Each profiled kernel launch becomes one row keyed by the record id of the NVTX range it
ran in (the harness names each range by its record); launches outside the pipeline's
domain are ignored. The per-record aggregate sums additive counters (`*.sum`: time,
bytes, instructions) over the record's kernels and takes the GPU-time-weighted mean of
everything else (rates, percentages, launch configuration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from features.ncu.metrics import TIME_METRIC, is_additive


@dataclass
class Report:
    rows: list[dict]  # record_id, kernel_index, kernel_name, <metric>: value
    units: dict[str, str] = field(default_factory=dict)  # metric -> ncu unit (e.g. nsecond, byte, %)
    string_metrics: set = field(default_factory=set)  # metrics whose values are text
    metrics: list[str] = field(default_factory=list)  # metric columns in order of first appearance


def record_of(action, domain: str) -> str | None:
    """The innermost push/pop range of `domain` around a profiled launch."""
    state = action.nvtx_state()
    if state is None:
        return None
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is not None and dom.name() == domain:
            ranges = list(dom.push_pop_ranges())
            return str(ranges[-1]) if ranges else None
    return None


def _value(metric):
    if metric is None or not metric.has_value():
        return None
    v = metric.value()
    if isinstance(v, (int, float)):
        return float(v)
    return v


def read(path: str, domain: str, metrics: list[str] | None = None) -> Report:
    """Rows of every launch in `domain`; `metrics` None = every metric in the report."""
    import ncu_report

    ctx = ncu_report.load_report(str(path))
    out = Report(rows=[])
    seen: dict[str, int] = {}
    order: dict[str, None] = dict.fromkeys(metrics or [])
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            rid = record_of(action, domain)
            if rid is None:
                continue
            row = {"record_id": rid, "kernel_index": seen.get(rid, 0), "kernel_name": str(action.name())}
            seen[rid] = row["kernel_index"] + 1
            names = list(metrics) if metrics else [str(n) for n in action.metric_names()]
            for name in names:
                m = action.metric_by_name(name)
                v = _value(m)
                row[name] = v
                order.setdefault(name, None)
                if m is not None and name not in out.units:
                    out.units[name] = str(m.unit())
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
