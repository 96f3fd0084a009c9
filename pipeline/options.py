"""The config turned into typed options, once per stage: what the libraries below the stages
take instead of the config (they never read it). Each builder imports its library when it
is called, so a stage pays only for the libraries it uses (MLflow, TVM)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from pipeline.core.sharding import Shard
from pipeline.core.workspace import Workspace

if TYPE_CHECKING:
    from pipeline.compute.executor import Executor
    from features.profilers import ProfilerSettings
    from models.tracking import Store
    from pipeline.runner.modes import MeasureSettings


def workspace_of(cfg, *, check: bool = True) -> Workspace:
    """The workspace `<paths.data>/<workspace>`; `check`: refuse one whose tasks another dataset
    selection picked (Workspace.check_selection)."""
    ws = Workspace(Path(cfg.paths.data).expanduser().resolve() / str(cfg.workspace))
    if check:
        ws.check_selection(cfg.dataset, cfg.budget.get("max_tasks"))
    return ws


def shard_of(cfg) -> Shard:
    """The shard of this run (`shard.index` of `shard.count`)."""
    return Shard(int(cfg.shard.index), int(cfg.shard.count))


def executor_of(cfg) -> Executor:
    """The executor of the `executor` group, told whether the target's device is a GPU."""
    from pipeline.compute import executor as E

    return E.create(cfg.executor, gpu=str(cfg.target.kind) == "cuda")


def target_of(cfg) -> dict:
    """The TVM target dict of the `target` group; a CPU named for an llvm target under the
    generic target's name is refused (its kernels would join the generic target's workspace)."""
    from pipeline.shims.targets import target_dict

    tvm = cfg.target.tvm
    if tvm.get("kind") == "llvm" and tvm.get("mcpu") and str(cfg.target.name) == "llvm":
        raise ValueError(f"target.tvm.mcpu={tvm.mcpu} builds other kernels than target.name=llvm's (generic "
                         f"x86-64, SSE2): give the target its own name, e.g. target.name=llvm-{tvm.mcpu}, which "
                         f"names its workspace and releases")
    return target_dict(tvm)


def tracking_store(cfg) -> Store:
    """The MLflow store and names of the workspace's runs (the `mlflow` group); a `best_metric`
    that is not a validation metric is refused here, before any work."""
    from models import tracking

    m = cfg.get("mlflow") or {}
    return tracking.Store(
        uri=tracking.tracking_uri(m.get("tracking_uri")),
        experiment=str(m.get("experiment") or cfg.workspace),
        registered_model=str(m.get("registered_model") or f"{cfg.workspace}-cost-model"),
        best_metric=str(m.get("best_metric") or tracking.DEFAULT_BEST_METRIC),
        workspace=str(cfg.workspace), root=workspace_of(cfg).root, dataset=str(cfg.dataset.name),
        target=str(cfg.target.name), device=str(cfg.target.device), config=OmegaConf.to_container(cfg, resolve=True))


def ours_options(cfg):
    """Where tuning's `ours` comes from and how it learns during a run (`tune.model_uri`,
    `tune.costmodel`), as pipeline.tuning.kinds.OursOptions."""
    from pipeline.tuning.kinds import OursOptions  # lazy: it imports TVM, which only stage=tune needs

    cm = cfg.tune.costmodel
    # cm["update"]: `cm.update` is the mapping's own method
    return OursOptions(model_uri=str(cfg.tune.get("model_uri") or "") or None, path=str(cm.get("path") or "") or None,
                       releases=Path(str(cfg.paths.releases)), update=bool(cm["update"]),
                       update_every=int(cm["update_every"]), update_mode=str(cm["update_mode"]),
                       update_rounds=int(cm["update_rounds"]), update_epochs=int(cm["update_epochs"]),
                       update_grades=int(cm["update_grades"]), update_handover=int(cm["update_handover"]),
                       update_handover_after=int(cm["update_handover_after"]),
                       threads=int(cfg.jobs) or os.cpu_count() or 1)


def task_choice(cfg):
    """What stage=tune tunes (`tune.tasks`, `tune.max_tasks`, the suite's operators and a zoo
    network's shape), as pipeline.tuning.tasks.TaskChoice."""
    from pipeline.tuning.tasks import TaskChoice  # lazy: it imports TVM, which only stage=tune needs

    t = cfg.tune
    return TaskChoice(tasks=str(t.tasks), target=target_of(cfg),
                      max_tasks=None if t.get("max_tasks") is None else int(t.max_tasks),
                      ops=list(t.get("ops") or t.suite.ops), configs=list(t.get("configs") or t.suite.configs),
                      batch=int(t.get("batch", 1) or 1), bert_layers=int(t.get("bert_layers", 1) or 1),
                      bert_seq=int(t.get("bert_seq", 128) or 128), seed=int(cfg.seed))


