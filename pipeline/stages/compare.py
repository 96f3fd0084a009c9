"""stage=compare: the workspace's training runs side by side, and aggregated over splits.

Reads the runs with `mlflow.search_runs` (the same store `mlflow ui` shows): the training
runs of this workspace (by identity, models/tracking.py; tune runs have their own report)
that the keys which select runs in stage=train select here too: `split`, `model` (model=all:
the models of `train.models`) and `features` (features=each: the sets of `train.features`).
Keeps the newest run of each (model, features, split, held-out networks, seed) unless
`compare.latest_only=false`, and writes to <workspace>/reports/, <sel> saying what was
selected (`-by_task`, `-within_task-lgbm-static`, `-by_network-all_runs`, ...) so that the
jobs of a sweep (`-m stage=compare split=within_task,by_task`) each keep theirs:

  compare<sel>.csv / .md    one row per run (test part; validation top-1 beside it)
  evaluation<sel>.md        the runs aggregated (models/evaluation.py): leave-one-network-out,
                            one row per held-out network and model with the spread over seeds
                            and the mean over networks; every split over its seeds; the
                            ablation, ordered by the validation metric that chooses
                            (`mlflow.best_metric`)
  heldout<sel>.csv, splits<sel>.csv, ablation<sel>.csv   the same tables with every column
  per_task<sel>.csv         per held-out network, task and model: the task's share of the
                            network's best-case time and of the time the model's first picks
                            take, the model's top-1 score on it and that score minus ms_xgb's
                            (where a network's figure is won or lost)
  against<sel>.csv          with compare.against=<workspace>: each model here minus the same
                            model trained there, paired over the held-out tasks both tested on
  compare<sel>.png          mean test metrics per (model, features, split); heldout<sel>.png:
                            test top-1 per held-out network with the spread over seeds

The aggregated tables are logged to MLflow as a run tagged stage=compare (tag `report`:
compare<sel>).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from models import evaluation as E
from models import dataset_figures, plots, registry, tracking
from models.metrics import ALL_METRICS
from pipeline.core import locks
from pipeline.core import release as R
from pipeline.core.workspace import Workspace, WorkspaceError
from pipeline.options import tracking_store, workspace_of
from pipeline.summary import with_values

log = logging.getLogger(__name__)

FIRST = ["model", "features", "split", "heldout", "seed"]
SHOWN = {"test_top1_score": "top-1", "test_top5_score": "top-5", "test_pair_acc": "pair acc",
         "test_topk_pair_acc": "top-k pair acc", "test_spearman": "Spearman"}
REFERENCE_PREFIX = "trained on "  # compare.against: the other workspace's runs, as the reference model
EACH = "each"  # features=each (conf/features/each.yaml): every set of train.features


def selection(cfg) -> dict[str, list[str]]:
    """The runs to compare, by run tag: what stage=train with the same keys trains."""
    models = cfg.train.models if str(cfg.model.name) == registry.ALL else [cfg.model.name]
    features = cfg.train.features if str(cfg.features.name) == EACH else [cfg.features.name]
    return {"split": [str(cfg.split.name)], "model": [str(m) for m in models], "features": [str(f) for f in features]}


def report_name(cfg, kind: str = "compare") -> str:
    """`<kind>-<split>[-<model>][-<features>][-all_runs]`: a report of what this comparison
    selected (kind: compare, evaluation, heldout, splits, ablation)."""
    parts = [kind, str(cfg.split.name)]
    parts += [str(cfg.model.name)] if str(cfg.model.name) != registry.ALL else []
    parts += [str(cfg.features.name)] if str(cfg.features.name) != EACH else []
    parts += [] if bool(cfg.compare.latest_only) else ["all_runs"]
    return "-".join(parts)


def comparison_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run: model, features, split, heldout, seed, every test metric, then val/timing columns."""
    runs = tracking.with_split_tags(runs)
    out = pd.DataFrame({k: runs[f"tags.{k}"] for k in FIRST[:3]})
    out["heldout"], out["seed"] = runs["tags.heldout"], runs["tags.split_seed"]
    metric_cols = [f"test_{m}" for m in (*ALL_METRICS, "topk_pair_acc")] + \
                  [f"val_{m}" for m in ("top1_score", "peak1", "pair_acc")] + \
                  ["train_seconds", "predict_per_s", "n_train", "n_val", "n_test", "test_n_tasks", "test_n_tasks_topk"]
    for m in metric_cols:
        col = f"metrics.{m}"
        out[m] = runs[col].astype(float) if col in runs.columns else np.nan
    out["run_id"] = runs["run_id"]
    out["start_time"] = runs["start_time"]
    order = {"ms_xgb": 1}  # the reference row last within each feature set
    out = out.assign(_o=out["model"].map(order).fillna(0)).sort_values(["split", "heldout", "seed", "features", "_o",
                                                                        "model"])
    return out.drop(columns="_o").reset_index(drop=True)


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub table: integers and values of 1000 or more without decimals, others with 3."""
    def fmt(v):
        if isinstance(v, float):
            if np.isnan(v):
                return ""
            return f"{v:.0f}" if abs(v) >= 1000 or float(v).is_integer() else f"{v:.3f}"
        return v

    return df.map(fmt).to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def _tasks_column(table: pd.DataFrame) -> pd.Series:
    """"counted / all" test tasks of a row (top-k figures count only the first)."""
    topk = table.get("test_n_tasks_topk", pd.Series(np.nan, index=table.index))
    n = table.get("test_n_tasks", pd.Series(np.nan, index=table.index))
    return pd.Series([f"{a:.0f} / {b:.0f}" if pd.notna(a) and pd.notna(b) else "" for a, b in zip(topk, n)],
                     index=table.index)


def heldout_report(table: pd.DataFrame) -> pd.DataFrame:
    """The leave-one-network-out table as shown: test metrics with their spread."""
    shown = E.with_spread(table, list(SHOWN))
    shown = shown.assign(**{"top-k tasks": _tasks_column(table)})
    cols = ["heldout", "model", "features", *SHOWN, "top-k tasks", "n_seeds"]
    return shown[cols].rename(columns={**SHOWN, "heldout": "held out", "n_seeds": "seeds"})


def split_report(table: pd.DataFrame) -> pd.DataFrame:
    shown = E.with_spread(table, list(SHOWN))
    shown = shown.assign(**{"top-k tasks": _tasks_column(table)})
    return shown[["split", "model", "features", *SHOWN, "top-k tasks", "n_runs"]].rename(
        columns={**SHOWN, "n_runs": "runs"})


def _models(cfg, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the models `compare.models` names (null = every model), in that order."""
    names = cfg.compare.get("models")
    if table.empty or not names:
        return table
    rank = {str(n): i for i, n in enumerate([*names, E.RANDOM])}  # chance stays in every table
    keep = table[table["model"].isin(list(rank))]
    keep = keep.assign(_r=keep["model"].map(rank))
    keys = [c for c in ("split", "features") if c in keep.columns]
    if "heldout" in keep.columns:
        keep = keep.assign(_last=keep["heldout"] == E.MEAN)
        keys += ["_last", "heldout"]
    keep = keep.sort_values([*keys, "_r"], kind="stable")
    return keep.drop(columns=[c for c in ("_r", "_last") if c in keep.columns]).reset_index(drop=True)


