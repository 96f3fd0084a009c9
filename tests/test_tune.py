"""stage=tune: tiny real tuning comparisons (tasks; a network's heaviest tasks with a held-out
model, online update, seeds and end-to-end latency), and the report's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.config import run_stage

SEARCH = ["tune.strategy.population_size=32", "tune.strategy.init_min_unmeasured=16", "tune.runner.min_repeat_ms=10",
          "tune.strategy.genetic_num_iters=2"]
TINY = ["tune.max_tasks=1", "tune.trials=8", "tune.per_iter=8", "tune.cost_models=[ours,xgb,random]", *SEARCH]
# The smaller variant of the held-out network experiment (docs/tuning.md, Tuning on a held-out
# network): a one-layer BERT encoder over 16 tokens, its 2 heaviest tasks, 2 trials each,
# 2 seeds, the cost models of budget=transfer but random (the tiny tune above runs it); xgb's
# warm-up shortened so that its booster runs.
NETWORK = ["tune.tasks=bert_encoder", "tune.bert_layers=1", "tune.bert_seq=16", "tune.max_tasks=2", "tune.trials=2",
           "tune.per_iter=2", "tune.seeds=[0,1]", "tune.cost_models=[ours,ours_update,xgb]",
           "tune.xgb_warmup=2", "tune.costmodel.update_every=1", "tune.require_held_out=true", *SEARCH]


@pytest.fixture(scope="module")
def trained_store(collected_workspace, tmp_path_factory):
    """A static LightGBM trained by stage=train into a test-only MLflow store (alias best)."""
    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow_tune") / "mlflow.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}"]
    run_stage("train", [*over, "model=lgbm", "features=static"])
    return root, over, db


def test_tiny_tune_below_warmup_says_it_is_no_comparison(trained_store, capsys):
    import mlflow

    from pipeline.tuning.kinds import COMPARISON_COMMAND
    from pipeline.config import compose
    from pipeline.core import schema as S
    from pipeline.core.workspace import read_table
    from pipeline.summary import print_summary

    root, over, db = trained_store
    out = run_stage("tune", [*over, *TINY])
    assert out["runs"] == 3 and out["failed_runs"] == 0 and out["trials"] == 24
    trials = read_table(root / "tune_trials", S.TUNE_TRIALS)
    assert set(trials["cost_model"]) == {"ours", "xgb", "random"}
    assert trials.groupby("cost_model")["trial"].max().to_dict() == {"ours": 8, "xgb": 8, "random": 8}
    assert trials["latency_s"].notna().sum() > 0
    summary = pd.read_csv(root / "reports" / "tune.csv")
    assert list(summary["cost_model"]) == ["ours", "xgb", "random"]
    assert (summary["best_latency_us"] > 0).all() and (summary["tuning_min"] > 0).all()
    for name in ("tune.md", "tune_curves.png", "tune_curves_time.png", "tune_runs.csv", "tune_trials.csv",
                 "tune_reach.csv"):
        assert (root / "reports" / name).stat().st_size > 0
    # against wall-clock time: each cost model's line ends at its best latency, at its last trial's time
    from pipeline.tuning.report import plot_time_curves

    lines = {line.get_label(): line.get_data() for line in plot_time_curves(trials, "t").axes[0].get_lines()}
    assert set(lines) == {"ours", "xgb", "random"}
    for cm, run in trials.groupby("cost_model"):
        x, y = lines[cm]
        assert y[-1] == pytest.approx(run["latency_s"][run["latency_s"] > 0].min() * 1e6)
        assert x[-1] == pytest.approx(run["elapsed_s"].max()) and np.all(np.diff(x) >= 0)
    # 8 trials < XGBModel's warm-up of 100: the report, the result and the summary say so
    md = (root / "reports" / "tune.md").read_text()
    assert md.splitlines()[2].startswith("> **Not a comparison of cost models: XGBModel (xgb) measures 8 candidates")
    assert COMPARISON_COMMAND in md and out["note"] in md
    assert "was trained on 1 of the 1 tuned tasks" in md  # the default model saw the workspace's tasks
    capsys.readouterr()
    print_summary(compose(over), {"tune": out}, 1.0)
    printed = " ".join(capsys.readouterr().out.split())
    assert "NOTE: Not a comparison of cost models" in printed and COMPARISON_COMMAND in printed
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[root.name], filter_string="tags.stage = 'tune'")
    parent = runs[runs["tags.mlflow.parentRunId"].isna()]
    assert len(parent) == 1 and parent["tags.ours_uri"].iloc[0].endswith("@best")
    assert parent["tags.comparison"].iloc[0] == "no: below xgb's warm-up"
    client = mlflow.MlflowClient()
    art = client.list_artifacts(parent["run_id"].iloc[0], "tune")
    assert {"tune.md", "tune_curves.png"} <= {a.path.split("/")[-1] for a in art}
    # one nested run per (task, cost model): names as tags, metrics and params named as in training runs
    children = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
    assert sorted(children["tags.cost_model"]) == ["ours", "random", "xgb"] and children["tags.task"].nunique() == 1
    metrics = {c[len("metrics."):] for c in children.columns if c.startswith("metrics.") and children[c].notna().any()}
    assert {"best_latency_us", "gflops", "tuning_min", "trials"} <= metrics and not any("." in m for m in metrics)
    assert (children["params.budget.name"] == "smoke").all() and "params.budget" not in children.columns
    assert children["params.dataset.name"].eq("ops").all() and children["tags.workspace_id"].notna().all()
    ours = children[children["tags.cost_model"] == "ours"].iloc[0]
    curve = client.get_metric_history(ours["run_id"], "best_latency_us")
    assert [m.step for m in curve] == [8] and curve[-1].value == pytest.approx(
        summary.set_index("cost_model").loc["ours", "best_latency_us"])
    # The same command after an interruption: the finished runs are reused, the missing one is tuned.
    (next((root / "tune").glob("*/*/random-s0/result.json"))).unlink()
    again = run_stage("tune", [*over, *TINY])
    assert again["reused_runs"] == 2 and again["runs"] == 3 and again["trials"] == 24
    trials = read_table(root / "tune_trials", S.TUNE_TRIALS)
    assert trials.groupby("cost_model").size().to_dict() == {"ours": 8, "xgb": 8, "random": 16}
    assert list(pd.read_csv(root / "reports" / "tune.csv")["cost_model"]) == ["ours", "xgb", "random"]
    # compare after tuning: training runs only, no blank row
    compared = run_stage("compare", over)
    table = pd.read_csv(compared["report"].replace(".md", ".csv"))
    assert compared["runs"] == 1 and table["model"].notna().all() and list(table["model"]) == ["lgbm"]
    # the dataset's figures beside the comparison, and in its MLflow run
    evaluation = mlflow.search_runs(experiment_names=[root.name], filter_string="tags.stage = 'compare'")
    logged = {a.path.split("/")[-1] for a in client.list_artifacts(evaluation["run_id"].iloc[0], "reports")}
    assert {"dataset-overview.png", "label-noise.png"} <= logged, logged


def test_network_tune_with_held_out_model(trained_store):
    """The held-out network experiment end to end at the smallest size: a model registered
    under a configured name, refused if it saw a tuned task, frozen and updated online, two
    seeds with spreads, trials to xgb's best per task and for the network, end-to-end latency."""
    import mlflow

    from pipeline.tuning import TuneError

    root, over, db = trained_store
    name = f"{root.name}-heldout"  # named through config, as the documented command does
    run_stage("train", [*over, "model=lgbm", "features=static", f"mlflow.registered_model={name}"])
    uri = f"models:/{name}@best-static"
    kept = root / "kept_runs"
    out = run_stage("tune", [*over, *NETWORK, f"tune.model_uri={uri}", f"tune.results={kept}"])
    assert out["tasks"] == 2 and out["runs"] == 6 and out["failed_runs"] == 0 and "note" not in out
    # each kept run has its MetaSchedule database beside its result.json: the schedules it measured
    from pipeline.device.harness import cpu_model, cpu_signature
    from pipeline.tuning.comparison import open_database

    results = sorted(kept.rglob("result.json"))
    assert len(results) == 6
    for result in results:
        trials = [t for t in json.loads(result.read_text())["trials"] if t["error"] is None]
        row = json.loads(result.read_text())["row"]  # the CPU it was tuned on: imported runs are checked against it
        assert row["cpu_model"] == cpu_model() and row["cpu_signature"] == cpu_signature()
        records = open_database(result.parent, root / "scratch" / result.parent.name).get_all_tuning_records()
        assert len(records) == len(trials) == 4  # 2 tasks x 2 trials
        best = min(float(np.mean([float(x) for x in r.run_secs])) for r in records)
        assert best == pytest.approx(min(t["latency_s"] for t in trials))
    # the network compiled with a kept run's database runs the schedules found for its tuned tasks,
    # and no record applies to a function that was not tuned
    from pipeline.config import compose
    from pipeline.options import task_choice
    from pipeline.tuning import tasks as tuning_tasks
    from pipeline.tuning.runs import compile_with_database

    net, target = tuning_tasks.network(task_choice(compose(["stage=tune", *over, *NETWORK])), "bert_encoder", 2)
    _, replaced = compile_with_database(open_database(results[0].parent, root / "scratch" / "e2e"), net.mod, target)
    assert replaced == sorted(t.name for t in net.tasks) and len(replaced) == 2
    # a database tuned on another form of the network is refused, not timed as the untuned one
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    a = te.placeholder((4,), name="a")
    elsewhere = tvm.IRModule({"main": te.create_prim_func([a, te.compute((4,), lambda i: a[i] + 1, name="b")])})
    other = ms.database.MemoryDatabase()
    for r in open_database(results[0].parent, root / "scratch" / "e2e-other").get_all_tuning_records():
        other.commit_tuning_record(ms.database.TuningRecord(r.trace, other.commit_workload(elsewhere)))
    with pytest.raises(RuntimeError, match="none of the 4 tuning records applies"):
        compile_with_database(other, net.mod, target)
    assert out["trials"] == 2 * 2 * 3 * 2  # trials x tasks x cost models x seeds: the same for each
    reports = root / "reports"
    md = (reports / "tune-bert_encoder.md").read_text()
    assert f"{uri} (split within_task) was trained on none of the 2 tuned tasks (held out; 0 of them" in md
    assert "Not a comparison" not in md
    summary = pd.read_csv(reports / "tune-bert_encoder.csv")
    net = "bert_encoder (network)"
    assert len(set(summary["task"]) - {net}) == 2 and net in set(summary["task"])
    assert (summary["seeds"] == 2).all() and (summary.loc[summary["task"] == net, "trials"] == 4).all()
    assert (summary["best_latency_us_min"] <= summary["best_latency_us"]).all()
    assert (summary["best_latency_us"] <= summary["best_latency_us_max"]).all()
    by = summary.set_index(["task", "cost_model"])
    assert by.loc[(net, "xgb"), "reached"] == 2  # xgb reaches its own final best in every seed
    assert by.loc[(net, "ours_update"), "refits"] >= 1 and np.isnan(by.loc[(net, "xgb"), "refits"])
    assert by.loc[(net, "ours"), "refits"] == 0
    reach = pd.read_csv(reports / "tune-bert_encoder_reach.csv")
    assert list(reach.columns) == ["task", "ours", "ours_update", "xgb"] and reach["task"].iloc[-1] == net
    e2e = pd.read_csv(reports / "tune-bert_encoder_e2e.csv")
    assert list(e2e["cost_model"]) == ["ours", "ours_update", "xgb", "untuned"]
    assert (e2e["e2e_latency_ms"] > 0).all() and (e2e.loc[e2e["cost_model"] != "untuned", "seeds"] == 2).all()
    per_seed = pd.read_csv(reports / "tune-bert_encoder_network.csv")
    assert len(per_seed) == 7 and (per_seed.loc[per_seed["cost_model"] != "untuned", "tuned_tasks"] == 2).all()
    # every run timed the untuned network beside it: the machine's reference, and a speedup over it;
    # its network compiled with both tuned tasks' records, on a CPU it names
    tuned = per_seed[per_seed["cost_model"] != "untuned"]
    assert (tuned["untuned_ms"] > 0).all() and np.isfinite(tuned["speedup_vs_untuned"]).all()
    assert (tuned["records_applied"] == 2).all() and "e2e_unapplied_ms" not in per_seed
    from pipeline.device.harness import cpu_signature

    assert {json.loads(r.read_text())["row"]["cpu_signature"] for r in results} == {cpu_signature()}
    budget = pd.read_csv(reports / "tune-bert_encoder_budget.csv").set_index("cost_model")
    assert list(budget.index) == ["ours", "ours_update", "xgb"] and (budget["seeds"] == 2).all()
    last = budget.columns[-1]  # 2 tasks x 2 trials: marks at trials 1, 2, 3 and 4
    assert last == "xgb/this at 4" and budget.loc["xgb", last] == 1.0 and len(budget.columns) == 1 + 2 * 4
    for f in ("tune-bert_encoder_curves.png", "tune-bert_encoder_network.png", "tune-bert_encoder_e2e.png"):
        assert (reports / f).stat().st_size > 0
    # end to end: a bar per cost model at the mean over seeds, its error bar [min, max]
    from pipeline.tuning.report import plot_end_to_end

    ax = plot_end_to_end(per_seed, "t").axes[0]
    g = per_seed.groupby("cost_model")["e2e_latency_ms"]
    assert [p.get_height() for p in ax.patches] == pytest.approx(list(g.mean()[["ours", "ours_update", "xgb",
                                                                                 "untuned"]]))
    tops = [seg[1][1] for seg in ax.collections[0].get_segments()]
    assert tops == pytest.approx(list(g.max()[["ours", "ours_update", "xgb", "untuned"]]))
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[root.name], filter_string="tags.`tune.tasks` = 'bert_encoder'")
    parent = runs[runs["tags.mlflow.parentRunId"].isna()]
    assert len(parent) == 1 and parent["tags.comparison"].iloc[0] == "yes"
    # nested: one run per row of the summary (tasks and the network), one per (network, cost model) end to end
    children = runs[runs["tags.mlflow.parentRunId"] == parent["run_id"].iloc[0]]
    whole = children[children["tags.network"].notna()]
    assert len(children) - len(whole) == len(summary)
    assert sorted(whole["tags.cost_model"]) == ["ours", "ours_update", "untuned", "xgb"]
    assert (whole["metrics.e2e_latency_ms_min"] <= whole["metrics.e2e_latency_ms"]).all()
    assert (whole.loc[whole["tags.cost_model"] != "untuned", "metrics.speedup_vs_untuned"] > 0).all()
    # the kept runs timed again end to end, interleaved: every network once per round
    over_kept = [*over, *NETWORK, f"tune.model_uri={uri}", f"tune.results={kept}", "tune.retime.enabled=true"]
    retimed = run_stage("tune", [*over_kept, "tune.retime.rounds=2", "tune.retime.min_repeat_ms=1"])
    assert (retimed["runs"], retimed["rounds"], retimed["timings"]) == (6, 2, 2 * 7)
    timings = pd.read_csv(reports / "tune-bert_encoder_retimed_timings.csv")
    assert (timings.groupby("round")["run"].nunique() == 7).all() and (timings["e2e_ms"] > 0).all()
    table = pd.read_csv(reports / "tune-bert_encoder_retimed.csv").set_index("cost_model")
    assert list(table.index) == ["ours", "ours_update", "xgb", "untuned"] and (table["seeds"] == 2).all()
    wide = timings.pivot_table(index="round", columns="run", values="e2e_ms")
    logs = np.log(np.concatenate([wide[f"xgb-s{s}"] / wide[f"ours-s{s}"] for s in (0, 1)]))
    assert table.loc["ours", "xgb/this"] == pytest.approx(np.exp(logs.mean()))
    assert table.loc["ours", "lo"] <= table.loc["ours", "xgb/this"] <= table.loc["ours", "hi"]
    text = Path(retimed["report"]).read_text()
    assert "2 rounds" in text and f"{json.loads((kept.rglob('result.json').__next__()).read_text())['end_to_end']['e2e_latency_ms']:.3g}" in text
    # a run kept before the network compiled with its records: the latency it kept is the untuned
    # network's, so the report leaves it out and names it, and the re-timing has no kept latency for it
    for result in root.rglob("xgb-s1/result.json"):
        done = json.loads(result.read_text())
        done["end_to_end"].pop("records_applied")
        result.write_text(json.dumps(done))
    void = done["end_to_end"]["e2e_latency_ms"]
    again = run_stage("tune", [*over, *NETWORK, f"tune.model_uri={uri}", f"tune.results={kept}"])
    assert again["reused_runs"] == 6 and again["failed_runs"] == 0
    assert "End to end: 1 of 6 runs were kept before the network compiled with their records" in Path(
        again["report"]).read_text()
    per_seed = pd.read_csv(reports / "tune-bert_encoder_network.csv").set_index(["cost_model", "seed"])
    assert np.isnan(per_seed.loc[("xgb", 1), "e2e_latency_ms"]) and per_seed.loc[("xgb", 1), "e2e_unapplied_ms"] == void
    assert per_seed["e2e_unapplied_ms"].notna().sum() == 1 and per_seed.loc[("xgb", 0), "e2e_latency_ms"] > 0
    e2e = pd.read_csv(reports / "tune-bert_encoder_e2e.csv").set_index("cost_model")
    assert e2e.loc["xgb", "e2e_latency_ms"] == per_seed.loc[("xgb", 0), "e2e_latency_ms"]
    from pipeline.tuning.retime import KeptRun

    assert KeptRun("xgb", 1, next(kept.rglob("xgb-s1"))).kept_ms() is None
    assert KeptRun("xgb", 0, next(kept.rglob("xgb-s0"))).kept_ms() == per_seed.loc[("xgb", 0), "e2e_latency_ms"]
    with pytest.raises(TuneError, match="no kept run at .*-s7"):
        run_stage("tune", [*over_kept, "tune.seeds=[0,7]"])
    with pytest.raises(TuneError, match="add xgb to tune.cost_models"):
        run_stage("tune", [*over_kept, "tune.cost_models=[ours]"])
    # a model that saw a tuned task is refused before any tuning
    with pytest.raises(TuneError, match="was trained on 1 of the 1 tuned tasks"):
        run_stage("tune", [*over, *TINY, "tune.require_held_out=true", f"tune.model_uri={uri}"])


