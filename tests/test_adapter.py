"""pipeline.tuning.cost_model: a trained pipeline model as a MetaSchedule cost model, on real candidates."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.config import run_stage


@pytest.fixture(scope="module")
def registry_store(collected_workspace, tmp_path_factory):
    """A static LightGBM and a profiler LightGBM trained by stage=train into a test-only MLflow store."""
    import mlflow

    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow_adapter") / "mlflow.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}", "model=lgbm"]
    run_stage("train", [*over, "features=static"])
    run_stage("train", [*over, "features=profiler"])
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    name = f"{root.name}-cost-model"
    return root, over, f"models:/{name}@best-static", f"models:/{name}@best-profiler"


def _task_candidates(root, row: int = 0):
    """(TuneContext, MeasureCandidates, record ids, measured seconds) of one workspace task."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.core import schema as S
    from features.static import schedule_from_trace
    from models.tables import successful_measurements
    from pipeline.core import database as D
    from pipeline.shims.targets import make_target
    from pipeline.core.workspace import Workspace, read_table

    ws = Workspace(root)
    task = read_table(ws.tasks, S.TASKS).iloc[row]
    mod = D.load_workload_mod(D.read_workload_lines(ws)[int(task.workload_index)])
    cands = read_table(ws.candidates, S.CANDIDATES).dropna(subset=["trace_json"])
    cands = cands[cands["task_id"] == task.task_id].merge(successful_measurements(ws)[["record_id", "mean_s"]])
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    mc = [ms.MeasureCandidate(schedule_from_trace(mod, t), args) for t in cands["trace_json"]]
    ctx = ms.TuneContext(mod=mod, target=make_target(json.loads(task.target)), num_threads=1)
    return ctx, mc, list(cands["record_id"]), list(cands["mean_s"])


def test_predict_on_sampled_candidates(registry_store):
    """Candidates drawn by MetaSchedule's own sampler: one float64 score each, all positive."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel
    from pipeline.stages.sample import draw_candidates

    root, _, uri, _ = registry_store
    cm = PipelineCostModel.from_uri(uri, threads=1)
    ctx, _, _, _ = _task_candidates(root)
    schs = draw_candidates(ctx.mod, ctx.target, 12, "replay-trace", 1, 1)
    args = ms.arg_info.ArgInfo.from_prim_func(ctx.mod["main"])
    cands = [ms.MeasureCandidate(s, args) for s in schs]
    scores = cm.predict(ctx, cands)
    assert isinstance(scores, np.ndarray) and scores.dtype == np.float64 and len(scores) == len(cands) > 0
    assert np.isfinite(scores).all() and (scores > 0).all()
    # Through MetaSchedule's C++ interface, as the search strategy calls it.
    via_ffi = ms.cost_model.CostModel.predict(cm, ctx, cands)
    np.testing.assert_array_equal(via_ffi, scores)


def test_features_match_collect_stage(registry_store):
    """The adapter's inputs for a workspace's records equal stage=collect's, so the model sees
    in tuning exactly what it was trained on."""
    from features.candidates import model_inputs
    from pipeline.tuning.cost_model import PipelineCostModel
    from models.tables import build_table
    from pipeline.core.workspace import Workspace

    root, _, uri, _ = registry_store
    cm = PipelineCostModel.from_uri(uri, threads=1)
    inner = cm._inst
    ctx, cands, ids, _ = _task_candidates(root)
    records, _, _ = model_inputs(inner._features(ctx, cands), inner.plan)
    table = build_table(Workspace(root), "static")
    ref = table.frame.set_index("record_id").loc[ids, inner.model.spec.columns].to_numpy(np.float32)
    np.testing.assert_allclose(records, ref, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(inner.model.predict_arrays(records, None, None),
                               inner.model.predict_arrays(ref, None, None), rtol=1e-6)


def test_save_load_round_trip_with_session(registry_store, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel

    root, _, uri, _ = registry_store
    cm = PipelineCostModel.from_uri(uri, threads=1, update=True, update_every=1, update_mode="continue",
                                    update_rounds=5)
    ctx, cands, _, secs = _task_candidates(root)
    results = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs]
    before = cm.predict(ctx, cands)
    cm.update(ctx, cands, results)  # measured run times of these very candidates
    after = cm.predict(ctx, cands)
    assert cm._inst.n_refits == 1 and cm._inst.refit_log[0]["mode"] == "continue"
    assert not np.array_equal(before, after)  # five more trees changed the scores
    path = tmp_path / "adapter.tar"
    cm.save(str(path))
    back = PipelineCostModel.from_file(path)
    np.testing.assert_array_equal(back.predict(ctx, cands), after)
    assert back._inst.session.size == len(cands) and back._inst.n_updates == 1
    # MetaSchedule's load(path) on another adapter replaces its model and session.
    other = PipelineCostModel.from_uri(uri, threads=1)
    other.load(str(path))
    np.testing.assert_array_equal(other.predict(ctx, cands), after)
    assert other._inst.session.size == len(cands)


def test_union_update_retrains_on_training_data(registry_store):
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel

    root, _, uri, _ = registry_store
    cm = PipelineCostModel.from_uri(uri, threads=1, update=True, update_every=1)  # auto: the run's workspace
    assert cm._inst.train_data == str(root)
    ctx, cands, _, secs = _task_candidates(root)
    cm.update(ctx, cands, [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs])
    entry = cm._inst.refit_log[-1]
    assert entry["mode"] == "union" and entry["train_records"] > 0 and entry["session_records"] == len(cands)
    assert cm.predict(ctx, cands).dtype == np.float64


def test_union_update_leaves_out_held_out_tasks(registry_store):
    """A refit must not learn the tasks the model was tested on: the run's split.json names
    them, and the union mode's training table goes without them."""
    from models.tables import restricted_table
    from pipeline.tuning.cost_model import PipelineCostModel

    root, _, uri, _ = registry_store
    cm = PipelineCostModel.from_uri(uri, threads=1)
    info = cm._inst.info
    assert info["split_known"] and info["split"] == "within_task" and info["test_tasks"] == []
    spec = cm._inst.model.spec
    full, _ = restricted_table(root, spec)
    held = sorted(set(full.frame["task_id"]))[:1]
    rest, _ = restricted_table(root, spec, exclude_tasks=held)
    assert len(rest) == int((full.frame["task_id"] != held[0]).sum()) > 0
    assert held[0] not in set(rest.frame["task_id"])
    refit = PipelineCostModel.from_uri(uri, threads=1, update=True, exclude_tasks=held).copy()
    assert refit._inst.exclude_tasks == tuple(held) and len(refit._inst.training_table()) == len(rest)