def heldout_per_task(runs: pd.DataFrame) -> pd.DataFrame:
    """The by_network runs' per-task test tables (the tasks the top-k figures count), with
    each run's model, features, held-out network and seed."""
    runs = tracking.with_split_tags(runs)
    runs = runs[runs["tags.split"] == "by_network"]
    tables = tracking.per_task_tables(runs)
    if tables.empty or "top1_s" not in tables.columns:
        return pd.DataFrame()
    tags = runs.set_index("run_id")[["tags.model", "tags.features", "tags.heldout", "tags.split_seed"]]
    tags.columns = ["model", "features", "heldout", "seed"]
    per_task = tables.join(tags, on="run_id")
    return per_task[per_task["topk"].astype(bool)]


def network_weights(ws: Workspace) -> pd.DataFrame:
    return ws.read("network_tasks", columns=["network", "task_id", "weight"]).rename(columns={"network": "heldout"})


def heldout_task_tables(ws: Workspace, runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """From the by_network runs' per-task tables: the paired bootstrap intervals of each model
    against ms_xgb per held-out network (models/evaluation.py `paired_intervals`) and the same
    comparison task by task, with each task's name and share of its network's time
    (`per_task_scores`)."""
    per_task, weights = heldout_per_task(runs), network_weights(ws)
    if per_task.empty:
        return {"intervals": pd.DataFrame(), "per_task": pd.DataFrame()}
    names = ws.read("tasks", columns=["task_id", "name"]).drop_duplicates("task_id")
    scores = E.per_task_scores(per_task, weights).merge(names, on="task_id", how="left")
    return {"intervals": E.paired_intervals(per_task, weights), "per_task": scores}


def validation_networks(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Per held-out network, the training networks its runs validated on (`split.val_unit=network`,
    from each run's `split.info`): every training network once is nested leave-one-network-out."""
    if "params.split.info" not in runs.columns:
        return {}
    out: dict[str, set] = {}
    for held, info in zip(runs["tags.heldout"], runs["params.split.info"]):
        out.setdefault(str(held), set()).update(tracking.validation_networks_of(info))
    return {held: sorted(nets) for held, nets in sorted(out.items()) if nets}


def against_intervals(cfg, ws: Workspace, store: tracking.Store, runs: pd.DataFrame) -> pd.DataFrame:
    """Each model trained here minus the same model trained on workspace `compare.against`
    (the same selection of its runs), paired over the held-out tasks both tested on: what
    this workspace's training data bought over the other's."""
    other = str(cfg.compare.against)
    theirs = tracking.experiment_runs(store.uri, other, workspace=other)
    if theirs.empty:
        raise WorkspaceError(f"compare.against={other}: no training run of workspace {other} in {store.uri}: train "
                             f"the same selection there first (stage=train with its dataset), or name another "
                             f"workspace")
    theirs, *_ = select_runs(cfg, ws, theirs)
    mine, base = heldout_per_task(runs), heldout_per_task(theirs)
    if mine.empty or base.empty:
        return pd.DataFrame()
    shared = mine[["heldout", "task_id"]].merge(base[["heldout", "task_id"]].drop_duplicates())
    reference = f"{REFERENCE_PREFIX}{other}"
    out = []
    for model in sorted(set(mine["model"]) & set(base["model"])):
        pair = pd.concat([mine[mine["model"] == model], base[base["model"] == model].assign(model=reference)])
        pair = pair.merge(shared.drop_duplicates(), on=["heldout", "task_id"])
        out.append(E.paired_intervals(pair, network_weights(ws), reference=reference))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def pair_intervals(ws: Workspace, runs: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """Each pair of `compare.pairs` paired over the held-out tasks (models/evaluation.py
    `paired_intervals` with the pair's reference): the over-task interval of any two models,
    as the `intervals` table gives it against ms_xgb."""
    per_task = heldout_per_task(runs) if pairs else pd.DataFrame()
    if per_task.empty:
        return pd.DataFrame()
    out = [E.paired_intervals(per_task[per_task["model"].isin([model, reference])], network_weights(ws),
                              reference=reference).assign(reference=reference)
           for model, reference in pairs]
    return pd.concat(out, ignore_index=True)


def model_pairs(cfg, models: set[str]) -> list[tuple[str, str]]:
    """`compare.pairs` as (model, reference) pairs of models this selection has runs of."""
    pairs = [tuple(str(m) for m in p) for p in cfg.compare.get("pairs") or ()]
    bad = [p for p in pairs if len(p) != 2 or not set(p) <= models]
    if bad:
        raise WorkspaceError(f"compare.pairs={[list(p) for p in bad]}: each pair is [model, reference], both among the "
                             f"selected runs' models ({', '.join(sorted(models))}); train them or fix the names")
    return pairs


def margin_report(table: pd.DataFrame) -> pd.DataFrame:
    text = [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(table["diff"], table["lo"], table["hi"])]
    won = [f"{w}/{n}" for w, n in zip(table["won"], table["n_runs"])]
    wide = table.assign(margin=text, won=won).pivot_table(
        index=["split", "features", "model", "reference"], columns="metric", values=["margin", "won"],
        aggfunc="first", sort=False)
    metrics = list(dict.fromkeys(table["metric"]))
    wide = wide[[(v, m) for m in metrics for v in ("margin", "won")]]
    wide.columns = [f"{m} {v}" if v == "won" else m for v, m in wide.columns]
    return wide.reset_index().rename(columns={"model": "model minus"})


def interval_report(table: pd.DataFrame) -> pd.DataFrame:
    """Over-task intervals as the report shows them; a `reference` column (the pairs of
    `compare.pairs`) is kept beside the model, else the reference is ms_xgb."""
    text = [f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]" for d, lo, hi in zip(table["diff"], table["lo"], table["hi"])]
    minus = "top-1 minus reference" if "reference" in table else f"top-1 minus {E.REFERENCE}"
    cols = ["heldout", "model", *(["reference"] if "reference" in table else []), "features", minus, "n_tasks", "n_seeds"]
    return table.assign(**{minus: text})[cols].rename(
        columns={"heldout": "held out", "n_tasks": "tasks", "n_seeds": "seeds"})


def label_noise(ws: Workspace) -> str:
    """The labels' agreement with a re-measurement of the same kernels (the ceiling of any
    model on them), from benchmarks/measurement_noise.py's report or the release's card."""
    path = ws.root / "reports" / "measurement_noise.json"
    origin = R.workspace_release(ws.root) or {}
    parts = [p for p in origin.get("parts") or [] if p.get("label_noise")]
    if path.is_file() or len(parts) < 2:
        noise = json.loads(path.read_text()) if path.is_file() else origin.get("label_noise")
        return (f"the stored labels agree with a re-measurement of {noise['tasks']} tasks x {noise['records']} "
                f"kernels on pairwise accuracy {noise['stored_pair']:.3f} and top-1 score {noise['stored_top1']:.3f}; "
                f"no model can be expected to do better against these labels.") if noise else ""
    each = "; ".join(f"the tasks of release {p['name']}: pairwise accuracy {p['label_noise']['stored_pair']:.3f}, "
                     f"top-1 score {p['label_noise']['stored_top1']:.3f} ({p['label_noise']['tasks']} tasks x "
                     f"{p['label_noise']['records']} kernels re-measured)" for p in parts)
    return (f"the stored labels agree with a re-measurement of {each}; no model can be expected to do better "
            f"against these labels.")


def read_runs(cfg, ws: Workspace, store: tracking.Store):
    """The workspace's training runs, read while no stage=train adds some (only whole
    trainings, pipeline/core/locks.py), and a line that says when and after what wait."""
    with locks.runs_lock(ws.root, "compare", wait_s=float(cfg.lock.wait_s)) as joined:
        every = tracking.workspace_runs(store)
        read_at = time.strftime("%Y-%m-%d %H:%M:%S")
    pids = ", ".join(f"pid {h.get('pid')}" for h in joined.waited_for)
    waited = f", after waiting {joined.waited_s:.0f} s for stage=train ({pids}) to end" if pids else ""
    if every.empty:
        raise WorkspaceError(
            f"no MLflow training run for workspace {ws.root} in {store.uri} (experiment "
            f"{store.experiment}): run `python -m pipeline stage=train` first (same mlflow.tracking_uri).")
    return every, f"training runs read at {read_at} with no stage=train running on this workspace{waited}"


def select_runs(cfg, ws: Workspace, every: pd.DataFrame):
    """(the selected runs, the mask over `every`, the selection, its text)."""
    sel = selection(cfg)
    chosen = np.logical_and.reduce([every[f"tags.{k}"].isin(v) for k, v in sel.items()])
    runs = every[chosen]
    what = ", ".join(f"{k}={'/'.join(v)}" for k, v in sel.items())
    if runs.empty:
        raise WorkspaceError(
            f"none of the {len(every)} training runs of workspace {ws.name} is one of {what}: train them with "
            f"`python -m pipeline stage=train split={cfg.split.name}`, or select others with split=, model=, features=")
    if bool(cfg.compare.latest_only):
        runs = tracking.latest_per_config(runs)
    return runs, chosen, sel, what


def report_paths(cfg, ws: Workspace) -> dict[str, Path]:
    reports = ws.root / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    paths = {ext: reports / f"{report_name(cfg)}.{ext}" for ext in ("csv", "md", "png")}
    paths.update({kind: reports / f"{report_name(cfg, kind)}.{ext}" for kind, ext in (
        ("evaluation", "md"), ("heldout", "csv"), ("splits", "csv"), ("ablation", "csv"), ("intervals", "csv"),
        ("margins", "csv"), ("pairs", "csv"), ("per_task", "csv"), ("features", "csv"))})
    paths["heldout_png"] = reports / f"{report_name(cfg, 'heldout')}.png"
    if cfg.compare.get("against"):
        paths["against"] = reports / f"{report_name(cfg, 'against')}.csv"
    return paths


def _section(title: str, intro: str, table: pd.DataFrame) -> list[str]:
    """A section of evaluation-<...>.md: its heading, what the table says, the table."""
    return [f"## {title}\n", intro + "\n", to_markdown(table)]


def evaluation_text(cfg, ws: Workspace, what: str, select: str, tables: dict,
                    validated_on: dict[str, list[str]] | None = None) -> str:
    """evaluation-<...>.md: the held-out networks, the paired intervals, the splits, the ablation."""
    heldout, intervals, splits, ablation = (tables[k] for k in ("heldout", "intervals", "splits", "ablation"))
    text = [f"# Evaluation of workspace {ws.name}: {what}\n",
            f"Means with [min, max]: over seeds per held-out network, over held-out networks in the `mean` rows, over "
            f"runs (seeds) per split. Test part; top-k figures (top-1, top-5, top-k pair acc) over the tasks with at "
            f"least {cfg.train.topk_min_records} test records (`top-k tasks`: counted / all). Models are chosen on "
            f"{select} only (the ablation); the test columns are the report.\n"]
    if validated_on:
        text += ["Validation: one whole training network per run (`split.val_unit=network`, the seed-th in name "
                 "order). The training networks the runs of each held-out network validated on: "
                 + "; ".join(f"{held} {len(nets)} ({', '.join(nets)})" for held, nets in validated_on.items())
                 + ".\n"]
    ceiling = label_noise(ws)
    if ceiling:
        text += [f"Label-noise ceiling (`oracle`): {ceiling}\n"]
    if len(heldout):
        text += ["## Leave one network out\n", to_markdown(heldout_report(_models(cfg, heldout)))]
    if len(intervals):
        text += [f"## Against {E.REFERENCE}, paired over held-out tasks\n",
                 f"Test top-1 score of each model minus {E.REFERENCE}'s on the same tasks, mean over seeds, with a "
                 f"{E.LEVEL:.0%} paired bootstrap interval over the held-out tasks (the `mean` rows: over networks, "
                 f"each resampled on its own). An interval above 0 says the model picks better than "
                 f"{E.REFERENCE} on such networks. Task by task (each task's share of its network's best-case "
                 f"time, each model's top-1 score on it and that minus {E.REFERENCE}'s): "
                 f"{report_name(cfg, 'per_task')}.csv.\n", to_markdown(interval_report(_models(cfg, intervals)))]
    against = tables.get("against")
    if against is not None and len(against):
        other = str(cfg.compare.against)
        text += [f"## Against the same models trained on {other}\n",
                 f"Test top-1 score of each model trained here minus the same model trained on workspace {other}, "
                 f"on the held-out tasks both were tested on, mean over seeds, with a {E.LEVEL:.0%} paired bootstrap "
                 f"interval over those tasks: what this workspace's training data bought.\n",
                 to_markdown(interval_report(_models(cfg, against)).rename(
                     columns={f"top-1 minus {E.REFERENCE}": f"top-1 minus trained on {other}"}))]
    margins = tables.get("margins")
    if margins is not None and len(margins):
        text += _section("Paired over runs",
                 f"Per split and features, the model of the best mean {select} (the choice; never the reference, {E.REFERENCE}) minus every other model, then the "
                 f"pairs of `compare.pairs`: the mean over the runs both have (same held-out part and seed) of the "
                 f"difference, a {E.LEVEL:.0%} bootstrap interval over those runs, and the runs won. A choice whose "
                 f"{select} margin holds 0 is not resolved by validation.", margin_report(margins))
    pairs = tables.get("pairs")
    if pairs is not None and len(pairs):
        text += _section("The pairs of `compare.pairs`, paired over held-out tasks",
                 f"Test top-1 score of each pair's model minus its reference's on the same held-out tasks, mean over "
                 f"seeds, with a {E.LEVEL:.0%} paired bootstrap interval over the tasks (the `mean` rows: over "
                 f"networks, each resampled on its own), as the section against {E.REFERENCE} gives it.",
                 interval_report(pairs))
    features = tables.get("features")
    if features is not None and len(features):
        text += _section("Feature sets, paired over runs",
                 f"Per split, each model on a feature set minus the same model on static features, then each minus "
                 f"{E.REFERENCE} (its own static features): the mean over the runs both have (same held-out part and "
                 f"seed, so the same test records) of the difference, a {E.LEVEL:.0%} bootstrap interval over those "
                 f"runs, and the runs won.", margin_report(features))
    if len(splits):
        text += ["## Every split, over its runs\n", to_markdown(split_report(_models(cfg, splits)))]
    if len(ablation):
        text += [f"## Ablation (ordered by {select}, the selection metric)\n", to_markdown(ablation)]
    return "\n".join(text)


def print_tables(cfg, heldout: pd.DataFrame, splits: pd.DataFrame) -> None:
    for title, report in (
            ("leave one network out (test part, mean [min, max] over seeds; mean rows over networks)",
             heldout_report(_models(cfg, heldout)) if len(heldout) else None),
            ("every split over its runs (test part)", split_report(_models(cfg, splits)) if len(splits) else None)):
        if report is None:
            continue
        report, empty = with_values(report)
        print(f"{title}:")
        print(report.to_string(index=False))
        if empty:
            print(f"  no value in any run: {', '.join(empty)} (a top-k figure counts only tasks with >= "
                  f"{cfg.train.topk_min_records} test records: train.topk_min_records)")


def run(cfg) -> dict:
    ws = workspace_of(cfg)
    store = tracking_store(cfg)
    select = store.best_metric
    every, state = read_runs(cfg, ws, store)
    runs, chosen, sel, what = select_runs(cfg, ws, every)
    runs = tracking.validation_on_own_networks(runs)  # runs logged before it was so scored read alike
    table = comparison_table(runs)
    name, paths = report_name(cfg), report_paths(cfg, ws)
    shown, empty = with_values(table.drop(columns=["run_id", "start_time"]))
    table.to_csv(paths["csv"], index=False)  # every column, empty ones too
    paths["md"].write_text(
        f"# Cost models of workspace {ws.name}: {what}\n\nTest part of each run's split (val_*: validation part); "
        f"top-k figures over tasks with at least {cfg.train.topk_min_records} test records (test_n_tasks_topk); "
        f"metrics defined in models/metrics.py. MLflow: {store.uri}, experiment "
        f"{store.experiment}; {state}.\n\n" + to_markdown(shown)
        + (f"\nNo value in any run (not shown): {', '.join(empty)}.\n" if empty else ""))

    # the aggregation reads the runs this selection kept
    frame = E.run_frame(tracking.with_split_tags(runs))
    tables = {"ablation": E.ablation_table(E.heldout_table(frame), select)}
    frame = E.with_random_rows(frame)
    pairs = model_pairs(cfg, set(frame["model"]))
    tables.update(heldout=E.heldout_table(frame), splits=E.split_table(frame), **heldout_task_tables(ws, runs),
                  margins=E.paired_over_runs(frame, select, pairs), pairs=pair_intervals(ws, runs, pairs),
                  features=E.feature_margins(frame))
    if cfg.compare.get("against"):
        tables["against"] = against_intervals(cfg, ws, store, runs)
    for k, df in tables.items():
        df.to_csv(paths[k], index=False)
    heldout, splits = tables["heldout"], tables["splits"]
    paths["evaluation"].write_text(evaluation_text(cfg, ws, what, select, tables, validation_networks(runs)))
    files = [paths[k] for k in ("csv", "md", "evaluation", "heldout", "splits", "ablation", "intervals", "margins",
                                "pairs", "per_task", "features", "against")
             if k in paths]
    if len(splits):
        chart = splits.assign(run=splits["model"] + "/" + splits["features"] + "/" + splits["split"])
        plots.save(plots.compare_chart(chart, [str(m) for m in cfg.compare.chart_metrics]), paths["png"])
        files.append(paths["png"])
    if len(heldout):
        plots.save(plots.heldout_chart(_models(cfg, heldout), "test_top1_score"), paths["heldout_png"])
        files.append(paths["heldout_png"])
    files += dataset_figures.write(ws).values()
    run_id = tracking.log_evaluation(
        store, tables={"runs": shown, **tables}, files=files,
        params={"select": select, "topk_min_records": cfg.train.topk_min_records, "runs": len(table),
                "latest_only": cfg.compare.latest_only, **{f"selection.{k}": "/".join(v) for k, v in sel.items()}},
        tags={"report": name})
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(f"\nstage=compare, workspace {ws.name}, {what}: {len(table)} runs ({state})")
        print_tables(cfg, heldout, splits)
        left = int((~chosen).sum())
        if left:
            print(f"{left} other training runs of this workspace (select them with split=, model=, features=)")
        print(f"written: {paths['md']}, {paths['evaluation'].name}, {name}.csv and the tables and charts beside "
              f"them (MLflow run {run_id})")
    return {"runs": len(table), "report": str(paths["md"]), "evaluation": str(paths["evaluation"]),
            "heldout_rows": len(heldout), "ablation_rows": len(tables["ablation"]),
            "margins_rows": len(tables["margins"]), "pairs_rows": len(tables["pairs"]),
            **({"against_rows": len(tables["against"])} if "against" in tables else {})}