def test_network_tune_on_a_ray_cluster_gives_each_run_a_machine(trained_store):
    """executor=ray: every run of the comparison, and the untuned network, is a job that holds
    a node's `measure` slot (two nodes here, two runs at once); the rows, trials, end-to-end
    latencies and databases come back to the workspace, ours_update refits there from the
    training table it was sent, and the same command under executor=local reuses every run."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    root, over, _ = trained_store
    tune = [o for o in NETWORK if not o.startswith(("tune.cost_models=", "tune.seeds=", "tune.require_held_out="))]
    tune += ["tune.cost_models=[ours_update,random]", "tune.seeds=[3]", "tune.require_held_out=false"]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"measure": 1},
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"measure": 1})
    cluster.wait_for_nodes()
    try:
        out = run_stage("tune", [*over, *tune, "executor=ray", f"executor.address={cluster.address}"])
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert out["runs"] == 2 and out["failed_runs"] == 0 and out["reused_runs"] == 0
    assert out["trials"] == 2 * 2 * 2  # trials x tasks x cost models
    reports = root / "reports"
    runs = pd.read_csv(reports / "tune-bert_encoder_runs.csv")
    assert len(runs) == 2 * 3 and set(runs["cost_model"]) == {"ours_update", "random"}  # 2 tasks + the network
    assert runs["host"].notna().all()  # the machine that tuned each run
    summary = pd.read_csv(reports / "tune-bert_encoder.csv").set_index(["task", "cost_model"])
    assert summary.loc[("bert_encoder (network)", "ours_update"), "refits"] >= 1
    e2e = pd.read_csv(reports / "tune-bert_encoder_e2e.csv")
    assert list(e2e["cost_model"]) == ["ours_update", "random", "untuned"] and (e2e["e2e_latency_ms"] > 0).all()
    for kind in ("ours_update", "random"):
        work = next((root / "tune").glob(f"*/bert_encoder/{kind}{'-*' if kind.startswith('ours') else ''}-s3"))
        assert (work / "result.json").is_file() and (work / "database_tuning_record.json").stat().st_size > 0
    again = run_stage("tune", [*over, *tune])
    assert again["reused_runs"] == 2 and again["runs"] == 2 and again["trials"] == out["trials"]


def test_tune_refuses_profiler_model_uri(trained_store):
    from pipeline.stages.tune import TuneError

    root, over, db = trained_store
    run_stage("train", [*over, "model=lgbm", "features=profiler"])
    uri = f"models:/{root.name}-cost-model@best-profiler"
    with pytest.raises(TuneError, match="Profiler counters exist only after a kernel has run"):
        run_stage("tune", [*over, *TINY, f"tune.model_uri={uri}"])


def test_report_curves_and_reach():
    from pipeline.tuning import report as R

    lat = {"xgb": [5.0, 4.0, None, 3.0], "ours": [4.0, 2.9, 3.5, 3.1], "random": [9.0, 8.0, 7.0, 6.0]}
    rows = [{"task": "T", "cost_model": cm, "seed": 0, "trial": i + 1, "batch": i // 2 + 1, "latency_s": v,
             "elapsed_s": float(i)} for cm, vs in lat.items() for i, v in enumerate(vs)]
    trials = pd.DataFrame(rows)
    c = R.curves(trials)
    assert list(c[c["cost_model"] == "xgb"]["best_s"]) == [5.0, 4.0, 4.0, 3.0]
    runs = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "wall_s": 60.0, "error": None} for cm in lat])
    table = R.per_run(trials, runs, {"T": 3e9})
    by = table.set_index("cost_model")
    assert by.loc["xgb", "trials_to_xgb_best"] == 4 and by.loc["ours", "trials_to_xgb_best"] == 2
    assert np.isnan(by.loc["random", "trials_to_xgb_best"])
    assert by.loc["ours", "speedup_vs_xgb"] == pytest.approx(3.0 / 2.9)
    assert by.loc["xgb", "gflops"] == pytest.approx(1.0) and by.loc["xgb", "valid_trials"] == 3
    s = R.summary(table)
    assert list(s["cost_model"]) == ["xgb", "ours", "random"] and s["reached"].tolist() == [1, 1, 0]
    assert R.batch_curves(trials).groupby("cost_model")["batch"].max().to_dict() == {"ours": 2, "random": 2, "xgb": 2}


def test_report_spread_over_seeds_and_network_rows():
    """Two seeds, two tasks of a network: spreads, reach per seed, the weighted network curve."""
    from pipeline.tuning import report as R

    # per (cost model, seed): latencies of task A and B in measurement order (A, B, A, B)
    lat = {("xgb", 0): [4.0, 2.0, 3.0, 1.0], ("xgb", 1): [5.0, 2.0, 4.0, 2.0],
           ("ours", 0): [3.0, 1.0, 3.5, 1.5], ("ours", 1): [6.0, 3.0, 5.0, 3.0]}
    rows = [{"task": "AB"[i % 2], "cost_model": cm, "seed": seed, "trial": i // 2 + 1, "batch": 1, "latency_s": v,
             "elapsed_s": float(i)} for (cm, seed), vs in lat.items() for i, v in enumerate(vs)]
    trials = pd.DataFrame(rows)
    weights, flops = {"A": 2, "B": 1}, {"A": 1e9, "B": 1e9}
    curve = R.network_curve(trials, weights)
    x0 = curve[(curve["cost_model"] == "xgb") & (curve["seed"] == 0)]["weighted_s"].tolist()
    assert np.isnan(x0[0]) and x0[1:] == [10.0, 8.0, 7.0]  # 2*4+2, 2*3+2, 2*3+1
    runs = pd.DataFrame([{"task": "net", "cost_model": cm, "seed": seed, "wall_s": 60.0, "error": None}
                         for cm, seed in lat])
    net = R.network_runs(trials, runs, "net", weights, flops).set_index(["cost_model", "seed"])
    assert net.loc[("ours", 0), "best_latency_us"] == 7e6 and net.loc[("ours", 0), "trials_to_xgb_best"] == 2
    assert np.isnan(net.loc[("ours", 1), "trials_to_xgb_best"])  # 16 never reaches xgb's 10 in seed 1
    assert net.loc[("xgb", 0), "gflops"] == pytest.approx(3e9 / 7.0 / 1e9)
    table = pd.concat([R.per_run(trials, R.network_task_runs(trials, runs), flops), net.reset_index()],
                      ignore_index=True)
    s = R.summary(table).set_index(["task", "cost_model"])
    assert s.loc[("A", "ours"), "best_latency_us"] == pytest.approx(4e6)  # mean of 3 and 5
    assert (s.loc[("A", "ours"), "best_latency_us_min"], s.loc[("A", "ours"), "best_latency_us_max"]) == (3e6, 5e6)
    assert s.loc[("net (network)", "ours"), "reached"] == 1 and s.loc[("net (network)", "xgb"), "reached"] == 2
    grid = R.reach_table(R.summary(table)).set_index("task")
    assert list(grid.columns) == ["ours", "xgb"] and grid.index[-1] == "net (network)"
    assert grid.loc["net (network)", "ours"] == "2 (1/2)" and grid.loc["net (network)", "xgb"] == "3.5 [3, 4] (2/2)"
    assert grid.loc["B", "ours"] == "1 (1/2)"
    e2e = pd.DataFrame([{"network": "net", "cost_model": cm, "seed": seed, "e2e_latency_ms": v, "tuning_min": 1.0,
                         "trials": 4} for (cm, seed), v in {("xgb", 0): 10.0, ("xgb", 1): 12.0, ("ours", 0): 8.0,
                                                             ("ours", 1): 14.0}.items()])
    es = R.end_to_end_summary(e2e).set_index("cost_model")
    assert es.loc["ours", "e2e_latency_ms"] == 11.0 and es.loc["ours", "e2e_latency_ms_min"] == 8.0
    assert es.loc["ours", "speedup_vs_xgb"] == pytest.approx(1.0) and list(es.index) == ["ours", "xgb"]


def test_runs_timed_on_machines_that_differ_are_named_in_the_report():
    """Each network run times the untuned network beside it: a spread over 10% between runs (or
    against this invocation's untuned row) is named, runs kept without it are counted, and the
    speedup over the untuned network is per run."""
    from pipeline.tuning import report as R

    def table(beside: dict, now: float) -> pd.DataFrame:
        rows = [{"network": "net", "cost_model": cm, "seed": 0, "e2e_latency_ms": e2e, "untuned_ms": u,
                 "tuning_min": 1.0, "trials": 4} for cm, (e2e, u) in beside.items()]
        return pd.DataFrame([*rows, {"network": "net", "cost_model": "untuned", "seed": -1, "e2e_latency_ms": now,
                                     "tuning_min": 0.0, "trials": 0}])

    same = table({"xgb": (90.0, 100.0), "ours": (80.0, 104.0)}, 101.0)
    assert R.machine_note(same) is None
    sp = R.with_untuned_speedup(same).set_index("cost_model")["speedup_vs_untuned"]
    assert sp["xgb"] == pytest.approx(100 / 90) and sp["ours"] == pytest.approx(1.3) and sp["untuned"] == 1.0
    assert R.end_to_end_summary(same).set_index("cost_model").loc["ours", "speedup_vs_untuned"] == pytest.approx(1.3)
    slower = R.machine_note(table({"xgb": (90.0, 100.0), "ours": (110.0, 121.0)}, 120.0))
    assert "100 to 121 ms (x1.21)" in slower and "do not compare" in slower
    assert "did not time" not in slower
    kept = R.machine_note(table({"xgb": (90.0, float("nan")), "ours": (80.0, 100.0)}, 102.0))
    assert kept == ("Machines: 1 of 2 runs did not time the untuned network beside them, so whether they were "
                    "timed on one machine is not known.")
    old = table({"xgb": (90.0, 0.0), "ours": (80.0, 0.0)}, 120.0).drop(columns="untuned_ms")
    assert "2 of 2 runs" in R.machine_note(old) and R.with_untuned_speedup(old)["speedup_vs_untuned"].isna().sum() == 2


def test_paired_speedup_known_answers():
    """Geometric mean over (task, seed) pairs, an interval from resampling tasks, wins; the
    network's row and the baseline itself left out."""
    from pipeline.tuning import report as R

    speed = {("A", 0): 2.0, ("A", 1): 2.0, ("B", 0): 1.0, ("B", 1): 0.5, ("net (network)", 0): 9.0}
    detail = pd.DataFrame([{"task": t, "cost_model": "ours", "seed": s, "speedup_vs_xgb": v}
                           for (t, s), v in speed.items()]
                          + [{"task": t, "cost_model": "xgb", "seed": s, "speedup_vs_xgb": 1.0}
                             for t in "AB" for s in (0, 1)]
                          + [{"task": "A", "cost_model": "random", "seed": 0, "speedup_vs_xgb": 1.5},
                             {"task": "B", "cost_model": "random", "seed": 0, "speedup_vs_xgb": 1.5},
                             {"task": "B", "cost_model": "random", "seed": 1, "speedup_vs_xgb": float("nan")}])
    p = R.paired_speedup(detail).set_index("cost_model")
    assert list(p.index) == ["ours", "random"]
    assert p.loc["ours", "geomean_speedup_vs_xgb"] == pytest.approx((2 * 2 * 1 * 0.5) ** 0.25)
    assert (p.loc["ours", "tasks"], p.loc["ours", "pairs"], p.loc["ours", "pairs_won"]) == (2, 4, 2)
    # tasks resampled: the interval runs from B alone (sqrt(0.5)) to A alone (2)
    assert np.sqrt(0.5) - 1e-9 <= p.loc["ours", "interval_lo"] < p.loc["ours", "geomean_speedup_vs_xgb"]
    assert p.loc["ours", "geomean_speedup_vs_xgb"] < p.loc["ours", "interval_hi"] <= 2.0 + 1e-9
    assert p.loc["random", "pairs"] == 2  # the pair without a finite speedup is left out
    assert p.loc["random", "interval_lo"] == pytest.approx(1.5) == p.loc["random", "interval_hi"]


def test_retimed_runs_pair_by_round_and_seed_known_answers():
    """Re-timed kept runs: the baseline's latency / each run's in the same round and seed,
    the untuned network against every seed of the baseline, the interval over rounds."""
    from pipeline.tuning.retime import paired, per_run

    ms_ = {("xgb", 0): [100, 100, 100], ("xgb", 1): [100, 200, 100], ("ours_adapt", 0): [50, 50, 50],
           ("ours_adapt", 1): [100, 100, 100], ("untuned", -1): [200, 200, 200]}
    timings = pd.DataFrame([{"round": r, "position": 0, "run": f"{cm}-s{s}" if s >= 0 else cm, "cost_model": cm,
                             "seed": s, "e2e_ms": float(v), "load_avg": 0.5}
                            for (cm, s), values in ms_.items() for r, v in enumerate(values)])
    p = paired(timings).set_index("cost_model")
    assert list(p.index) == ["ours_adapt", "xgb", "untuned"]
    # seed 0: 2, 2, 2; seed 1: 1, 2, 1; over the six pairs the geometric mean is 2 ** (4/6)
    assert p.loc["ours_adapt", "xgb/this"] == pytest.approx(2 ** (4 / 6))
    assert p.loc["ours_adapt", "per_seed"] == f"{2.0:.3f}, {2 ** (1 / 3):.3f}"
    assert p.loc["ours_adapt", "seeds_faster"] == 2 and p.loc["ours_adapt", "reading"] == "faster"
    # rounds resampled whole: from rounds 0 and 2 alone (2 ** (1/2)) to round 1 alone (2)
    assert 2 ** 0.5 - 1e-9 <= p.loc["ours_adapt", "lo"] < p.loc["ours_adapt", "hi"] <= 2 + 1e-9
    assert p.loc["xgb", "xgb/this"] == 1 and p.loc["xgb", "reading"] == "baseline"
    # the untuned network pairs with both seeds: 1/2, 1/2, 1/2 and 1/2, 1, 1/2
    assert p.loc["untuned", "xgb/this"] == pytest.approx(2 ** (-5 / 6)) and p.loc["untuned", "reading"] == "slower"
    assert p.loc["untuned", "seeds"] == 2 and p.loc["ours_adapt", "rounds"] == 3
    runs = per_run(timings, {"xgb-s1": 123.0}).set_index("run")
    assert list(runs.index) == ["ours_adapt-s0", "ours_adapt-s1", "xgb-s0", "xgb-s1", "untuned"]
    assert (runs.loc["xgb-s1", "e2e_ms_median"], runs.loc["xgb-s1", "e2e_ms_max"]) == (100, 200)
    assert runs.loc["xgb-s1", "kept_ms"] == 123.0 and np.isnan(runs.loc["xgb-s0", "kept_ms"])


def test_budget_table_known_answers():
    """The network's latency at evenly spaced trial counts: mean [min, max] over seeds in ms and
    the baseline's latency over this one, paired by seed (a seed's NaN left out)."""
    from pipeline.tuning import report as R

    weighted = {("xgb", 0): [np.nan, 10.0, 8.0, 7.0], ("xgb", 1): [np.nan, 12.0, 10.0, 10.0],
                ("ours", 0): [np.nan, 7.0, 7.0, 7.0], ("ours", 1): [np.nan, 15.0, 13.0, 13.0],
                ("random", 0): [np.nan, np.nan, 9.0, 8.0]}
    curve = pd.DataFrame([{"cost_model": cm, "seed": seed, "trial": i + 1, "weighted_s": v}
                          for (cm, seed), vs in weighted.items() for i, v in enumerate(vs)])
    table = R.budget_table(curve, points=2).set_index("cost_model")
    assert list(table.index) == ["ours", "xgb", "random"]
    assert list(table.columns) == ["seeds", "ms at 2", "xgb/this at 2", "ms at 4", "xgb/this at 4"]
    assert table.loc["xgb", "ms at 2"] == "1.1e+04 [1e+04, 1.2e+04]" and table.loc["xgb", "xgb/this at 4"] == 1.0
    assert table.loc["ours", "ms at 4"] == "1e+04 [7e+03, 1.3e+04]"
    assert table.loc["ours", "xgb/this at 2"] == pytest.approx(np.sqrt(10 / 7 * 12 / 15))
    assert table.loc["ours", "xgb/this at 4"] == pytest.approx(np.sqrt(7 / 7 * 10 / 13))
    assert table.loc["random", "ms at 2"] == "" and np.isnan(table.loc["random", "xgb/this at 2"])
    assert table.loc["random", "xgb/this at 4"] == pytest.approx(7 / 8)  # seed 0 only
    assert R.budget_table(curve.iloc[:0]).empty


def test_report_markdown_and_files(tmp_path):
    from pipeline.tuning import report as R

    trials = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "trial": i + 1, "batch": 1,
                            "latency_s": v, "elapsed_s": float(i)}
                           for cm, vs in {"xgb": [2e-3, 1e-3], "ours": [None, 1.5e-3]}.items()
                           for i, v in enumerate(vs)])
    runs = pd.DataFrame([{"task": "T", "cost_model": cm, "seed": 0, "wall_s": 30.0, "error": None}
                         for cm in ("xgb", "ours")] + [{"task": "T", "cost_model": "random", "seed": 0,
                                                        "wall_s": float("nan"), "error": "ValueError: boom"}])
    report = R.write(trials, runs, pd.DataFrame(), folder=tmp_path, prefix="tune",
                     heading="ws, workspace", curves_title="curves", flops={"T": 1e6}, weights={"T": 1})
    lines = report.text.split("## Per task and network (mean over seeds)")[1].split("##")[0].strip().splitlines()
    head, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert len(rows) == 1 + 3 and all(set(c) <= set("-:") for c in rows[0])  # separator + 3 cost models
    by = {r[head.index("cost_model")]: dict(zip(head, r)) for r in rows[1:]}
    # best latency (us) and speedup with 3 significant digits; missing values are empty cells
    assert by["ours"]["best_latency_us"] == "1.5e+03" and by["ours"]["speedup_vs_xgb"] == "0.667"
    assert by["random"]["best_latency_us"] == "" and by["xgb"]["trials"] == "2"
    assert "## Failed runs" in report.text and "ValueError: boom" in report.text.split("## Failed runs")[1]
    assert set(report.files) == {"summary_csv", "runs_csv", "trials_csv", "reach_csv", "curves_png", "curves_time_png",
                                 "paired_csv", "report_md"}
    assert "## Paired with xgb" in report.text
    assert all(p.stat().st_size > 0 for p in report.files.values())


