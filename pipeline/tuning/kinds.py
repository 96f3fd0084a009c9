"""The cost models of a tuning comparison (stage=tune), made by kind: `create(kind, ...)`.

  ours         the pipeline's model through pipeline.tuning.cost_model.PipelineCostModel (`load_ours`:
               the run's `tune.model_uri`, by default the registered model at alias `best`,
               or `best-static` when `best` was trained on features MetaSchedule cannot
               give); it refits online only with `tune.costmodel.update=true`
  ours_update  the same model, refit online from the session's measurements
               (`tune.costmodel.update_*` settings): `ours` with tune.costmodel.update=true,
               so one comparison can hold the model frozen and updated side by side
  ours_adapt   the same model frozen, with a small correction (a few dozen trees,
               models/residual.py) fitted on the session's measurements every
               `update_every` batches: the pretrained prior adapting to the tasks it tunes
  xgb          MetaSchedule's XGBModel as tune_tir creates it (its defaults: 100 random
               warm-up predictions before the booster is used, `tune.xgb_warmup`)
  random       MetaSchedule's RandomModel

MetaSchedule's MLPModel is not a kind: from scratch it fails at its first update (`check_kinds`
says why), so it can only tune from a state pretrained elsewhere.

Every kind's factory takes the same keyword arguments (seed, threads, ours, xgb_warmup) and
makes a fresh model for one tuning run.

Two statements every report makes: whether `ours` was trained on any of the tuned tasks
(`held_out`: its run's training workspace minus the split's held-out test tasks), and
whether the budget is below XGBModel's warm-up (`warmup_note`: then xgb predicted at
random and the figures are not a comparison of cost models).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from models import tracking
from models.residual import GRADES
from features.candidates import FeatureMismatchError
from pipeline.core import release
from pipeline.core import schema as S
from pipeline.core.errors import PipelineError
from pipeline.core.components import create_kind, target
from pipeline.core.workspace import Workspace, read_table
from pipeline.tuning import TuneError
from pipeline.tuning.cost_model import PipelineCostModel

log = logging.getLogger(__name__)

#: the reference of every comparison (speedups and trials-to-reach are relative to it)
BASELINE = "xgb"
#: kinds that need the pipeline's model (load_ours)
OURS = ("ours", "ours_update", "ours_adapt")
#: the documented comparison (docs/tuning.md, "Tuning on a held-out network"), named wherever a run
#: is too small to be one
COMPARISON_COMMAND = ("python -m pipeline stage=tune dataset=release dataset.release=zoo_ops-llvm-epyc2-v1 budget=transfer "
                      "tune.tasks=resnet18 tune.model_uri=pretrained:zoo_ops-llvm-epyc2-v1-lgbm_ps_rank4_task-without-resnet18 "
                      "tune.require_held_out=true")


def ours_model(*, ours: PipelineCostModel | None, threads: int, **_) -> PipelineCostModel:
    if ours is None:
        raise TuneError("cost model `ours` needs the loaded pipeline model (load_ours)")
    return ours.copy(threads=threads)  # online updates of one run do not leak into the next


def ours_update_model(*, ours: PipelineCostModel | None, threads: int, **_) -> PipelineCostModel:
    if ours is None:
        raise TuneError("cost model `ours_update` needs the loaded pipeline model (load_ours)")
    return ours.copy(threads=threads, update=True)


def ours_adapt_model(*, ours: PipelineCostModel | None, threads: int, **_) -> PipelineCostModel:
    if ours is None:
        raise TuneError("cost model `ours_adapt` needs the loaded pipeline model (load_ours)")
    if ours.plan is None:
        raise TuneError(f"cost model `ours_adapt` corrects a pipeline model; {ours.source} is MetaSchedule's own "
                        f"XGBModel, which adapts through its own update: use `ours_update`")
    return ours.copy(threads=threads, update=True, update_mode="residual")


def xgb_model(*, threads: int, xgb_warmup: int, **_):
    return ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=int(xgb_warmup))


def random_model(*, seed: int, **_):
    return ms.cost_model.RandomModel(seed=seed)


#: kind -> `_target_` (pipeline/core/components.py)
KINDS = {"ours": "pipeline.tuning.kinds.ours_model", "ours_update": "pipeline.tuning.kinds.ours_update_model",
         "ours_adapt": "pipeline.tuning.kinds.ours_adapt_model", "xgb": "pipeline.tuning.kinds.xgb_model",
         "random": "pipeline.tuning.kinds.random_model"}


#: MetaSchedule's MLPModel from scratch: its first update trains on its workloads less a test
#: fifth (mlp_model.py, `train_full`), none when it holds fewer than five, and fails
MLP_FROM_SCRATCH = ("tune.cost_models: 'mlp' (MetaSchedule's MLPModel) cannot tune from scratch: its first update "
                    "holds out a fifth of the workloads it has measured as a test set, has none with fewer than five, "
                    "and fails (numpy: need at least one array to concatenate); leave it out of tune.cost_models "
                    "(MetaSchedule's own model here is xgb)")


def check_kinds(kinds: list[str]) -> list[str]:
    """`tune.cost_models`, refused before any run when one is unknown."""
    for kind in kinds:
        if kind == "mlp":
            raise TuneError(MLP_FROM_SCRATCH)
        target("tune.cost_models", KINDS, kind, TuneError)
    return kinds


#: the `tune.costmodel` settings an `ours` kind reads besides `update` (`ours` reads these of
#: `ours_update` only when it refits, `update=true`)
SETTINGS_READ = {"ours_update": ("update_every", "update_mode", "update_rounds", "update_epochs"),
                 "ours_adapt": ("update_every", "update_rounds", "update_grades", "update_handover",
                                "update_handover_after")}


#: settings added after runs were kept, and the value those runs had
LATER = {"update_grades": GRADES, "update_handover": 0, "update_handover_after": 0}


def settings_read(kind: str, costmodel: dict) -> dict:
    """The part of `tune.costmodel` that decides what a run of the `ours` kind `kind` does."""
    if kind == "ours":
        return {"update": bool(costmodel["update"]),
                **(settings_read("ours_update", costmodel) if costmodel["update"] else {})}
    # runs kept before a setting of LATER existed had its value there: their names stay
    return {k: costmodel[k] for k in SETTINGS_READ[kind] if k not in LATER or costmodel[k] != LATER[k]}


def create(kind: str, *, seed: int, threads: int, ours: PipelineCostModel | None = None, xgb_warmup: int = 100):
    """A fresh MetaSchedule cost model of `kind` for one tuning run."""
    return create_kind("tune.cost_models", KINDS, kind, error=TuneError, seed=int(seed), threads=int(threads),
                       ours=ours, xgb_warmup=xgb_warmup)


PRETRAINED = "pretrained:"  # tune.model_uri=pretrained:<release name or folder>


@dataclass
class OursOptions:
    """Where `ours` comes from (tune.model_uri: an MLflow model URI or `pretrained:<release>`;
    tune.costmodel.path: a saved model folder) and how it learns during a run (tune.costmodel)."""

    model_uri: str | None = None
    path: str | None = None
    releases: Path = Path("data/releases")
    update: bool = False  # the defaults are conf/tune/default.yaml's
    update_every: int = 2
    update_mode: str = "auto"
    update_rounds: int = 50
    update_epochs: int = 5
    update_grades: int = GRADES
    update_handover: int = 0
    update_handover_after: int = 0
    threads: int = 1

    def learning(self) -> dict:
        return dict(update=self.update, update_every=self.update_every, update_mode=self.update_mode,
                    update_rounds=self.update_rounds, update_epochs=self.update_epochs,
                    update_grades=self.update_grades, update_handover=self.update_handover,
                    update_handover_after=self.update_handover_after, threads=self.threads)


def model_uri(opts: OursOptions, store: tracking.Store) -> tuple[str, bool]:
    """(model URI, whether it is the default: the workspace's `best`) for `ours`."""
    if opts.model_uri:
        return opts.model_uri, False
    return f"models:/{store.registered_model}@best", True


def load_ours(opts: OursOptions, store: tracking.Store) -> tuple[PipelineCostModel, str]:
    """The adapter for `ours` and where it came from (refusals and missing models are errors
    that name the fix)."""
    tracking.setup(store)
    uri, default = model_uri(opts, store)
    kwargs = opts.learning()
    if opts.path:
        return PipelineCostModel.from_path(opts.path, **kwargs), opts.path
    if uri.startswith(PRETRAINED):
        search = release.search_path(opts.releases)
        try:
            return PipelineCostModel.from_pretrained(uri[len(PRETRAINED):], search=search, **kwargs), uri
        except PipelineError as e:
            raise TuneError(f"tune.model_uri={uri}: {e}") from e
    try:
        return PipelineCostModel.from_uri(uri, **kwargs), uri
    except FeatureMismatchError as e:
        if not default:
            raise TuneError(str(e)) from e
        static_uri = uri.replace("@best", "@best-static")
        log.warning("%s is not usable for tuning (%s); using %s", uri, str(e).split(". ")[0], static_uri)
        try:
            return PipelineCostModel.from_uri(static_uri, **kwargs), static_uri
        except Exception as e2:  # noqa: BLE001
            raise TuneError(f"no static model for `ours`: {static_uri}: {e2}. Train one with "
                            f"`python -m pipeline stage=train features=static`.") from e2
    except Exception as e:  # noqa: BLE001 - a missing registry entry or run
        raise TuneError(f"tune.model_uri={uri}: {type(e).__name__}: {e}. Run `python -m pipeline stage=train` for "
                        f"workspace '{store.workspace}' (same mlflow.tracking_uri), or set tune.model_uri / "
                        f"tune.costmodel.path.") from e


# ----------------------------------------------------------------------------- what a report must say


@dataclass
class HeldOut:
    """Whether `ours` was trained on any tuned task."""

    known: bool  # the model's training tasks could be read
    seen: list[str]  # tuned tasks (names) the model was trained or validated on
    text: str  # one sentence for the report


def training_tasks(info: dict) -> tuple[set[str] | None, str]:
    """Task ids a model was trained (or early-stopped) on: its run's workspace tasks minus the
    split's held-out test tasks; None with the reason when that cannot be read here."""
    if info.get("trained_tasks") is not None:  # a released model names them
        return set(info["trained_tasks"]), ""
    if not info.get("run_id"):
        return None, "it was loaded from a folder, not an MLflow run, so its training tasks are unknown"
    path = info.get("workspace_path")
    if not path or not Path(path, "tasks.parquet").exists():
        return None, f"its training workspace ({path or 'not recorded'}) is not on this machine"
    if not info.get("split_known"):
        return None, f"its run {info['run_id']} logged no split.json"
    tasks = read_table(Workspace(Path(path)).tasks, S.TASKS)
    return set(tasks["task_id"]) - set(info.get("test_tasks") or []), ""


def held_out(info: dict, tuned: dict[str, str], *, require: bool) -> HeldOut:
    """Check `ours` against the tuned tasks (`tuned`: name -> task id). With `require`
    (tune.require_held_out), a model trained on a tuned task, or one whose training tasks
    cannot be read, is refused with the fix."""
    trained, why = training_tasks(info)
    where = f"{info.get('uri') or 'ours'} (split {info.get('split') or '?'}"
    where += f", held-out networks {info['test_networks']})" if info.get("test_networks") else ")"
    if trained is None:
        if require:
            raise TuneError(f"tune.require_held_out=true: cannot check that {where} never saw the tuned tasks: {why}. "
                            f"Use a model trained here with stage=train, or set tune.require_held_out=false.")
        return HeldOut(False, [], f"Whether {where} was trained on the tuned tasks is unknown: {why}.")
    seen = sorted(name for name, tid in tuned.items() if tid in trained)
    if seen and require:
        raise TuneError(f"tune.require_held_out=true: {where} was trained on {len(seen)} of the {len(tuned)} tuned "
                        f"tasks ({', '.join(seen[:5])}). Train one without them, e.g. `python -m pipeline stage=train "
                        f"split=by_network 'split.test_networks=[<network>]' mlflow.registered_model=<name>`, and "
                        f"name it in tune.model_uri=models:/<name>@best-static.")
    if seen:
        return HeldOut(True, seen, f"{where} was trained on {len(seen)} of the {len(tuned)} tuned tasks: this "
                                   f"measures tuning on tasks it has seen, not transfer.")
    tested = sum(tid in set(info.get("test_tasks") or []) for tid in tuned.values())
    return HeldOut(True, [], f"{where} was trained on none of the {len(tuned)} tuned tasks (held out; {tested} of "
                             f"them are test tasks of its split, the others not in its workspace).")


def warmup_note(kinds: list[str], seen_by_xgb: int, warmup: int) -> str | None:
    """The statement a run below XGBModel's warm-up must carry (None when the budget is enough).

    `seen_by_xgb`: measured candidates one XGBModel gets in a run (trials per task, or all the
    tasks' trials when a network's tasks are tuned jointly by one model)."""
    if BASELINE not in kinds or seen_by_xgb >= warmup:
        return None
    return (f"Not a comparison of cost models: XGBModel ({BASELINE}) measures {seen_by_xgb} candidates per run, "
            f"fewer than its warm-up of {warmup} (tune.xgb_warmup), during which it predicts at random; these "
            f"figures compare with random search. The comparison: `{COMPARISON_COMMAND}` (docs/tuning.md, Tuning "
            f"on a held-out network).")
