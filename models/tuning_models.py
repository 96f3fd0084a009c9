"""The cost models of a tuning comparison (stage=tune), made by kind: `create(kind, ...)`.

  ours    the pipeline's model through models.adapter.PipelineCostModel (`load_ours`: the
          run's `tune.model_uri`, by default the registered model at alias `best`, or
          `best-static` when `best` was trained on features MetaSchedule cannot give)
  xgb     MetaSchedule's XGBModel as tune_tir creates it (its defaults: 100 random warm-up
          predictions before the booster is used, `tune.xgb_warmup`)
  mlp     MetaSchedule's MLPModel (dropped from the comparison at its first failure: it
          fails on some TVM builds, see DROP_ON_FAILURE)
  random  MetaSchedule's RandomModel

Every kind's factory takes the same keyword arguments (seed, threads, ours, xgb_warmup) and
makes a fresh model for one tuning run.
"""

from __future__ import annotations

import logging
import os

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.mlp_model import MLPModel

from models import tracking
from models.adapter import FeatureMismatchError, PipelineCostModel
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)

#: the reference of every comparison (speedups and trials-to-reach are relative to it)
BASELINE = "xgb"
#: kinds that leave the comparison at their first failing run instead of failing every run
DROP_ON_FAILURE = ("mlp",)


class TuneError(PipelineError):
    pass


def _ours(*, ours: PipelineCostModel | None, threads: int, **_) -> PipelineCostModel:
    if ours is None:
        raise TuneError("cost model `ours` needs the loaded pipeline model (load_ours)")
    return ours.copy(threads=threads)  # online updates of one run do not leak into the next


def _xgb(*, threads: int, xgb_warmup: int, **_):
    return ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=int(xgb_warmup))


def _mlp(**_):
    return MLPModel()


def _random(*, seed: int, **_):
    return ms.cost_model.RandomModel(seed=seed)


KINDS = {"ours": _ours, "xgb": _xgb, "mlp": _mlp, "random": _random}


def check_kinds(kinds: list[str]) -> list[str]:
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise TuneError(f"tune.cost_models: unknown {bad}; valid: {', '.join(KINDS)}")
    return kinds


def create(kind: str, *, seed: int, threads: int, ours: PipelineCostModel | None = None, xgb_warmup: int = 100):
    """A fresh MetaSchedule cost model of `kind` for one tuning run."""
    check_kinds([kind])
    return KINDS[kind](seed=int(seed), threads=int(threads), ours=ours, xgb_warmup=xgb_warmup)


def model_uri(cfg) -> tuple[str, bool]:
    """(model URI, whether it is the default) for `ours`."""
    uri = cfg.tune.get("model_uri")
    if uri:
        return str(uri), False
    return f"models:/{tracking.registered_name(cfg)}@best", True


def load_ours(cfg) -> tuple[PipelineCostModel, str]:
    """The adapter for `ours` and where it came from (refusals and missing models are errors
    that name the fix)."""
    tracking.setup(cfg)
    uri, default = model_uri(cfg)
    cm = cfg.tune.costmodel
    # cm["update"]: `cm.update` is the mapping's own method
    kwargs = dict(update=bool(cm["update"]), update_every=int(cm["update_every"]), update_mode=str(cm["update_mode"]),
                  update_rounds=int(cm["update_rounds"]), update_epochs=int(cm["update_epochs"]),
                  threads=int(cfg.jobs) or os.cpu_count() or 1)
    if cm.get("path"):
        return PipelineCostModel.from_path(str(cm.path), **kwargs), str(cm.path)
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
                        f"workspace '{cfg.workspace}' (same mlflow.tracking_uri), or set tune.model_uri / "
                        f"tune.costmodel.path.") from e