def device_kind(cfg) -> str:
    """The harness's device kind of the target: cuda for a CUDA target, cpu for any other."""
    return "cuda" if str(cfg.target.kind) == "cuda" else "cpu"


def cuda_arch_of(cfg) -> str | None:
    """The CUDA architecture a CUDA target's kernels are built for (`target.tvm.arch`), else None."""
    return str(cfg.target.tvm.get("arch")) if device_kind(cfg) == "cuda" and cfg.target.tvm.get("arch") else None


def measure_settings(cfg, *, results_of: str = "measure") -> MeasureSettings:
    """The `measure` and `bundle` groups, the target's device and the shard, for the run modes
    (pipeline/runner/modes.py); `results_of`: the group whose `results` an import reads
    (`measure`, or `collect` for its bundle parts)."""
    from pipeline.runner.modes import BundleSettings, MeasureSettings

    m, b = cfg.measure, cfg.bundle
    res = cfg[results_of].get("results")
    results = [str(r) for r in res] if OmegaConf.is_list(res) else [str(res)] if res else []
    bundle = BundleSettings(python=str(b.python), platform=str(b.platform), part_mib=float(b.part_mib),
                            part_kernels=int(b.part_kernels), wheel_cache=str(b.wheel_cache) if b.wheel_cache else None,
                            ncu_chunk=int(b.ncu_chunk), ncu_timeout_s=float(b.ncu_timeout_s))
    return MeasureSettings(device=device_kind(cfg), number=int(m.number), repeat=int(m.repeat),
                           min_repeat_ms=int(m.min_repeat_ms), rtol=float(m.rtol), atol=float(m.atol),
                           cache_flush=bool(m.cache_flush), rounds=int(m.rounds), timeout_s=float(m.timeout_s),
                           settle_s=float(m.settle_s), settle_load=float(m.settle_load),
                           batch_size=int(m.batch_size), bundle_runtime=bool(m.bundle_runtime), results=results,
                           shard_index=int(cfg.shard.index), shard_count=int(cfg.shard.count), force=bool(cfg.force),
                           device_name=str(cfg.target.device), check_per_task=int(m.check_per_task),
                           results_option=f"{results_of}.results", bundle=bundle, cuda_arch=cuda_arch_of(cfg))


def profiler_settings(cfg) -> ProfilerSettings:
    """The `collect` group's profilers: `collect.perf`, `collect.ncu` (a section set, or the
    curated metric list resolved here; each None where the chosen `collect` option has none),
    the report folder of the workspace and device."""
    from features.ncu import metrics as M
    from features.ncu.profile import Options
    from features.profilers import ProfilerSettings

    reports = Path(cfg.paths.ncu_profiles).expanduser().resolve()
    report_dir = reports / str(cfg.workspace) / f"device={cfg.target.device}"
    ncu, section_set, perf = None, None, None
    if (n := cfg.collect.get("ncu")) is not None:
        section_set = str(n.set) if n.get("set") else None
        metrics = None if section_set else M.resolve(OmegaConf.to_object(n.metrics) if OmegaConf.is_config(n.metrics)
                                                    else n.metrics)
        ncu = Options(ncu=str(n.executable), metrics=metrics, section_set=section_set,
                      clock_control=str(n.clock_control), cache_control=str(n.cache_control),
                      replay_mode=str(n.replay_mode), batch_size=int(n.batch_size), timeout_s=float(n.timeout_s),
                      warmup=int(n.warmup), extra_args=[str(a) for a in n.extra_args])
    if (p := cfg.collect.get("perf")) is not None:
        perf = dict(executable=str(p.executable), events=tuple(p.events), min_time_s=float(p.min_time_s),
                    max_calls=int(p.max_calls), timeout_s=float(p.timeout_s), batch_size=int(p.batch_size))
    return ProfilerSettings(target_kind=str(cfg.target.kind), perf=perf, ncu=ncu, ncu_set=section_set,
                            report_dir=report_dir, tag=f"shard{int(cfg.shard.index)}", target=str(cfg.target.name))


def release_root(cfg) -> Path:
    """`paths.releases`: where stage=release writes and where a release is looked up first."""
    return Path(str(cfg.paths.releases)).expanduser().resolve()


def release_named(cfg, name) -> Path:
    """A release by name or path, looked up in paths.releases first (`release.search_path`)."""
    from pipeline.core import release as R

    return R.find(str(name), R.search_path(release_root(cfg)))


def tenset_copy(cfg) -> Path | None:
    """The TenSet copy a TenSet workspace reads (`dataset.path`, else the one stage=download
    made), None for another dataset or when there is none."""
    from pipeline.tenset import dataset as DS

    if cfg.dataset.get("source") != "tenset":
        return None
    try:
        return DS.resolve(cfg.dataset.get("path"), cfg.paths.data)
    except DS.DatasetError:
        return None
