"""What stage=tune tunes (`tune.tasks`): the workspace's tasks, the operator suite, or a network.

  workspace  the workspace's first `tune.max_tasks` tasks, each tuned on its own
  ops        the operator suite (`tune.suite`, conf/dataset/ops.yaml composed by Hydra;
             `tune.ops` / `tune.configs` pick other operators or shape configs)
  <network>  a zoo network (resnet18, resnet50, mobilenet_v2, bert_encoder): its
             `tune.max_tasks` heaviest tasks (weight x FLOPs, as the network calls them;
             null = all) tuned jointly, then the whole network compiled and timed
  <pkg.module:function>
             a network of your own (pipeline/workloads/relax.py, as dataset.module names
             it), tuned and timed as a zoo network
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd
from omegaconf import OmegaConf
from tvm.s_tir import meta_schedule as ms

from pipeline.core import database as D
from pipeline.core import schema as S
from pipeline.shims.targets import make_target
from pipeline.core.workspace import Workspace, WorkspaceError, read_table
from pipeline.tuning import TuneError
from pipeline.tuning.comparison import Network, TirTask
from pipeline.workloads import flops_of, networks, ops, relax, zoo


@dataclass
class TaskChoice:
    """What `tune.tasks` names and how to build it: `tasks` (workspace | ops | a network |
    pkg.module:function), at most `max_tasks` of them (None: all), the operator suite's `ops`
    and `configs`, a zoo network's `batch` (and BERT's `bert_layers`, `bert_seq`), the seed
    of its weights, and the configured `target` (a TVM target dict)."""

    tasks: str
    target: dict
    max_tasks: int | None = None
    ops: list = field(default_factory=list)
    configs: list = field(default_factory=list)
    batch: int = 1
    bert_layers: int = 1
    bert_seq: int = 128
    seed: int = 0


def _target(choice: TaskChoice, tasks: pd.DataFrame | None = None):
    """The target the workspace's tasks were made for, else the configured one."""
    if tasks is not None and len(tasks) and tasks["target"].notna().any():
        return make_target(json.loads(tasks["target"].dropna().iloc[0]))
    return make_target(choice.target)


def workspace_tasks(choice: TaskChoice, ws: Workspace, limit: int | None) -> tuple[list[TirTask], object]:
    """The workspace's first `limit` tasks, and their target."""
    tasks = read_table(ws.require(ws.tasks, "tasks"), S.TASKS)
    if limit is not None:
        tasks = tasks.head(int(limit))
    workloads = D.read_workload_lines(ws)
    out = [TirTask(str(r.name), D.load_workload_mod(workloads[int(r.workload_index)]),
                   float(r.flops) if pd.notna(r.flops) else float("nan"), int(r.weight or 1))
           for r in tasks.itertuples()]
    return out, _target(choice, tasks)


def ops_tasks(choice: TaskChoice, limit: int | None) -> tuple[list[TirTask], object]:
    """The operator suite (tune.suite, or tune.ops / tune.configs when given)."""
    suite = OmegaConf.create({"ops": list(choice.ops), "configs": list(choice.configs)})
    target = _target(choice)
    wl = ops.load(suite, target)
    if limit is not None:
        wl = wl[: int(limit)]
    return [TirTask(w.name, w.mod, flops_of(w.mod)) for w in wl], target


def _flops(mod) -> float:
    try:
        return flops_of(zoo.as_main(mod))
    except Exception:  # noqa: BLE001 - a task without an estimate still tunes
        return float("nan")


def heaviest(tasks: list[TirTask], limit: int | None) -> list[int]:
    """Positions of the `limit` tasks of largest weight x FLOPs (all when None), heaviest
    first; a task without a FLOP estimate comes after every task with one."""
    def load(i: int) -> tuple:
        w = tasks[i].weight * tasks[i].flops
        return (0, -w) if w == w else (1, 0.0)  # NaN: no estimate
    order = sorted(range(len(tasks)), key=load)
    return order if limit is None else order[: int(limit)]


def network(choice: TaskChoice, name: str, limit: int | None = None) -> tuple[Network, object]:
    """A zoo network, or a user's (`pkg.module:function`), with weights bound, its example inputs
    and its `limit` heaviest tasks."""
    own = relax.is_spec(name)
    if not own and name not in networks.NETWORKS:
        raise TuneError(f"tune.tasks={name!r}: not `workspace`, `ops`, a network ({', '.join(networks.NETWORKS)}) "
                        f"nor a function of your own as {relax.FORM}")
    if limit is not None and int(limit) < 1:
        raise TuneError(f"tune.max_tasks={limit}: tune at least one task of {name} (null = all of them)")
    seed = choice.seed
    if own:
        net = relax.load_network(name, "tune.tasks", seed)
        label, mod, inputs = net.name, net.mod, net.inputs
    else:
        options = {"layers": choice.bert_layers, "seq": choice.bert_seq} if name == "bert_encoder" else {}
        batch = choice.batch
        mod = zoo.export(name, batch, seed, **options)
        _, example = networks.build(name, batch, seed, **options)
        label, inputs = name, [x.numpy() for x in example]
    mod = zoo.fuse(mod)
    target = _target(choice)
    ext = ms.relax_integration.extract_tasks(mod, target)
    if not ext:
        raise TuneError(f"tune.tasks={name!r}: MetaSchedule finds no task to tune in {label}")
    tasks = [TirTask(str(x.task_name), zoo.as_main(x.dispatched[0]), _flops(x.dispatched[0]), int(x.weight))
             for x in ext]
    chosen = heaviest(tasks, limit)
    return Network(label, mod, inputs, [tasks[i] for i in chosen], [ext[i] for i in chosen], len(tasks)), target


def choose(choice: TaskChoice, ws: Workspace) -> tuple[list[TirTask] | list[Network], object]:
    """What `tune.tasks` names, and the target to tune it for."""
    kind, limit = choice.tasks, choice.max_tasks
    if kind in ("workspace", "ops"):
        tasks, target = workspace_tasks(choice, ws, limit) if kind == "workspace" else ops_tasks(choice, limit)
        if not tasks:
            raise WorkspaceError(f"tune.tasks={kind}: no task to tune in {ws.root}")
        return tasks, target
    net, target = network(choice, kind, limit)
    return [net], target