def test_cost_model_kinds():
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning import TuneError
    from pipeline.tuning import kinds as tuning_kinds

    assert isinstance(tuning_kinds.create("random", seed=1, threads=1), ms.cost_model.RandomModel)
    assert isinstance(tuning_kinds.create("xgb", seed=1, threads=1, xgb_warmup=4), ms.cost_model.XGBModel)
    with pytest.raises(TuneError,
                       match=r"tune.cost_models='catboost'; valid: ours, ours_update, ours_adapt, xgb, random"):
        tuning_kinds.create("catboost", seed=0, threads=1)
    for kind in tuning_kinds.OURS:
        with pytest.raises(TuneError, match=f"`{kind}` needs the loaded pipeline model"):
            tuning_kinds.create(kind, seed=0, threads=1)
    # MetaSchedule's MLPModel fails at its first update from scratch: refused before any run, saying why
    assert tuning_kinds.check_kinds(["xgb", "random"]) == ["xgb", "random"]
    with pytest.raises(TuneError, match=r"'mlp' \(MetaSchedule's MLPModel\) cannot tune from scratch.*leave it out"):
        tuning_kinds.check_kinds(["xgb", "mlp"])


def test_ours_runs_are_named_by_the_settings_their_kind_reads():
    """A setting a kind ignores leaves its runs' folder name alone, so it is not tuned again."""
    from pipeline.tuning.kinds import settings_read

    cm = dict(path=None, update=False, update_every=2, update_mode="auto", update_rounds=50, update_epochs=5,
              update_grades=4, update_handover=0, update_handover_after=0)
    more_trees = {**cm, "update_rounds": 200}
    assert settings_read("ours", cm) == settings_read("ours", more_trees) == {"update": False}
    assert settings_read("ours_adapt", cm) != settings_read("ours_adapt", more_trees)
    assert settings_read("ours_update", cm) != settings_read("ours_update", more_trees)
    # the correction is always residual trees: the refit mode and the MLP's epochs do not reach it
    assert settings_read("ours_adapt", {**cm, "update_mode": "union", "update_epochs": 9}) == settings_read("ours_adapt", cm)
    # `ours` refitting online is `ours_update`
    assert settings_read("ours", {**cm, "update": True}) == {"update": True, **settings_read("ours_update", cm)}
    # the correction's grades and hand-over: at the values runs were kept with before they were
    # settings, the names are those of before
    assert settings_read("ours_adapt", cm) == {"update_every": 2, "update_rounds": 50}
    finer = {**cm, "update_grades": 16}
    assert settings_read("ours_adapt", finer) == {**settings_read("ours_adapt", cm), "update_grades": 16}
    assert settings_read("ours_update", finer) == settings_read("ours_update", cm)
    later = {**cm, "update_handover": 64, "update_handover_after": 32}
    assert settings_read("ours_adapt", later) == {**settings_read("ours_adapt", cm), "update_handover": 64,
                                                  "update_handover_after": 32}


