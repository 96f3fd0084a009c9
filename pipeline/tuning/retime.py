"""A network's kept tuning runs timed again end to end, interleaved: whether a cost model's
tuned network is faster than XGBModel's, read past the machine's drift.

Each run of a comparison times its network once, right after it tunes (the runner's
evaluator: 3 calls, one repeat). Runs tuned an hour apart meet the machine in different
states (a shared 2-core VM can time one MobileNet-V2 at 125 ms and at 165 ms a minute
later), and a network's five tuned tasks are a small part of its time, so those single
timings rarely say which run's network is faster. Here each kept run's database compiles the
network once; then every round times every run's network and the untuned one once, in an
order drawn anew each round. Networks timed in one round met the machine within seconds of
each other, so their ratio pairs; the rounds are the unit of the interval (a bootstrap that
resamples whole rounds).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tvm.s_tir import meta_schedule as ms

from pipeline.tuning.comparison import RESULT_FILE, open_database, read_result
from pipeline.tuning.report import _ordered, geomean_over_tasks, markdown
from pipeline.tuning.runs import network_timer

log = logging.getLogger(__name__)

UNTUNED = "untuned"
COLUMNS = ["round", "position", "run", "cost_model", "seed", "e2e_ms", "load_avg"]


@dataclass(frozen=True)
class KeptRun:
    """A finished run of a comparison, kept with its database (comparison.keep_database)."""

    cost_model: str
    seed: int
    folder: Path

    @property
    def name(self) -> str:
        return f"{self.cost_model}-s{self.seed}"

    def kept_ms(self) -> float | None:
        """The end-to-end latency the run timed right after it tuned; None for a run kept
        before its records applied when the network compiled (it timed the untuned network)."""
        e2e = read_result(self.folder / RESULT_FILE).get("end_to_end") or {}
        return float(e2e["e2e_latency_ms"]) if pd.notna(e2e.get("e2e_latency_ms")) else None


def retime(network, target, runs: list[KeptRun], *, rounds: int, evaluator: dict, scratch: Path,
           seed: int = 0) -> pd.DataFrame:
    """`rounds` rounds, each timing the untuned `network` and the network compiled with every
    run's database once, in a random order (`seed`); one row per timing (COLUMNS)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: time at least one round")
    t0 = time.perf_counter()
    timers = {UNTUNED: (None, network_timer(ms.database.MemoryDatabase(), network.mod, target, network.inputs,
                                            **evaluator))}
    for run in runs:
        db = open_database(run.folder, scratch / run.name)
        timers[run.name] = (run, network_timer(db, network.mod, target, network.inputs, **evaluator))
    log.info("retime %s: %d networks compiled in %.0f s; %d rounds, evaluator %s", network.name, len(timers),
             time.perf_counter() - t0, rounds, evaluator)
    rng = np.random.default_rng(seed)
    names, rows = list(timers), []
    for r in range(rounds):
        for position, i in enumerate(rng.permutation(len(names))):
            run, timer = timers[names[i]]
            rows.append({"round": r, "position": position, "run": names[i],
                         "cost_model": run.cost_model if run else UNTUNED, "seed": run.seed if run else -1,
                         "e2e_ms": timer() * 1e3, "load_avg": os.getloadavg()[0]})
        log.info("retime %s: round %d of %d (%.0f s)", network.name, r + 1, rounds, time.perf_counter() - t0)
    return pd.DataFrame(rows, columns=COLUMNS)


def per_run(timings: pd.DataFrame, kept: dict[str, float | None]) -> pd.DataFrame:
    """Per run: the median, min and max over rounds, and the latency it kept when it tuned."""
    g = timings.groupby(["run", "cost_model", "seed"], sort=False)["e2e_ms"]
    out = g.agg(e2e_ms_median="median", e2e_ms_min="min", e2e_ms_max="max").reset_index()
    out["kept_ms"] = out["run"].map(kept)
    rank = {cm: i for i, cm in enumerate(_ordered(out["cost_model"]))}  # the reports' order; untuned last
    return out.assign(_rank=out["cost_model"].map(rank)).sort_values(["_rank", "seed"]).drop(
        columns="_rank").reset_index(drop=True)


def paired(timings: pd.DataFrame, baseline: str = "xgb", level: float = 0.9, resamples: int = 4000,
           seed: int = 0) -> pd.DataFrame:
    """Per cost model, the baseline's end-to-end latency / this one's in the same round and
    seed (the untuned network pairs with every seed of the baseline): the geometric mean over
    (seed, round) pairs, its bootstrap interval over rounds, each seed's geometric mean over
    rounds, and what the interval says."""
    wide = timings.pivot_table(index="round", columns="run", values="e2e_ms")
    runs = timings.drop_duplicates("run").set_index("run")[["cost_model", "seed"]]
    base = {int(s): name for name, (cm, s) in runs.iterrows() if cm == baseline}
    rng = np.random.default_rng(seed)
    rows = []
    for cm in _ordered(runs["cost_model"]):
        mine = runs.index[runs["cost_model"] == cm]
        pairs = [(s, base[s], name) for name in mine for s in base
                 if cm == UNTUNED or int(runs.loc[name, "seed"]) == s]
        if not pairs:
            continue
        logs = {s: np.log(wide[b] / wide[name]) for s, b, name in pairs}
        rounds = np.concatenate([wide.index.to_numpy()] * len(logs))
        mean, lo, hi, _ = geomean_over_tasks(rounds, np.concatenate(list(logs.values())), rng, level=level,
                                             resamples=resamples)
        per_seed = {s: float(np.exp(v.mean())) for s, v in logs.items()}
        rows.append({"cost_model": cm, "seeds": len(per_seed), "rounds": len(wide),
                     "e2e_ms_median": float(np.median(wide[list(mine)].to_numpy())),
                     f"{baseline}/this": mean, "lo": lo, "hi": hi,
                     "per_seed": ", ".join(f"{per_seed[s]:.3f}" for s in sorted(per_seed)),
                     "seeds_faster": sum(v > 1 for v in per_seed.values()),
                     "reading": ("baseline" if cm == baseline else "faster" if lo > 1 else "slower" if hi < 1
                                 else "level (interval holds 1)")})
    return pd.DataFrame(rows)


def write_report(timings: pd.DataFrame, kept: dict[str, float | None], folder: Path, *, prefix: str, heading: str,
                 evaluator: dict, baseline: str = "xgb", notes: list[str] = ()) -> tuple[str, Path]:
    """reports/<prefix>.md (both tables), <prefix>.csv (the paired table) and
    <prefix>_timings.csv (every timing)."""
    folder.mkdir(parents=True, exist_ok=True)
    table, runs = paired(timings, baseline), per_run(timings, kept)
    load = timings["load_avg"]
    text = (f"# Kept runs re-timed end to end, interleaved: {heading}\n\n"
            f"{timings['round'].nunique()} rounds; each times the untuned network and every run's once, in a new "
            f"random order (evaluator {evaluator}); load average {load.min():.2f}-{load.max():.2f}. "
            f"`{baseline}/this`: {baseline}'s latency / this one's in the same round and seed (above 1: faster "
            f"than {baseline}), the geometric mean over (seed, round) pairs, [lo, hi] 90% over rounds.\n\n"
            + "".join(f"{n}\n\n" for n in notes) + markdown(table) + "\n## Per run (ms over rounds; kept: timed "
            "right after it tuned)\n\n" + markdown(runs))
    path = folder / f"{prefix}.md"
    path.write_text(text)
    table.to_csv(folder / f"{prefix}.csv", index=False)
    timings.to_csv(folder / f"{prefix}_timings.csv", index=False)
    return text, path

