"""stage=release: the workspace as a dataset release, or trained models as model releases.

    python -m pipeline stage=release dataset=zoo_ops budget=transfer release.version=1
    python -m pipeline stage=release dataset=zoo_ops budget=transfer release.dataset=false \\
        'release.models=[models:/<registered>@best]'
    python -m pipeline stage=release release.compact=all

A dataset release (`<paths.releases>/<dataset>-<target>-<hardware>-v<version>/`, see
pipeline/core/release.py) carries the tables, the MetaSchedule database, a manifest and
DATASET.md; with `release.extends=<base>` it holds only the tasks the base does not and goes
on under the base's name with the next version (a release grown in parts; dataset=release
unpacks them as one). Before packing, the tuning records are made to agree with the tables
(`database.sync_records`), so every record carries its latest run times. A model release
(`<training release>-<model>-<held out>`) carries the run's MLflow model folder, a manifest
and MODEL.md with the run's evaluation and its spread over the seeds of the same split.
`release.compact` only gzips the plain database files of releases packed before databases
were gzipped (R.compact); it packs nothing.
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
from pipeline.options import release_named, release_root, workspace_of

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


def released_rows(ws: Workspace, name: str, drop_tasks: frozenset[str], columns: list[str] | None = None):
    """A workspace table as a release holds it: the rows of `drop_tasks` (a base
    release's tasks) left out."""
    data = ws.read(name, columns=None if columns is None else list(dict.fromkeys(["task_id", *columns])))
    if drop_tasks and "task_id" in data:
        data = data[~data["task_id"].isin(drop_tasks)]
    return data if columns is None else data[columns]


def failures_of(ws: Workspace, drop_tasks: frozenset[str] = frozenset()) -> dict:
    cands = released_rows(ws, "candidates", drop_tasks, ["record_id", "error"])
    kernels = released_rows(ws, "kernels", drop_tasks, ["record_id", "error"])
    meas = released_rows(ws, "measurements", drop_tasks, ["record_id", "error", "checked", "correct"])
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


def summed(counts: list[dict], key: str) -> int | None:
    """One of the releases' `counts` summed over a chain (each manifest counts only its own
    tasks); None when a release lacks it."""
    values = [c.get(key) for c in counts]
    return None if None in values else sum(values)


def released_ok(origin: dict) -> int | None:
    """The kernels timed without error in the release a workspace was made from, over every
    release of its chain: its totals' count, or the parts' summed for totals written before
    the count was added."""
    total = R.total_counts(origin).get("measured_ok")
    return total if total is not None else summed([p.get("counts") or {} for p in origin.get("parts") or [origin]],
                                                  "measured_ok")


def dataset_info(cfg, ws: Workspace, drop_tasks: frozenset[str] = frozenset()) -> dict:
    ws.read("tasks", require=True)
    tasks = released_rows(ws, "tasks", drop_tasks)
    meas = released_rows(ws, "measurements", drop_tasks)
    nets = ws.read("network_tasks")
    origin = R.workspace_release(ws.root)
    selection = (origin or {}).get("selection") or ws.selection()
    noise = ws.root / NOISE_REPORT
    last = meas.drop_duplicates("record_id", keep="last")
    return {
        "dataset": (origin or {}).get("dataset") or str(cfg.dataset.name),
        "selection": selection,
        "derived_from": ({k: origin.get(k) for k in ("name", "hardware", "labels")}
                         | {"measured_ok": released_ok(origin)}) if origin else None,
        "target": {"name": str(cfg.target.name), "kind": str(cfg.target.tvm.kind),
                   "tvm": sorted(set(tasks["target"]))},
        "hardware": R.hardware_of(last),
        "timing": timing_of(last) if len(last) else {},
        "counts": {"tasks": len(tasks), "networks": sorted(n for n in set(nets["network"]) if n),
                   "records": int(released_rows(ws, "candidates", drop_tasks, ["record_id"])["record_id"].nunique()),
                   "measured_ok": int(last["error"].isna().sum()) if len(last) else 0},
        "failures": failures_of(ws, drop_tasks),
        "label_noise": json.loads(noise.read_text()) if noise.is_file() else None,
        "versions": R.versions(),
        "commands": ws.runs_on_tasks(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "licence": str(cfg.release.licence),
        "description": cfg.release.get("description"),
    }


def extension_of(cfg, ws: Workspace, info: dict,
                 outside: frozenset[str] = frozenset()) -> tuple[dict, frozenset[str]]:
    """The manifest's information for a release that extends the one `release.extends`
    names (pipeline/core/release.py `chain`), and the tasks to leave out: those the base and
    every release under it hold, and `outside` (`outside_tasks`). The new release goes on
    under the base's dataset name; its manifest names the base, pinned by the sha256 of
    its manifest, with the totals of both.
    Refused when the base's labels were taken otherwise (target, machine, repeats, calls,
    cache flush: labels that do not rank together) or when it holds every task here."""
    folder = release_named(cfg, cfg.release.extends)
    parts = R.chain(folder)
    base, where = parts[-1][1], folder / R.MANIFEST

    def protocol(m: dict) -> dict:
        return {"target": m["target"]["name"], "hardware": R.hardware_slug(m["hardware"]),
                **{k: (m.get("timing") or {}).get(k) for k in ("repeats", "number", "cache_flush")}}

    mine, theirs = protocol(info), protocol(base)
    differ = [f"{k} {mine[k]} here, {theirs[k]} there" for k in mine if mine[k] != theirs[k]]
    if differ:
        raise R.ReleaseError(f"release.extends={cfg.release.extends}: {where} was made otherwise "
                             f"({'; '.join(differ)}): labels taken otherwise do not rank together; release this "
                             f"workspace on its own (without release.extends)")
    drop = outside | R.chain_tasks(parts)
    if released_rows(ws, "tasks", drop).empty:
        raise R.ReleaseError(f"release.extends={cfg.release.extends}: it holds every task of {ws.root}: nothing to "
                             f"release")
    info = dataset_info(cfg, ws, drop)
    counts = [m["counts"] for _, m in parts] + [info["counts"]]
    total = {k: summed(counts, k) for k in ("tasks", "records", "measured_ok")} | {
        "networks": sorted(set().union(*(c["networks"] for c in counts)))}
    extends = {"name": base["name"], "manifest_sha256": R.sha256(where), "total": total}
    return {**info, "dataset": str(base["dataset"]), "extends": extends}, drop


def outside_tasks(ws: Workspace) -> frozenset[str]:
    """Tasks with candidates in the workspace but not in its task table: an earlier
    selection's, whose records `stage=tasks force=true` keeps when it rebuilds the workspace
    for another. No release of this selection holds them."""
    known = set(ws.read("tasks", require=True, columns=["task_id"])["task_id"])
    return frozenset(set(ws.read("candidates", columns=["task_id"])["task_id"]) - known)


def pack_dataset(cfg, ws: Workspace) -> dict:
    outside = outside_tasks(ws)
    info, drop = dataset_info(cfg, ws, outside), outside
    version = int(cfg.release.version)
    if cfg.release.get("extends"):
        info, drop = extension_of(cfg, ws, info, outside)
        base_version = R.version_of(info["extends"]["name"])
        if base_version is None and not cfg.release.get("name"):
            raise R.ReleaseError(f"release.extends={cfg.release.extends}: its name ends with no -v<version> to count "
                                 f"on from: give release.name")
        version = max(version, (base_version or 0) + 1)
    hardware = str(cfg.release.hardware) if cfg.release.get("hardware") else R.hardware_slug(info["hardware"])
    name = R.check_name(cfg.release.get("name") or R.release_name(info["dataset"], str(cfg.target.name), hardware,
                                                                    version))
    dest = release_root(cfg) / name
    if dest.exists() and not cfg.force:  # before the minutes of packing
        raise R.ReleaseError(f"{dest} exists: releases are not overwritten; give a new release.version (or "
                             f"release.name), or force=true to replace it")
    manifest = R.pack_dataset(ws, dest, info=info, card=R.dataset_card, force=bool(cfg.force),
                              record_lines=record_lines(ws), drop_tasks=drop)
    size = sum(e["bytes"] for e in manifest["files"].values())
    log.info("released %s: %d records, %d tasks, %.1f MB", dest, info["counts"]["records"], info["counts"]["tasks"],
             size / 1e6)
    return {"release": name, "records": info["counts"]["records"], "MB": round(size / 1e6, 1)}


def compact_releases(cfg) -> dict:
    """release.compact: the named dataset releases (or `all` under paths.releases) with their
    plain MetaSchedule database gzipped in place (R.compact)."""
    names = cfg.release.compact
    root = release_root(cfg)
    if isinstance(names, str):
        if names != "all":
            raise R.ReleaseError(f"release.compact={names}: give a list of dataset releases (names or folders), "
                                 f"or all")
        folders = R.releases(root, kind="dataset")
    else:
        folders = [R.find(str(n), R.search_path(root)) for n in names]
    done = [R.compact(folder) for folder in folders]
    for d in done:
        if d["files"]:
            log.info("compacted %s: database %.1f MB -> %.1f MB", d["release"], d["bytes_before"] / 1e6,
                     d["bytes_after"] / 1e6)
    before, after = sum(d["bytes_before"] for d in done), sum(d["bytes_after"] for d in done)
    return {"releases": len(done), "compacted": sum(bool(d["files"]) for d in done),
            "files": sum(d["files"] for d in done), "bytes_before": before, "bytes_after": after}


def run(cfg) -> dict:
    if cfg.release.get("compact"):
        return compact_releases(cfg)
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