def test_comparison_loop_keeps_failures_as_rows(tmp_path):
    """The loop's bookkeeping, with a stand-in for what is tuned (real tuning: the tiny tune above)."""
    from pipeline.tuning.comparison import RunResult, Setup, compare
    from pipeline.tuning.runs import StrategyConfig

    class Item:
        name = "net"

        def tune(self, cost_model, seed, setup, work_dir):
            if cost_model == "flaky":
                raise ValueError("need at least one array\nto concatenate")
            rows = [{"task": "T", "index": 1, "batch": 1, "latency_s": 1e-3 * (seed + 1), "error": None,
                     "elapsed_s": 0.1}]
            return RunResult(rows, 2.0, {"e2e_latency_ms": 3.0, "tuning_min": 2.0 / 60, "trials": 1, "records_applied": 1})

    setup = Setup(None, 1, 1, StrategyConfig(), None, None, 1, tmp_path)
    out = compare([Item()], ["xgb", "flaky"], [0, 1], lambda kind, seed: kind, setup)
    assert list(zip(out.runs["cost_model"], out.runs["seed"])) == [("xgb", 0), ("flaky", 0), ("xgb", 1), ("flaky", 1)]
    assert out.runs["error"].isna().tolist() == [True, False, True, False]
    assert out.runs["error"].iloc[1] == "ValueError: to concatenate" and len(out.trials) == 2
    assert out.end_to_end[["network", "cost_model", "seed"]].values.tolist() == [["net", "xgb", 0], ["net", "xgb", 1]]
    # Run again (an interrupted comparison's command): finished runs are reused, failed ones run again.
    calls = []

    class Counted(Item):
        def tune(self, cost_model, seed, setup, work_dir):
            calls.append((cost_model, seed))
            return super().tune(cost_model, seed, setup, work_dir)

    warmed, finished = [], []
    again = compare([Counted()], ["xgb", "flaky"], [0, 1], lambda kind, seed: kind, setup,
                    before_first=lambda: warmed.append(1), on_finished=finished.append)
    assert calls == [("flaky", 0), ("flaky", 1)] and again.reused == 2 and finished == [] and warmed == [1]
    # nothing to tune: no warm-up either
    compare([Counted()], ["xgb"], [0, 1], lambda kind, seed: kind, setup, before_first=lambda: warmed.append(2))
    assert warmed == [1] and calls == [("flaky", 0), ("flaky", 1)]
    assert again.trials.equals(out.trials) and again.end_to_end.equals(out.end_to_end)
    assert again.runs.loc[again.runs["cost_model"] == "xgb", "wall_s"].tolist() == [2.0, 2.0]
    # reuse=False (force=true) tunes everything again
    calls.clear()
    compare([Counted()], ["xgb"], [0], lambda kind, seed: kind, setup, reuse=False)
    assert calls == [("xgb", 0)]