def test_adapter_sent_as_bytes_refits_in_union_mode_from_its_shipped_table(registry_store, tmp_path):
    """What a cluster node gets (stage=tune executor=ray): the adapter as bytes and its
    training table, with no workspace on that machine; its copies for ours_update keep the
    table, so their refits are union refits, as on the machine that holds the workspace."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel

    root, _, uri, _ = registry_store
    here = PipelineCostModel.from_uri(uri, threads=1)
    table = here.training_table()
    assert table is not None and len(table) > 0
    data = here.to_bytes()
    moved = tmp_path / "not-on-this-machine"  # the workspace the model names, as seen from a node
    there = PipelineCostModel.from_bytes(data, train_data=str(moved), train_table=table, update_every=1)
    node = there.copy(threads=1, update=True)
    assert node._inst.info == here._inst.info and node._inst.training_table() is table
    ctx, cands, _, secs = _task_candidates(root)
    node.update(ctx, cands, [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs])
    assert node._inst.refit_log[-1]["mode"] == "union" and node._inst.refit_log[-1]["train_records"] == len(table)
    # without the table, the same bytes on that machine can only continue from the model
    alone = PipelineCostModel.from_bytes(data, train_data=str(moved), update=True, update_every=1)
    alone.update(ctx, cands, [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs])
    assert alone._inst.refit_log[-1]["mode"] == "continue"


def test_profiler_model_is_refused(registry_store):
    from features.candidates import FeatureMismatchError
    from pipeline.tuning.cost_model import PipelineCostModel

    _, _, _, profiler_uri = registry_store
    with pytest.raises(FeatureMismatchError, match="Profiler counters exist only after a kernel has run"):
        PipelineCostModel.from_uri(profiler_uri)


def test_feature_plan_refuses_mixed_and_unknown_columns():
    from features.candidates import FeatureMismatchError, feature_plan
    from models.base import FeatureSpec

    with pytest.raises(FeatureMismatchError, match="features='all'"):
        feature_plan(FeatureSpec("all", ["static.sum.float_mad", "profiler.perf.cycles"]))
    with pytest.raises(FeatureMismatchError, match="not a PerStoreFeature aggregate"):
        feature_plan(FeatureSpec("static", ["static.median.float_mad"]))
    plan = feature_plan(FeatureSpec("static", ["static.n_stores", "static.max.float_mad"], ["float_mad"]))
    assert list(plan.record_kind) == [1, 0] and list(plan.store_index) == [0]


def test_positive_scores_keep_order():
    from pipeline.tuning.cost_model import positive_scores

    raw = np.array([-800.0, -3.0, -1e-6, 0.0, 5e-4, 0.2, 1.0, 40.0])
    for calibrated in (True, False):
        s = positive_scores(raw, calibrated)
        # strictly increasing: two records the model tells apart stay apart for MetaSchedule
        assert (s > 0).all() and (np.diff(s) > 0).all(), (calibrated, s)
        # a NaN score is the lowest there is (that of any score at or below -700)
        assert positive_scores(np.array([np.nan]), calibrated)[0] == s[0]
    # Regression scores above EPS are unchanged; ranking scores s become 1 + s above 0 and
    # exp(s) at or below it.
    np.testing.assert_array_equal(positive_scores(np.array([0.2, 1.0, 40.0]), True), [0.2, 1.0, 40.0])
    np.testing.assert_allclose(positive_scores(np.array([-3.0, 0.0, 0.2, 40.0]), False),
                               [math.exp(-3.0), 1.0, 1.2, 41.0], rtol=1e-12)


@pytest.fixture(scope="module")
def store_models(collected_workspace, tmp_path_factory):
    """The per-store models (MLP, pack-sum GBDTs, their ensembles) and MetaSchedule's XGBModel,
    trained by stage=train with held-out tasks (split=by_task) into a test-only MLflow store:
    run ids by model name."""
    import mlflow

    root, over = collected_workspace
    db = tmp_path_factory.mktemp("mlflow_store_models") / "mlflow.db"
    over = [*over, f"mlflow.tracking_uri=sqlite:///{db}", "features=static", "split=by_task",
            "train.models=[mlp,lgbm_ps,lgbm_ps_rank,xgb_ps,ens_ps,ens_ps_rank4,ms_xgb,lgbm_ps_rank4_task_roofbase]",
            "model.mlp.max_epochs=5"]
    run_stage("train", over)
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(search_all_experiments=True)
    return root, {m: rid for m, rid in zip(runs["tags.model"], runs["run_id"])}


@pytest.mark.parametrize("model", ["mlp", "lgbm_ps", "lgbm_ps_rank", "ens_ps", "ens_ps_rank4", "ms_xgb",
                                   "lgbm_ps_rank4_task_roofbase"])
def test_store_models_through_metaschedule_predict_and_update(store_models, model):
    """Each per-store path and ms_xgb, called as MetaSchedule's search calls a cost model
    (through the C++ interface): a positive float64 score per candidate that ranks the
    candidates (not a constant), and an online update that refits without the held-out test
    tasks of the model's split."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning.cost_model import PipelineCostModel, positive_scores
    from models.tables import build_table
    from pipeline.core.workspace import Workspace

    root, runs = store_models
    cm = PipelineCostModel.from_uri(f"runs:/{runs[model]}/model", threads=1, update=True, update_every=1)
    inner = cm._inst
    held = inner.info["test_tasks"]
    assert inner.info["split"] == "by_task" and len(held) == 1 and inner.exclude_tasks == tuple(held)
    ctx, cands, rids, secs = _task_candidates(root)
    scores = ms.cost_model.CostModel.predict(cm, ctx, cands)
    assert scores.dtype == np.float64 and len(scores) == len(cands) and (scores > 0).all()
    # the same scores as the trained model gives the stored features of those records
    table = build_table(Workspace(root), "static")
    rows = table.take(np.array([int(np.flatnonzero(table.frame["record_id"].to_numpy() == r)[0]) for r in rids]))
    if model == "ms_xgb":
        inner.model.bind(Workspace(root))
    expected = inner.model.predict(rows)
    if model != "ms_xgb":
        expected = positive_scores(expected, inner.model.calibrated)
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    results = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs]
    ms.cost_model.CostModel.update(cm, ctx, cands, results)
    assert inner.n_refits == 1
    if model != "ms_xgb":  # XGBModel refits on its own data, which holds no task but the session's
        entry = inner.refit_log[-1]
        assert entry["mode"] == "union" and entry["session_records"] == len(cands)
        table = inner.training_table()
        assert held[0] not in set(table.frame["task_id"]) and len(table) == entry["train_records"] > 0
    after = ms.cost_model.CostModel.predict(cm, ctx, cands)
    assert np.isfinite(after).all() and (after > 0).all()


