"""What stage=tune tunes (`tune.tasks`): the workspace's tasks, the operator suite, or a network.

  workspace  the workspace's first `tune.max_tasks` tasks, each tuned on its own
  ops        the operator suite (`tune.suite`, conf/dataset/ops.yaml composed by Hydra;
             `tune.ops` / `tune.configs` pick other operators or shape configs)
  <network>  a zoo network (resnet18, resnet50, mobilenet_v2, bert_encoder), tuned end to
             end through Relax and then compiled and timed as a whole
"""

from __future__ import annotations

import json

import pandas as pd
from omegaconf import OmegaConf
from tvm.s_tir import meta_schedule as ms

from models.tuning_models import TuneError
from pipeline.core import database as D
from pipeline.core import schema as S
from pipeline.core.targets import make_target, target_dict
from pipeline.core.workspace import Workspace, WorkspaceError, read_table
from pipeline.tuning import Network, TirTask
from pipeline.workloads import flops_of, networks, ops, zoo


def _target(cfg, tasks: pd.DataFrame | None = None):
    """The target the workspace's tasks were made for, else the configured one."""
    if tasks is not None and len(tasks) and tasks["target"].notna().any():
        return make_target(json.loads(tasks["target"].dropna().iloc[0]))
    return make_target(target_dict(cfg))


def workspace_tasks(cfg, ws: Workspace, limit: int | None) -> tuple[list[TirTask], object]:
    """The workspace's first `limit` tasks, and their target."""
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    if limit is not None:
        tasks = tasks.head(int(limit))
    workloads = D.read_workload_lines(ws)
    out = [TirTask(str(r.name), D.load_workload_mod(workloads[int(r.workload_index)]),
                   float(r.flops) if pd.notna(r.flops) else float("nan"), int(r.weight or 1))
           for r in tasks.itertuples()]
    return out, _target(cfg, tasks)


def ops_tasks(cfg, limit: int | None) -> tuple[list[TirTask], object]:
    """The operator suite (tune.suite, or tune.ops / tune.configs when given)."""
    t = cfg.tune
    suite = OmegaConf.create({"dataset": {"ops": list(t.get("ops") or t.suite.ops),
                                          "configs": list(t.get("configs") or t.suite.configs)}})
    target = _target(cfg)
    wl = ops.load(suite, target)
    if limit is not None:
        wl = wl[: int(limit)]
    return [TirTask(w.name, w.mod, flops_of(w.mod)) for w in wl], target


def _flops(mod) -> float:
    try:
        return flops_of(zoo.as_main(mod))
    except Exception:  # noqa: BLE001 - a task without an estimate still tunes
        return float("nan")


def network(cfg, name: str) -> tuple[Network, object]:
    """A zoo network with weights bound, its example inputs and its extracted tasks."""
    if name not in networks.NETWORKS:
        raise TuneError(f"tune.tasks={name!r}: not `workspace`, `ops` nor a network; networks: "
                        f"{', '.join(networks.NETWORKS)}")
    options = {"layers": int(cfg.tune.get("bert_layers", 1) or 1)} if name == "bert_encoder" else {}
    batch, seed = int(cfg.tune.get("batch", 1) or 1), int(cfg.seed)
    mod = zoo.fuse(zoo.export(name, batch, seed, **options))
    _, example = networks.build(name, batch, seed, **options)
    target = _target(cfg)
    ext = ms.relax_integration.extract_tasks(mod, target)
    tasks = [TirTask(str(x.task_name), zoo.as_main(x.dispatched[0]), _flops(x.dispatched[0]), int(x.weight))
             for x in ext]
    return Network(name, mod, [x.numpy() for x in example], tasks), target


def choose(cfg, ws: Workspace) -> tuple[list[TirTask] | list[Network], object]:
    """What `tune.tasks` names, and the target to tune it for."""
    kind = str(cfg.tune.tasks)
    limit = None if cfg.tune.get("max_tasks") is None else int(cfg.tune.max_tasks)
    if kind in ("workspace", "ops"):
        tasks, target = workspace_tasks(cfg, ws, limit) if kind == "workspace" else ops_tasks(cfg, limit)
        if not tasks:
            raise WorkspaceError(f"tune.tasks={kind}: no task to tune in {ws.root}")
        return tasks, target
    net, target = network(cfg, kind)
    return [net], target