def test_finished_runs_kept_in_a_results_folder_go_on_from_another_work_folder(tmp_path):
    """tune.results: every finished run's result.json is kept in a second folder (one a
    repository commits); a comparison with an empty work folder (another machine) reuses
    them and tunes only the rest. The pipeline's model runs in folders named after it."""
    from pipeline.tuning.comparison import RunResult, Setup, compare
    from pipeline.tuning.runs import StrategyConfig

    calls = []

    class Item:
        name = "net"

        def tune(self, cost_model, seed, setup, work_dir):
            calls.append((cost_model, seed))
            rows = [{"task": "T", "index": 1, "batch": 1, "latency_s": 1e-3, "error": None, "elapsed_s": 0.1}]
            return RunResult(rows, 1.0, {"e2e_latency_ms": 3.0, "tuning_min": 1 / 60, "trials": 1})

    keep = tmp_path / "kept"
    labels = {"ours": "ours-1a2b3c4d"}
    first = Setup(None, 1, 1, StrategyConfig(), None, None, 1, tmp_path / "here", labels=labels, results=keep)
    compare([Item()], ["ours", "xgb"], [0], lambda kind, seed: kind, first)
    assert sorted(p.relative_to(keep).as_posix() for p in keep.rglob("result.json")) == [
        "net/ours-1a2b3c4d-s0/result.json", "net/xgb-s0/result.json"]
    calls.clear()
    elsewhere = Setup(None, 1, 1, StrategyConfig(), None, None, 1, tmp_path / "there", labels=labels, results=keep)
    again = compare([Item()], ["ours", "xgb"], [0, 1], lambda kind, seed: kind, elsewhere)
    assert again.reused == 2 and calls == [("ours", 1), ("xgb", 1)] and len(again.runs) == 4
    # another model for `ours`: its runs are new, MetaSchedule's own are reused
    calls.clear()
    other = Setup(None, 1, 1, StrategyConfig(), None, None, 1, tmp_path / "there", labels={"ours": "ours-ffff"},
                  results=keep)
    compare([Item()], ["ours", "xgb"], [0], lambda kind, seed: kind, other)
    assert calls == [("ours", 0)]