def test_adapting_model_stays_frozen_and_corrects_itself_on_the_session(store_models, tmp_path):
    """ours_adapt: the pretrained model is never changed; a correction fitted on the session's
    measurements moves the scores toward them, and survives a save and load."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning import kinds as tuning_kinds
    from pipeline.tuning.cost_model import PipelineCostModel
    from models.metrics import pairwise_accuracy

    root, runs = store_models
    ours = PipelineCostModel.from_uri(f"runs:/{runs['lgbm_ps_rank4_task_roofbase']}/model", threads=1, update_every=1,
                                      update_grades=8)
    cm = tuning_kinds.create("ours_adapt", seed=0, threads=1, ours=ours, xgb_warmup=100)
    inner, prior = cm._inst, ours._inst.model
    assert inner.update_enabled and inner.update_mode == "residual" and inner.model is prior
    assert inner.residual.levels == 8  # tune.costmodel.update_grades
    ctx, cands, rids, secs = _task_candidates(root)
    before = ms.cost_model.CostModel.predict(cm, ctx, cands)
    booster_before = prior.booster.model_to_string()
    results = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs]
    ms.cost_model.CostModel.update(cm, ctx, cands, results)
    entry = inner.refit_log[-1]
    assert entry["mode"] == "residual" and entry["session_records"] == len(cands) and entry["trees"] > 0
    assert prior.booster.model_to_string() == booster_before  # the prior is frozen
    after = ms.cost_model.CostModel.predict(cm, ctx, cands)
    speed = 1.0 / np.asarray(secs)
    assert not np.allclose(after, before)
    assert pairwise_accuracy(speed, after) > pairwise_accuracy(speed, before)
    cm.save(str(tmp_path / "adapt.tar"))
    loaded = PipelineCostModel.from_file(str(tmp_path / "adapt.tar"))
    np.testing.assert_allclose(ms.cost_model.CostModel.predict(loaded, ctx, cands), after, rtol=1e-6)
    assert loaded._inst.update_grades == 8 and loaded._inst.residual.levels == 8


def test_adapting_model_hands_over_to_the_session_as_it_measures(store_models, tmp_path):
    """update_handover: a task's scores move from the corrected prior toward MetaSchedule's
    XGBModel on the session alone, by the share of its measurements (past the first
    update_handover_after); 0 keeps the corrected prior's scores."""
    from tvm.s_tir import meta_schedule as ms

    from pipeline.tuning import kinds as tuning_kinds
    from pipeline.tuning.cost_model import PipelineCostModel, positive_scores, standardized

    root, runs = store_models
    uri = f"runs:/{runs['lgbm_ps_rank4_task_roofbase']}/model"
    ctx, cands, rids, secs = _task_candidates(root)
    results = [ms.runner.RunnerResult(run_secs=[float(s)], error_msg=None) for s in secs]
    n = len(cands)
    scores, adapters = {}, {}
    for handover, after in ((0, 0), (8, 0), (8, n), (8, n // 2)):
        ours = PipelineCostModel.from_uri(uri, threads=1, update_every=1, update_handover=handover,
                                          update_handover_after=after)
        cm = tuning_kinds.create("ours_adapt", seed=0, threads=1, ours=ours, xgb_warmup=100)
        ms.cost_model.CostModel.update(cm, ctx, cands, results)
        scores[handover, after] = ms.cost_model.CostModel.predict(cm, ctx, cands)
        adapters[handover, after] = cm
    # the same corrected prior, mixed with XGBModel's scores at weight m / (m + 8), m the
    # task's measurements past the first `after`
    corrected = np.where(scores[0, 0] > 1, scores[0, 0] - 1, np.log(scores[0, 0]))  # ranking scores: 1 + s, exp(s) below 0
    for after in (0, n // 2):
        xgb = adapters[8, after]._inst.session_xgb
        assert xgb is not None and xgb.booster is not None and (scores[8, after] > 0).all()
        weight = (n - after) / (n - after + 8)
        mixed = (1 - weight) * standardized(corrected) + weight * standardized(xgb.predict(ctx, cands))
        np.testing.assert_allclose(scores[8, after], positive_scores(mixed, calibrated=False), rtol=1e-5)
        assert not np.allclose(scores[8, after], scores[0, 0])
    np.testing.assert_allclose(scores[8, n], scores[0, 0], rtol=1e-6)  # no measurement past the first n yet
    adapters[8, n // 2].save(str(tmp_path / "handover.tar"))
    loaded = PipelineCostModel.from_file(str(tmp_path / "handover.tar"))
    assert loaded._inst.update_handover == 8 and loaded._inst.update_handover_after == n // 2
    assert loaded._inst.session_xgb.booster is not None
    np.testing.assert_allclose(ms.cost_model.CostModel.predict(loaded, ctx, cands), scores[8, n // 2], rtol=1e-6)
