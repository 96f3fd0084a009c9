"""A comparison's runs on a cluster (executor=ray): every run is one job that holds a
machine's `measure` slot (a GPU on CUDA targets), so each machine builds with its own cores
and times on its own device, and N machines tune N runs at once. A node makes its builder
and runner from the comparison's settings (`setup_spec`), once per worker process
(`tune_job`), and sends back the run's row, trials and tuning database; the untuned network
is timed there too, so that every latency of a report comes from the same kind of machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from pipeline.tuning.comparison import DATABASE_FILES, Setup, cost_models, make_setup, tune_one, warm_up_for
from pipeline.tuning.cost_model import PipelineCostModel

log = logging.getLogger(__name__)


#: the job that times a network without tuning records
UNTUNED = "untuned"


@dataclass
class Remote:
    """How a comparison runs on a cluster: the executor (its `map` with `device=True` gives
    each run a machine of its own), the settings each node makes its Setup from
    (`setup_spec`), `ours` as `PipelineCostModel.to_bytes` with its training table where a
    run refits in the union mode, and XGBModel's warm-up."""

    executor: object
    spec: dict
    ours: bytes | None = None
    ours_table: object = None
    xgb_warmup: int = 100

    @classmethod
    def create(cls, executor, spec: dict, *, ours: PipelineCostModel | None, kinds: list[str],
               xgb_warmup: int) -> "Remote":
        """`ours` as bytes, with its training table only where a run will refit in the union
        mode (ours_update, or ours with updates on, unless the mode is `continue`)."""
        if ours is None:
            return cls(executor, spec, xgb_warmup=xgb_warmup)
        refits = "ours_update" in kinds or ours.update_enabled
        table = ours.training_table() if refits and ours.update_mode not in ("continue", "residual") else None
        return cls(executor, spec, ours.to_bytes(), table, xgb_warmup)

    def run(self, todo: list[tuple], untuned: list, setup: Setup) -> Iterator[dict]:
        """`todo`'s runs and the `untuned` networks as jobs (see run_jobs)."""
        return run_jobs(self, todo, untuned, setup)


# Per worker process of a cluster node: the Setup (builder, runner) and `ours` of the
# comparison it serves, made at its first run and kept for the next ones.
_NODE: dict = {}


def release_node() -> None:
    """Close the builder that `tune_job` keeps in this process."""
    if _NODE.get("setup") is not None:
        _NODE["setup"].builder.close()
    _NODE.clear()


def tune_job(job: dict, root: str) -> dict:
    """One run of a comparison on a cluster node (see `Remote`): `tune_one` in `root`, or the
    untuned network's end-to-end row (kind UNTUNED)."""
    item = job["items"][job["item"]]
    if _NODE.get("key") != job["key"]:
        release_node()
        setup = make_setup(job["spec"], Path(root))
        ours = PipelineCostModel.from_bytes(job["ours"], train_table=job["ours_table"]) if job["ours"] else None
        warm_up_for(setup, item.tasks)
        _NODE.update(key=job["key"], setup=setup, ours=ours)
    setup = replace(_NODE["setup"], work=Path(root))
    if job["kind"] == UNTUNED:
        return {"untuned": item.untuned(setup)}
    make_cost_model = cost_models(ours=_NODE["ours"], threads=setup.threads, xgb_warmup=int(job["xgb_warmup"]))
    return tune_one(item, job["kind"], int(job["seed"]), make_cost_model, setup, Path(root) / job["folder"])


def run_jobs(remote: Remote, todo: list[tuple], untuned: list, setup: Setup) -> Iterator[dict]:
    """The runs of `todo` ((item, seed, kind)) and the untuned networks as jobs of
    `remote.executor`, a run's database written under `setup.work`; yields each run's result
    (a lost job is a row with its error) and, for an untuned network, {"untuned": row} (None
    with its `error` when that job was lost). The items go out once, with the rest that every
    job has; a job names its item."""
    key = f"{setup.work}-{time.time_ns()}"  # a new Setup on every node for each comparison
    shared = {"key": key, "items": {item.name: item for item, _, _ in todo} | {item.name: item for item in untuned},
              "spec": remote.spec, "ours": remote.ours, "ours_table": remote.ours_table,
              "xgb_warmup": remote.xgb_warmup}
    jobs = [{"item": item.name, "kind": kind, "seed": seed, "folder": setup.folder(item.name, kind, seed),
             "writes": [f"{setup.folder(item.name, kind, seed)}/{f}" for f in DATABASE_FILES]}
            for item, seed, kind in todo]
    jobs += [{"item": item.name, "kind": UNTUNED, "seed": -1} for item in untuned]

    def failed(job: dict, reason: str) -> dict:
        if job["kind"] == UNTUNED:
            return {"untuned": None, "error": reason[:500], "network": job["item"]}
        row = {"task": job["item"], "cost_model": job["kind"], "seed": job["seed"], "wall_s": float("nan"),
               "refits": None, "error": reason[:500], "host": None}
        return {"row": row, "trials": [], "end_to_end": None}

    log.info("tuning %d runs on %s", len(todo), remote.executor.describe(device=True))
    for results in remote.executor.map(tune_job, jobs, root=setup.work, failed=failed, device=True, shared=shared):
        yield from results