def test_heaviest_tasks_by_weight_times_flops():
    from pipeline.tuning.comparison import TirTask
    from pipeline.tuning.tasks import heaviest

    tasks = [TirTask("a", None, 1e9, 1), TirTask("b", None, 1e8, 20), TirTask("c", None, float("nan"), 9),
             TirTask("d", None, 5e8, 3)]
    assert heaviest(tasks, 2) == [1, 3] and heaviest(tasks, None) == [1, 3, 0, 2]


def test_held_out_check_reads_the_training_split(collected_workspace):
    from pipeline.tuning import TuneError
    from pipeline.tuning.kinds import held_out
    from pipeline.core import schema as S
    from pipeline.core.workspace import read_table

    root, _ = collected_workspace
    ids = list(read_table(root / "tasks.parquet", S.TASKS)["task_id"])
    info = {"run_id": "r1", "uri": "models:/m@a", "split": "by_task", "workspace_path": str(root),
            "split_known": True, "test_tasks": [ids[0]], "test_networks": []}
    ok = held_out(info, {"T0": ids[0], "new": "0123456789abcdef"}, require=True)
    assert ok.known and ok.seen == [] and ok.text.endswith(
        "trained on none of the 2 tuned tasks (held out; 1 of them are test tasks of its split, the others not in "
        "its workspace).")
    seen = held_out(info, {"T0": ids[0], "T1": ids[1]}, require=False)
    assert seen.seen == ["T1"] and "trained on 1 of the 2 tuned tasks" in seen.text
    with pytest.raises(TuneError, match=r"was trained on 1 of the 2 tuned tasks \(T1\).*split=by_network"):
        held_out(info, {"T0": ids[0], "T1": ids[1]}, require=True)
    folder = {"uri": "/some/folder"}
    assert not held_out(folder, {"T0": ids[0]}, require=False).known
    with pytest.raises(TuneError, match="loaded from a folder, not an MLflow run"):
        held_out(folder, {"T0": ids[0]}, require=True)
    with pytest.raises(TuneError, match="is not on this machine"):
        held_out({**info, "workspace_path": "/nowhere/ws"}, {"T0": ids[0]}, require=True)


