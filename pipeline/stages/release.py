"""stage=release: the workspace as a dataset release, or trained models as model releases.

    python -m pipeline stage=release dataset=zoo_ops budget=transfer release.version=1
    python -m pipeline stage=release dataset=zoo_ops budget=transfer release.dataset=false \\
        'release.models=[models:/<registered>@best]'

A dataset release (`<paths.releases>/<dataset>-<target>-<hardware>-v<version>/`, see
pipeline/core/release.py) carries the tables, the MetaSchedule database, a manifest and
DATASET.md. Before packing, the tuning records are made to agree with the tables
(`database.sync_records`), so every record carries its latest run times. A model release
(`<training release>-<model>-<held out>`) carries the run's MLflow model folder, a manifest
and MODEL.md with the run's evaluation and its spread over the seeds of the same split.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from pipeline.core import database as D
from pipeline.core import release as R
from pipeline.core.workspace import Workspace
from pipeline.options import workspace_of

log = logging.getLogger(__name__)

LICENCE = "Apache-2.0"
NOISE_REPORT = "reports/measurement_noise.json"  # written by benchmarks/measurement_noise.py


def timing_of(meas: pd.DataFrame) -> dict:
    """How the labels were taken: repeats, calls per repeat, cache flush, rounds, and the
    host's load average while timing (null where older rows lack the column)."""
    ok = meas[meas["error"].isna()]
    load = ok["load_avg"].dropna() if "load_avg" in ok else pd.Series(dtype=float)
    cpus = ok["cpu_count"].dropna() if "cpu_count" in ok else pd.Series(dtype=float)

    def values(col):
        vals = sorted({v for v in ok[col].dropna().tolist()}) if col in ok else []
        return [int(v) if isinstance(v, float) and v.is_integer() else v for v in vals]

    busy = int((load > cpus.reindex(load.index)).sum()) if len(load) and len(cpus) else None
    return {"repeats": values("repeats"), "number": values("number"), "cache_flush": values("cache_flush"),
            "rounds": values("rounds"), "load_avg_min": round(float(load.min()), 2) if len(load) else None,
            "load_avg_max": round(float(load.max()), 2) if len(load) else None, "timed_while_busy": busy}


def failures_of(ws: Workspace) -> dict:
    cands = ws.read("candidates", columns=["record_id", "error"])
    kernels = ws.read("kernels", columns=["record_id", "error"])
    meas = ws.read("measurements", columns=["record_id", "error", "checked", "correct"])
    meas = meas.drop_duplicates("record_id", keep="last")
    kinds = meas["error"].dropna().str.split(":").str[0].str.strip().value_counts().to_dict()
    return {"sample_errors": int(cands["error"].notna().sum()), "build_errors": int(kernels["error"].notna().sum()),
            "measure_errors": int(meas["error"].notna().sum()), "measure_error_kinds": kinds,
            "checked": int(meas["checked"].fillna(False).sum()),
            "incorrect": int((meas["checked"].fillna(False) & (meas["correct"] == False)).sum())}  # noqa: E712


def record_lines(ws: Workspace) -> list[str]:
    """Every tuning-record line of the workspace (main file and shard files), after making
    them agree with the tables."""
    D.sync_records(ws)
    lines, bad = D.read_record_lines(D.record_files(ws))
    if bad:
        log.warning("%d record line(s) left out of the release: %s", len(bad), "; ".join(map(str, bad[:3])))
    return [r.to_line() for r in lines]


def dataset_info(cfg, ws: Workspace) -> dict:
    tasks = ws.read("tasks", require=True)
    meas = ws.read("measurements")
    nets = ws.read("network_tasks")
    origin = R.workspace_release(ws.root)
    selection = (origin or {}).get("selection") or ws.selection()
    noise = ws.root / NOISE_REPORT
    last = meas.drop_duplicates("record_id", keep="last")
    return {
        "dataset": (origin or {}).get("dataset") or str(cfg.dataset.name),
        "selection": selection,
        "derived_from": {k: origin.get(k) for k in ("name", "hardware")} if origin else None,
        "target": {"name": str(cfg.target.name), "kind": str(cfg.target.tvm.kind),
                   "tvm": sorted(set(tasks["target"]))},
        "hardware": R.hardware_of(last),
        "timing": timing_of(last) if len(last) else {},
        "counts": {"tasks": len(tasks), "networks": sorted(n for n in set(nets["network"]) if n),
                   "records": int(ws.read("candidates", columns=["record_id"])["record_id"].nunique()),
                   "measured_ok": int(last["error"].isna().sum()) if len(last) else 0},
        "failures": failures_of(ws),
        "label_noise": json.loads(noise.read_text()) if noise.is_file() else None,
        "versions": R.versions(),
        "commands": ws.history(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "licence": str(cfg.release.licence),
        "description": cfg.release.get("description"),
    }


def release_root(cfg) -> Path:
    return Path(str(cfg.paths.releases)).expanduser().resolve()


def pack_dataset(cfg, ws: Workspace) -> dict:
    info = dataset_info(cfg, ws)
    hardware = str(cfg.release.hardware) if cfg.release.get("hardware") else R.hardware_slug(info["hardware"])
    name = R.check_name(cfg.release.get("name") or R.release_name(info["dataset"], str(cfg.target.name), hardware,
                                                                    int(cfg.release.version)))
    dest = release_root(cfg) / name
    if dest.exists() and not cfg.force:  # before the minutes of packing
        raise R.ReleaseError(f"{dest} exists: releases are not overwritten; give a new release.version (or "
                             f"release.name), or force=true to replace it")
    manifest = R.pack_dataset(ws, dest, info=info, card=R.dataset_card, force=bool(cfg.force),
                              record_lines=record_lines(ws))
    size = sum(e["bytes"] for e in manifest["files"].values())
    log.info("released %s: %d records, %d tasks, %.1f MB", dest, info["counts"]["records"], info["counts"]["tasks"],
             size / 1e6)
    return {"release": name, "records": info["counts"]["records"], "MB": round(size / 1e6, 1)}


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    out = {}
    if bool(cfg.release.dataset):
        out.update(pack_dataset(cfg, ws))
    uris = [str(u) for u in (OmegaConf.to_container(cfg.release.models, resolve=True) or [])]
    if uris:
        from models import release as model_release  # MLflow: only when models are released
        from pipeline.options import tracking_store

        names = model_release.release_models(
            tracking_store(cfg), ws, uris, release_root(cfg), name=str(cfg.release.get("name") or "") or None,
            licence=str(cfg.release.licence), force=bool(cfg.force))
        out["models"] = len(names)
        out["model_releases"] = ", ".join(names)
    if not out:
        raise R.ReleaseError("nothing to release: release.dataset=false and release.models is empty")
    return out
