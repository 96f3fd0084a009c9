"""stage=tasks: the task table and the MetaSchedule workload database of a workspace.

With dataset=release the workspace is made from a release instead (pipeline/core/release.py
`unpack`): verified first (checksums, tables, schema version, target kind), then written
whole or not at all; nothing is built or timed.

force=true rebuilds both (the repair of a damaged database_workload.json) and then
writes the tuning records back from candidates/ and measurements/ with the new workload
indices (pipeline/core/database.py `sync_records`): no sampled or measured record is lost.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pandas as pd

from pipeline.core import database as D
from pipeline.core import identity
from pipeline.core import release as R
from pipeline.shims.targets import make_target, target_json
from pipeline.core.workspace import SELECTION_KEY
from pipeline.workloads import args_of, flops_of, load_workloads
from pipeline.options import release_named, target_of, workspace_of

log = logging.getLogger(__name__)


def select_tasks(workloads: list, limit: int) -> list:
    """At most `limit` tasks: for networks, round-robin over networks, heaviest first
    (weight x FLOPs), so that a small budget still covers every network."""
    if not any(w.network for w in workloads):
        return workloads[:limit]
    by_net: dict[str, list] = {}
    for w in sorted(workloads, key=lambda w: -w.weight * max(flops_of(w.mod), 0.0)):
        by_net.setdefault(w.network, []).append(w)
    out, queues = [], list(by_net.values())
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out


def network_rows(workloads: list) -> list[dict]:
    """One row per (network, task): a task shared by two networks counts in both."""
    rows: dict[tuple, dict] = {}
    for w in workloads:
        key = (w.network, identity.task_id(w.mod))
        if key in rows:
            rows[key]["weight"] += int(w.weight)
        else:
            rows[key] = dict(network=w.network, task_id=key[1], name=w.name, weight=int(w.weight))
    return list(rows.values())


def release_folder(cfg) -> Path:
    """The release that dataset=release names, looked up in paths.releases first
    (`release.search_path`)."""
    return release_named(cfg, cfg.dataset.release)


def kept_runs_importer(cfg):
    """What adds the kept tuning runs of `dataset.tuning_networks` to the workspace being made
    (pipeline/tuning/imported.py), or None when it names none."""
    networks = [str(n) for n in cfg.dataset.get("tuning_networks") or []]
    if not networks:
        return None
    if not bool(cfg.dataset.labels):
        raise R.ReleaseError("dataset.tuning_networks joins measured schedules to the release's labels: it needs "
                             "dataset.labels=true")
    # TVM and the feature extractor: imported when runs are imported, not for every release
    from pipeline.tuning import imported

    # runs tuned on this release or on a release it extends: the tasks of each are the workspace's
    results = Path(str(cfg.dataset.tuning_results))
    releases = R.chain(release_folder(cfg))[::-1]
    runs = imported.kept_runs([results / m["name"] for _, m in releases], networks)
    for _, manifest in releases:  # before the release is unpacked: a run of another CPU is refused in seconds
        imported.check_same_cpu(runs, manifest.get("hardware") or {})
    log.info("importing %d kept tuning runs of %s", len(runs), ", ".join(networks))
    return lambda ws: {f"tuning_{k}": v for k, v in imported.import_runs(ws, runs).items()}


def from_release(cfg) -> dict:
    folder = release_folder(cfg)
    manifest = R.verify(folder, kind="dataset")  # before anything is written
    kind, wanted = manifest["target"]["kind"], str(cfg.target.tvm.kind)
    if kind != wanted:
        raise R.ReleaseError(f"{folder / R.MANIFEST}: release {manifest['name']} holds {kind} programs, this run's "
                             f"target={cfg.target.name} is {wanted}: run with a target of kind {kind} (target="
                             f"{manifest['target']['name']})")
    ws = workspace_of(cfg, check=False)
    if ws.tasks.exists() and not cfg.force:
        made_from = R.workspace_release(ws.root) or {}
        if made_from.get("name") != manifest["name"]:
            raise R.ReleaseError(f"{ws.root} exists and was not made from release {manifest['name']}: give another "
                                 f"paths.data, or force=true to make it anew from the release")
        log.info("%s was made from release %s; force=true makes it anew", ws.root, manifest["name"])
        return {"tasks": R.total_counts(manifest)["tasks"]}
    n = R.total_counts(manifest)["tasks"]
    selection = json.dumps(identity.selection(cfg.dataset, cfg.budget.get("max_tasks"), n)).encode()
    old = ws.root / f".replaced-{uuid.uuid4().hex[:8]}"
    moved = R.visible_entries(ws.root) if cfg.force else []
    if moved:  # force: the workspace's files step aside, and come back if the release cannot be unpacked
        old.mkdir()
        for entry in moved:
            os.replace(entry, old / entry.name)
    grow = kept_runs_importer(cfg)
    try:
        rows = R.unpack(folder, ws.root, labels=bool(cfg.dataset.labels), selection=selection, then=grow)
    except BaseException:
        for entry in moved:
            if not (ws.root / entry.name).exists():
                os.replace(old / entry.name, entry)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
    log.info("made %s from release %s (%s)", ws.root, manifest["name"], folder)
    return {"tasks": rows.get("tasks", 0), "records": rows.get("candidates", 0),
            "measured": rows.get("measurements", 0), "release": manifest["name"],
            **{k: v for k, v in rows.items() if k.startswith("tuning_")}}


def run(cfg) -> dict:
    if str(cfg.dataset.source) == "release":
        return from_release(cfg)
    # TVM takes seconds to import: loaded when the stage runs, not when the CLI starts.
    from tvm.s_tir import meta_schedule as ms

    ws = workspace_of(cfg, check=not cfg.force)  # force rebuilds it for this selection
    if ws.tasks.exists() and not cfg.force:
        tasks = ws.read("tasks")
        log.info("%s exists (%d tasks); force=true rebuilds it", ws.tasks, len(tasks))
        return {"tasks": len(tasks)}
    tdict = target_of(cfg)
    target = make_target(tdict)
    workloads = load_workloads(cfg.dataset, target, seed=int(cfg.get("seed", 0) or 0),
                               data=Path(str(cfg.paths.data)))
    available = len(workloads)
    limit = cfg.budget.max_tasks
    if limit is not None and len(workloads) > int(limit):
        workloads = select_tasks(workloads, int(limit))
    ws.root.mkdir(parents=True, exist_ok=True)
    ws.tasks.unlink(missing_ok=True)  # written last: until then the stage is not done, whatever stops it
    rows, index = [], {}
    with tempfile.TemporaryDirectory(dir=ws.root, prefix=".tasks-") as tmp:
        # Workloads go to a scratch database first; the records are never emptied.
        scratch = os.path.join(tmp, ws.db_workload.name)
        db = ms.database.JSONDatabase(scratch, os.path.join(tmp, "records.json"), allow_missing=True)
        for w in workloads:
            tid = identity.task_id(w.mod)
            if tid in index:  # the same workload from two places: one task, summed weight
                rows[index[tid]]["weight"] += w.weight
                continue
            db.commit_workload(w.mod)
            index[tid] = len(rows)
            rows.append(
                dict(task_id=tid, name=w.name, network=w.network, weight=int(w.weight), flops=flops_of(w.mod),
                     target=target_json(tdict), source=w.source, args_json=json.dumps(args_of(w.mod)),
                     workload_index=len(rows))
            )
        os.replace(scratch, ws.db_workload)
    # The workload indices may have moved: every record line is written anew from the tables.
    synced = D.sync_records(ws, pd.DataFrame(rows), fresh=True)
    ws.write("network_tasks", network_rows(workloads))
    picked = identity.selection(cfg.dataset, cfg.budget.get("max_tasks"), available)
    ws.write("tasks", rows, metadata={SELECTION_KEY: json.dumps(picked)})
    log.info("wrote %d tasks to %s", len(rows), ws.tasks)
    return {"tasks": len(rows), "records": synced.get("lines", 0)}