def test_warmup_note_and_the_documented_comparison():
    from pipeline.tuning.kinds import COMPARISON_COMMAND, warmup_note

    assert warmup_note(["ours", "random"], 8, 100) is None  # no xgb: nothing claimed about it
    assert warmup_note(["ours", "xgb"], 640, 100) is None
    note = warmup_note(["ours", "xgb"], 32, 100)
    assert note.startswith("Not a comparison of cost models: XGBModel (xgb) measures 32 candidates per run, "
                           "fewer than its warm-up of 100") and COMPARISON_COMMAND in note
    docs = (Path(__file__).resolve().parents[1] / "docs" / "tuning.md").read_text()
    assert COMPARISON_COMMAND in " ".join(docs.split())  # the tuning page documents that very command


def test_ctrl_c_during_tune_exits_130_keeps_finished_runs_and_never_the_one_in_progress(trained_store, tmp_path):
    """Ctrl-C to the process group, as a terminal sends it, while the second of four runs
    tunes: exit code 130 with one line and no traceback; the first run's result is kept, the
    run in progress is not saved (its runner workers died with the Ctrl-C), and the same
    command then reuses the first run and tunes the others."""
    import time

    from conftest import ctrl_c, pipeline_in_a_terminal

    root, over, db = trained_store
    args = [*over, "stage=tune", "tune.max_tasks=1", "tune.trials=40", "tune.per_iter=8",
            "tune.cost_models=[random,xgb]", "tune.seeds=[0,1]", *SEARCH]
    started = time.time()

    def saved():
        return [p for p in root.glob("tune/*/*/*/result.json") if p.stat().st_mtime >= started]

    def tuning():  # a run folder with MetaSchedule's database and no result yet
        return [d for d in root.glob("tune/*/*/*") if d.stat().st_mtime >= started - 1
                and not (d / "result.json").exists() and list(d.rglob("database_tuning_record.json"))]

    with pipeline_in_a_terminal([*args, f"hydra.run.dir={tmp_path / 'run'}"]) as proc:
        deadline = time.time() + 400
        while not (saved() and tuning()):
            assert time.time() < deadline and proc.poll() is None, "no run finished, or none tuning after it"
            time.sleep(0.05)
        finished = len(saved())
        text = ctrl_c(proc)
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and len([x for x in text.splitlines() if "interrupted during stage=tune" in x]) == 1
    kept = saved()
    assert len(kept) == finished < 4 and all(json.loads(k.read_text())["row"]["error"] is None for k in kept)
    # the finished runs' trials are in the workspace's trials table already, and only theirs
    from pipeline.core import schema as S
    from pipeline.core.workspace import read_table

    table = read_table(root / "tune_trials", S.TUNE_TRIALS)
    table = table[table["tune_run"] == table["tune_run"].max()]
    runs = {(r["row"]["cost_model"], r["row"]["seed"]) for r in map(lambda k: json.loads(k.read_text()), kept)}
    assert set(zip(table["cost_model"], table["seed"])) == runs and len(table) == 40 * finished
    out = run_stage("tune", [*over, *args[len(over) + 1:]])
    assert out["reused_runs"] == finished and out["runs"] == 4 and out["failed_runs"] == 0
