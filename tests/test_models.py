"""The models' fit/predict contract (models/gbdt.py, mlp.py, ensemble.py, registry.py) on small
tables with known answers: they learn, round-trip, continue, and fail clearly."""

from __future__ import annotations

import numpy as np
import pytest

from models import metrics as M
from models.base import FeatureSpec
from models.splits import make_split

from synthetic import additive_table, per_store_feature_table, small_table


def _model(name: str, overrides: list[str] | None = None, spec: FeatureSpec | None = None):
    """An untrained model made as stage=train makes it: its composed config, instantiated."""
    from models import registry
    from pipeline.config import compose

    cfg = compose([f"model={name}", *(overrides or [])])
    return registry.create(cfg.model, spec or small_table().spec, seed=0, threads=1)


STORE_MODELS = {"mlp", "lgbm_ps", "lgbm_ps_rank", "xgb_ps", "ens_ps"}


@pytest.mark.parametrize("name", ["lgbm", "lgbm_rank", "xgb", "xgb_rank", "mlp", "lgbm_w", "lgbm_ps", "lgbm_ps_rank",
                                  "xgb_ps", "ens_ps"])
def test_models_learn_and_roundtrip(name, tmp_path):
    from models import registry

    tab = small_table()
    sp = make_split(tab.frame.assign(network=""), "within_task", seed=0)
    train, val, test = tab.take(sp.train), tab.take(sp.val), tab.take(sp.test)
    model = _model(name, ["model.max_epochs=30"] if name == "mlp" else [], tab.spec)
    assert model.name == name and model.library in ("lightgbm", "xgboost", "mlp", "ensemble")
    model.fit(train, val)
    scores = model.predict(test)
    ev = M.evaluate(test.frame, scores, calibrated=model.calibrated)
    if name not in ("lgbm_ps", "xgb_ps", "ens_ps"):  # a product of store terms: pack-sum regression, see below
        assert ev.summary["spearman"] > 0.5, ev.summary  # the latency is a simple function of the features
    model.save(tmp_path / "m")
    again = registry.load(tmp_path / "m")
    assert type(again) is type(model) and again.name == name and again.hyperparams == model.hyperparams
    frame = test.store_frame() if again.spec.input == "stores" else test.frame
    assert again.spec.input == ("stores" if name in STORE_MODELS else "records")
    frame_scores = again.predict_frame(frame)
    assert list(frame_scores["record_id"]) == list(test.frame["record_id"])
    np.testing.assert_allclose(frame_scores["score"].to_numpy(), scores, rtol=1e-5, atol=1e-5)
    with pytest.raises(KeyError, match="lacks"):
        again.predict_frame(frame.drop(columns=[(again.spec.columns + again.spec.store_columns)[0]]))
    # clone: same class and hyperparameters, untrained; copy: the trained model, independent
    fresh = model.clone()
    assert type(fresh) is type(model) and fresh.hyperparams == model.hyperparams and fresh.native() is None
    twin = model.copy()
    assert twin.native() is not model.native() or name == "ens_ps"
    np.testing.assert_allclose(twin.predict(test), scores, rtol=1e-6)


@pytest.mark.parametrize("name", ["lgbm_ps", "xgb_ps", "lgbm_ps_rank"])
def test_pack_sum_models_learn_store_costs(name):
    """input=stores: the loss on each record's sum of store outputs trains the per-store trees,
    and a record's score is exactly that sum."""
    tab = additive_table(n_tasks=8, per_task=50)
    sp = make_split(tab.frame, "within_task", seed=0)
    model = _model(name, [], tab.spec)
    assert model.spec.input == "stores" and model.spec.columns == []
    model.fit(tab.take(sp.train), tab.take(sp.val))
    test = tab.take(sp.test)
    scores = model.predict(test)
    ev = M.evaluate(test.frame, scores, calibrated=model.calibrated)
    assert ev.summary["spearman"] > (0.7 if model.ranking else 0.85), ev.summary
    per_store = model._predict_rows(test.stores)
    np.testing.assert_allclose(scores, np.add.reduceat(per_store, test.offsets[:-1]), rtol=1e-6, atol=1e-9)
    if not model.ranking:  # calibrated: the scores estimate the labels themselves
        assert ev.summary["rmse"] < 0.15, ev.summary


def test_pack_sum_with_record_context_roundtrips(tmp_path):
    """context: each store row carries its record's matching columns; the saved model predicts
    the same from the pyfunc's one-row-per-store frame."""
    from models import registry

    tab = small_table()
    model = _model("lgbm_ps", ["model.context=['^static.f[01]$']", "model.rounds_without_val=20"], tab.spec)
    assert model.spec.columns == ["static.f0", "static.f1"] and model.row_columns[-2:] == ["static.f0", "static.f1"]
    model.fit(tab, tab.take(np.zeros(0, np.int64)))
    assert set(model.importance().index) == set(tab.spec.store_columns) | {"static.f0", "static.f1"}
    model.save(tmp_path / "m")
    again = registry.load(tmp_path / "m")
    frame = tab.store_frame()[["record_id", "static.f0", "static.f1", *tab.spec.store_columns]]
    np.testing.assert_allclose(again.predict_frame(frame)["score"], model.predict(tab), rtol=1e-6)
    with pytest.raises(ValueError, match="matches no record-level column"):
        _model("lgbm_ps", ["model.context=['^nothing$']"], tab.spec)
    with pytest.raises(ValueError, match="need input=stores"):
        _model("lgbm", ["+model.context=[f0]"], tab.spec)


def test_ensemble_is_the_mean_of_standardized_member_scores():
    tab = additive_table()
    sp = make_split(tab.frame, "within_task", seed=0)
    ens = _model("ens_ps", ["model.weights.xgb_ps=3"], tab.spec)
    assert set(ens.members) == {"xgb_ps", "lgbm_ps_rank"} and ens.weights == {"xgb_ps": 3.0, "lgbm_ps_rank": 1.0}
    ens.fit(tab.take(sp.train), tab.take(sp.val))
    train, test = tab.take(sp.train), tab.take(sp.test)
    z = {}
    for k, m in ens.members.items():
        s = m.predict(train)
        z[k] = (m.predict(test) - s.mean()) / s.std()
    np.testing.assert_allclose(ens.predict(test), (3 * z["xgb_ps"] + z["lgbm_ps_rank"]) / 4, rtol=1e-6, atol=1e-9)
    # one candidate scored alone gets the score it gets among others
    one = test.take(np.array([3]))
    np.testing.assert_allclose(ens.predict(one), ens.predict(test)[3:4], rtol=1e-6)



def test_reg2_ensemble_weighs_its_regression_member_twice():
    """ens_ps_reg2_fixed is the fixed ensemble (the same members, trained as long) with the
    regression member's weight 2 and the two rankers' 1."""
    from pipeline.config import compose

    fixed, reg2 = (compose([f"model={n}"]).model for n in ("ens_ps_rank4_fixed", "ens_ps_reg2_fixed"))
    assert reg2.members == fixed.members
    ens = _model("ens_ps_reg2_fixed", [], per_store_feature_table().spec)
    assert ens.weights == {"lgbm_ps_rank4_task": 1.0, "lgbm_ps_rank4_roofbase1": 1.0, "xgb_ps": 2.0}

def test_convolution_tasks_get_the_ensembles_convolution_weights(tmp_path):
    """convolution_weights: the records of tasks that sum over a window of an input
    (task.window and task.reduce_sum) get the members' mean with those weights, every other
    record the ensemble's own; the saved model and the portable predictor score alike."""
    from dataclasses import replace

    from models import pyfunc, pyfunc_model, registry

    tab = additive_table()
    conv = tab.frame["task_id"].isin(["t0", "t2", "t4"]).to_numpy()
    pool = tab.frame["task_id"].isin(["t1", "t2"]).to_numpy()  # a window read with a max: not a convolution
    frame = tab.frame.assign(**{"task.window": (conv | pool).astype(float), "task.reduce_sum": (~pool).astype(float)})
    tab = replace(tab, frame=frame)  # as models.tables builds it: the task's context beside the spec's columns
    sp = make_split(tab.frame, "within_task", seed=0)
    train, test = tab.take(sp.train), tab.take(sp.test)
    ens = _model("ens_ps", ["+model.convolution_weights.xgb_ps=1"], tab.spec)
    assert ens.convolution_weights == {"xgb_ps": 1.0, "lgbm_ps_rank": 0.0}
    assert ens.spec.columns == ["task.window", "task.reduce_sum"]
    ens.fit(train, tab.take(sp.val))
    z = {k: (m.predict(test) - ens.scale[k][0]) / ens.scale[k][1] for k, m in ens.members.items()}
    is_conv = test.frame["task_id"].isin(["t0", "t4"]).to_numpy()
    assert is_conv.any() and not is_conv.all()
    want = np.where(is_conv, z["xgb_ps"], (z["xgb_ps"] + z["lgbm_ps_rank"]) / 2)
    np.testing.assert_allclose(ens.predict(test), want, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(ens.convolutions(test.frame), is_conv)
    ens.save(tmp_path / "m")
    again = registry.load(tmp_path / "m")
    assert again.convolution_weights == ens.convolution_weights
    np.testing.assert_allclose(again.predict_frame(test.store_frame(ens.spec.columns))["score"], want, rtol=1e-5,
                               atol=1e-6)
    contract = pyfunc.ensemble_contract(ens, tab, "cpu")
    assert contract["convolution_columns"] == ["task.window", "task.reduce_sum"]
    portable = pyfunc_model.load(tmp_path / "m", contract, tmp_path / "m")
    records = test.frame[ens.spec.columns].to_numpy(np.float32)
    np.testing.assert_allclose(portable.scores(records, test.stores, test.offsets), want, rtol=1e-5, atol=1e-6)
    # without the weights, the same members score every record alike
    plain = _model("ens_ps", [], tab.spec)
    assert plain.convolution_weights is None and plain.convolutions(test.frame) is None
    with pytest.raises(ValueError, match="not members"):
        _model("ens_ps", ["+model.convolution_weights.nothing=1"], tab.spec)
    with pytest.raises(ValueError, match="context columns"):  # a table without the task's context
        ens.convolutions(additive_table().frame)


def test_convreg_ensemble_is_the_fixed_one_with_convolutions_to_its_regression_member():
    from pipeline.config import compose

    fixed, conv = (compose([f"model={n}"]).model for n in ("ens_ps_rank4_fixed", "ens_ps_convreg_fixed"))
    assert conv.members == fixed.members and conv.get("weights") == fixed.get("weights")
    # as stage=train makes it: the table's spec names no task column; the model reads them
    ens = _model("ens_ps_convreg_fixed", [], per_store_feature_table().spec)
    assert ens.weights == dict.fromkeys(ens.members, 1.0)
    assert ens.convolution_weights == {"lgbm_ps_rank4_task": 0.0, "lgbm_ps_rank4_roofbase1": 0.0, "xgb_ps": 1.0}
    assert {"task.window", "task.reduce_sum"} <= set(ens.spec.columns)


def test_long_ensemble_trains_its_rankers_twice_as_long():
    """ens_ps_long_fixed is the fixed ensemble with its two LambdaRank members at 600 fixed
    rounds, its regression member unchanged; each member trains exactly its own length."""
    from pipeline.config import compose

    fixed, long = (compose([f"model={n}"]).model for n in ("ens_ps_rank4_fixed", "ens_ps_long_fixed"))
    rounds = {k: (m.rounds_without_val, m.early_stopping_rounds) for k, m in long.members.items()}
    assert rounds == {"lgbm_ps_rank4_task": (600, 0), "lgbm_ps_rank4_roofbase1": (600, 0), "xgb_ps": (300, 0)}
    for k, m in long.members.items():
        assert {**m, "rounds_without_val": 0} == {**fixed.members[k], "rounds_without_val": 0}
    tab = per_store_feature_table()  # no task columns: the task member reads none here
    ens = _model("ens_ps_long_fixed", ["model.members.lgbm_ps_rank4_task.task_context=false"], tab.spec)
    info = ens.fit(tab, tab.take(np.arange(0)))["members"]
    assert {k: i["best_iteration"] for k, i in info.items()} == {
        "lgbm_ps_rank4_task": 600, "lgbm_ps_rank4_roofbase1": 600, "xgb_ps": 300}
    assert ens.members["lgbm_ps_rank4_task"].native().num_trees() == 600
    short = compose(["model=ens_ps_long_reg100_fixed"]).model.members
    assert {k: m.rounds_without_val for k, m in short.items()} == {
        "lgbm_ps_rank4_task": 600, "lgbm_ps_rank4_roofbase1": 600, "xgb_ps": 100}


def test_bagged_ensemble_trains_each_ranker_in_three_seeds(tmp_path):
    """ens_ps_bag3_fixed is the fixed ensemble with each LambdaRank member trained three times
    (seeds 0, 1000, 2000; the first copy is the fixed model's member), each copy weighing a
    third of its member; the regression member once."""
    from models import registry
    from pipeline.config import compose

    fixed, bag = (compose([f"model={n}"]).model for n in ("ens_ps_rank4_fixed", "ens_ps_bag3_fixed"))
    assert bag.members == fixed.members
    tab = per_store_feature_table()  # no task columns: the task member reads none here
    short = ["model.members.lgbm_ps_rank4_task.task_context=false",
             *(f"model.members.{k}.rounds_without_val=20" for k in fixed.members)]
    ens, one = (_model(n, short, tab.spec) for n in ("ens_ps_bag3_fixed", "ens_ps_rank4_fixed"))
    rankers = ("lgbm_ps_rank4_task", "lgbm_ps_rank4_roofbase1")
    assert ens.weights == {**{f"{k}{c}": 1 / 3 for k in rankers for c in ("", "_copy1", "_copy2")}, "xgb_ps": 1.0}
    assert {k: m.seed for k, m in ens.members.items()} == {
        **{f"{k}{c}": s for k in rankers for c, s in (("", 0), ("_copy1", 1000), ("_copy2", 2000))}, "xgb_ps": 0}
    again = ens.clone()  # as a tuning session refits it: the same copies and seeds
    assert {k: m.seed for k, m in again.members.items()} == {k: m.seed for k, m in ens.members.items()}
    assert again.weights == ens.weights
    ens.fit(tab, tab.take(np.arange(0)))
    one.fit(tab, tab.take(np.arange(0)))
    scores = ens.member_scores(tab)
    for k in rankers:  # the first copy is the fixed model's member; the others are other draws
        np.testing.assert_allclose(scores[k], one.members[k].predict(tab))
        assert not np.allclose(scores[k], scores[f"{k}_copy1"]) and not np.allclose(scores[k], scores[f"{k}_copy2"])
    z = {k: (s - s.mean()) / s.std() for k, s in scores.items()}
    expected = (sum(z[k] for k in z if k != "xgb_ps") / 3 + z["xgb_ps"]) / 3
    np.testing.assert_allclose(ens.predict(tab), expected, rtol=1e-6, atol=1e-9)
    ens.save(tmp_path / "bag")
    np.testing.assert_allclose(registry.load(tmp_path / "bag").predict(tab), ens.predict(tab), rtol=1e-6)
    with pytest.raises(ValueError, match=r"copies names \['lgbm'\], not members"):
        _model("ens_ps_bag3_fixed", ["+model.copies.lgbm=2"], tab.spec)
    with pytest.raises(ValueError, match="whole numbers of at least 1"):
        _model("ens_ps_bag3_fixed", ["model.copies.lgbm_ps_rank4_task=0"], tab.spec)


def test_ensemble_with_metaschedules_own_model_as_a_member(collected_workspace, tmp_path):
    """ens_ps_msx_fixed: the fixed ensemble plus MetaSchedule's XGBModel, trained by its own
    update on the workspace's records (the ensemble binds it to the workspace), a fourth
    member weighing 1; after a save and load, without a workspace, it scores stored rows as
    a tuning session's correction does, and per-store rows alone as tuning scores candidates."""
    from models import registry
    from models.tables import build_table
    from pipeline.core.workspace import Workspace

    ws = Workspace(collected_workspace[0])
    tab = build_table(ws, "static")
    short = [f"model.members.{k}.rounds_without_val=20" for k in ("lgbm_ps_rank4_task", "lgbm_ps_rank4_roofbase1",
                                                                   "xgb_ps")]
    ens = _model("ens_ps_msx_fixed", short, tab.spec)
    assert ens.bind(ws) is ens and ens.members["ms_xgb"].ws is ws
    assert ens.weights == {"lgbm_ps_rank4_task": 1.0, "lgbm_ps_rank4_roofbase1": 1.0, "xgb_ps": 1.0, "ms_xgb": 1.0}
    none = tab.take(np.arange(0))
    ens.fit(tab, none)
    alone = _model("ms_xgb", [], tab.spec).bind(ws)
    alone.fit(tab, none)
    scores = ens.member_scores(tab)
    np.testing.assert_allclose(scores["ms_xgb"], alone.predict(tab), rtol=1e-6)
    z = {k: (s - s.mean()) / s.std() for k, s in scores.items()}
    np.testing.assert_allclose(ens.predict(tab), sum(z.values()) / 4, rtol=1e-6, atol=1e-9)
    by_record = dict(zip(tab.frame["record_id"], ens.predict(tab)))
    ens.save(tmp_path / "msx")
    loaded = registry.load(tmp_path / "msx")  # no workspace, as a tuning session's correction reads it
    assert loaded.members["ms_xgb"].ws is None
    np.testing.assert_allclose(loaded.predict(tab), ens.predict(tab), rtol=1e-5, atol=1e-6)
    for model in (ens, loaded):  # per-store rows alone, as tuning scores candidates
        got = model.predict_frame(tab.store_frame(list(model.spec.columns)))
        assert len(got) > 0
        np.testing.assert_allclose(got["score"], [by_record[r] for r in got["record_id"]], rtol=1e-5, atol=1e-6)


def test_label_weight_and_early_stopping_metric():
    from models.metrics import STOP_METRICS

    tab = small_table()
    sp = make_split(tab.frame.assign(network=""), "within_task", seed=0)
    for metric in STOP_METRICS:
        model = _model("lgbm_w", [f"model.early_stopping_metric={metric}"], tab.spec)
        info = model.fit(tab.take(sp.train), tab.take(sp.val))
        assert info["early_stopped"] and info["best_iteration"] >= 1
        assert list(info["val_curve"]) == (["rmse"] if metric == "loss" else [f"val_{metric}"])
    mlp = _model("mlp", ["model.early_stopping_metric=apeak32", "model.max_epochs=4", "model.patience=10"], tab.spec)
    info = mlp.fit(tab.take(sp.train), tab.take(sp.val))
    assert info["epochs"] == 4 and all(-1 <= v < 0 for v in info["val_loss"])  # the negative of a peak score
    lay = _model("lgbm_w", [], tab.spec)._layout(tab)
    np.testing.assert_allclose(lay.w, tab.labels)  # label_weight 1: weight = label
    with pytest.raises(ValueError, match="early_stopping_metric='top1'; valid: loss, peak1"):
        _model("lgbm_w", ["model.early_stopping_metric=top1"], tab.spec)
    with pytest.raises(ValueError, match="input=stores needs per-store rows"):
        _model("lgbm_ps", [], FeatureSpec("profiler", ["profiler.c"], []))


def test_lambdarank_gradients_push_the_better_record_up():
    from models.gbdt import lambdarank_gradients

    scores = np.array([0.0, 0.0, 0.0, 1.0])
    grade = np.array([3, 0, 1, 0])  # record 0 is best but scored like the others, record 3 worst scored first
    g, h = lambdarank_gradients(scores, grade, np.array([4]))
    assert g[0] < 0 and g[3] > 0 and abs(g.sum()) < 1e-12 and (h > 0).all()  # descent raises 0, lowers 3
    g2, _ = lambdarank_gradients(np.array([3.0, 0.0, 1.0, -1.0]), grade, np.array([4]))
    assert np.abs(g2).max() < np.abs(g).max()  # a better order has smaller gradients


def test_rank_truncation_drops_the_pairs_below_the_top_of_the_order(tmp_path):
    """With truncation k, a pair counts only if one of its records is among the k
    best-scored: here the misordered pair in 3rd and 4th place gives no gradient, every pair
    with the first two the same as without; k at the group's size is the full gradient. The
    ensemble config sets it on its two rankers; a ranker trains, saves and loads with it."""
    from models import registry
    from models.gbdt import lambdarank_gradients
    from pipeline.config import compose

    scores = np.array([3.0, 2.0, 1.0, 0.0])
    grade = np.array([3, 2, 0, 1])  # ordered but for records 2 and 3, below the first two
    full, _ = lambdarank_gradients(scores, grade, np.array([4]))
    top2, h = lambdarank_gradients(scores, grade, np.array([4]), truncation=2)
    np.testing.assert_allclose(top2[:2], full[:2])  # every pair of the top two is kept
    dropped = full[2] - top2[2]  # the pair (3 above 2) is gone: its lambda, and only it
    assert dropped > 0 and (h > 0).all()
    np.testing.assert_allclose(top2[3] - full[3], dropped)
    np.testing.assert_allclose(lambdarank_gradients(scores, grade, np.array([4]), truncation=4)[0], full)
    members = compose(["model=ens_ps_trunc10_fixed"]).model.members
    assert {k: m.rank_truncation for k, m in members.items() if "rank_truncation" in m} == {
        "lgbm_ps_rank4_task": 10, "lgbm_ps_rank4_roofbase1": 10}
    tab = small_table()
    model = _model("lgbm_ps_rank4_fixed", ["model.rank_truncation=3", "model.rounds_without_val=20"], tab.spec)
    model.fit(tab, tab.take(np.arange(0)))
    model.save(tmp_path / "m")
    loaded = registry.load(tmp_path / "m")
    assert loaded.rank_truncation == 3
    np.testing.assert_allclose(loaded.predict(tab), model.predict(tab), rtol=1e-6)
    for bad, opts in ((3, ["model.objective=regression"]), (-1, [])):
        with pytest.raises(ValueError, match=f"rank_truncation={bad}; valid: 0 .* with objective=ranking and input=stores"):
            _model("lgbm_ps_rank4", [f"model.rank_truncation={bad}", *opts], tab.spec)


def test_roofline_cache_reaches_the_ranker_and_its_saved_copy(tmp_path):
    """The ensemble config gives its roofline member a cache (the other members none); a
    ranker with a cache trains, saves and loads with it, predicting the same."""
    from models import registry
    from pipeline.config import compose

    members = compose(["model=ens_ps_cache_fixed"]).model.members
    assert {k: (m.get("roofline") or {}).get("cache_bytes") for k, m in members.items()} == {
        "lgbm_ps_rank4_task": None, "lgbm_ps_rank4_roofbase1": 1048576, "xgb_ps": None}
    tab = per_store_feature_table()
    model = _model("lgbm_ps_rank4_roofbase1", ["+model.roofline.cache_bytes=1048576", "model.rounds_without_val=20",
                                                "model.early_stopping_rounds=0"], tab.spec)
    model.fit(tab, tab.take(np.arange(0)))
    model.save(tmp_path / "m")
    loaded = registry.load(tmp_path / "m")
    assert model.peaks.cache_bytes == loaded.peaks.cache_bytes == 1048576
    np.testing.assert_allclose(loaded.predict(tab), model.predict(tab), rtol=1e-6)
    without = _model("lgbm_ps_rank4_roofbase1", [], tab.spec)  # the start it corrects differs
    assert not np.allclose(model._base(tab.stores, tab.offsets), without._base(tab.stores, tab.offsets))

@pytest.mark.parametrize("name", ["lgbm", "xgb", "mlp"])
def test_continue_fit_trains_further_in_place(name):
    tab = small_table()
    model = _model(name, ["model.max_epochs=3"] if name == "mlp" else ["model.rounds_without_val=20"], tab.spec)
    model.fit(tab, tab.take(np.zeros(0, np.int64)))
    before = model.predict(tab)
    trees = model.native().num_trees() if name == "lgbm" else None
    model.continue_fit(tab.take(np.arange(40)), rounds=5, epochs=2)
    after = model.predict(tab)
    assert after.shape == before.shape and np.isfinite(after).all() and not np.allclose(after, before)
    if name == "lgbm":
        assert model.native().num_trees() == trees + 5
    if name == "xgb":
        assert model.native().num_boosted_rounds() == 25


@pytest.mark.parametrize("name", ["lgbm", "xgb"])
def test_early_stopping_rounds_zero_trains_a_fixed_length_and_still_scores_validation(name):
    """With a validation part, early stopping picks the length; with 0 the length is
    rounds_without_val whatever the validation curve does, and the curve is still recorded."""
    tab = small_table()
    sp = make_split(tab.frame.assign(network=""), "within_task", seed=0)
    train, val = tab.take(sp.train), tab.take(sp.val)
    stopped = _model(name, ["model.rounds_without_val=7", "model.num_boost_round=400",
                            "model.early_stopping_rounds=3"], tab.spec)
    assert stopped.fit(train, val)["early_stopped"]
    fixed = _model(name, ["model.rounds_without_val=7", "model.num_boost_round=400",
                          "model.early_stopping_rounds=0"], tab.spec)
    info = fixed.fit(train, val)
    assert not info["early_stopped"] and info["best_iteration"] == 7
    assert [len(v) for v in info["val_curve"].values()] == [7]
    trees = fixed.native().num_trees() if name == "lgbm" else fixed.native().num_boosted_rounds()
    assert trees == 7
    with pytest.raises(ValueError, match="early_stopping_rounds=-1.*0 to train rounds_without_val"):
        _model(name, ["model.early_stopping_rounds=-1"], tab.spec)


def test_grade_cuts_grade_by_tiers_of_speed_not_by_rank():
    """Rank grades a task's records by position whatever their speeds (one top grade in each
    task here); tiers of speed give the top grade to every record within the last cut of its
    task's best, however many or few there are."""
    from models.gbdt import grades

    labels = np.array([1.0, 0.97, 0.6, 0.3, 0.2, 0.1, 1.0, 0.99, 0.98, 0.96, 0.9, 0.85])
    codes = np.repeat([0, 1], 6)
    np.testing.assert_array_equal(grades(labels, codes, 4, [0.5, 0.8, 0.95]), [3, 3, 1, 0, 0, 0, 3, 3, 3, 3, 2, 2])
    np.testing.assert_array_equal(grades(labels, codes, 4), [3, 2, 2, 1, 1, 0, 3, 2, 2, 1, 1, 0])


def test_tier_graded_ranker_learns_and_refuses_bad_cuts(tmp_path):
    from models import registry
    from pipeline.config import compose

    tab = small_table()
    sp = make_split(tab.frame.assign(network=""), "within_task", seed=0)
    train, val, test = tab.take(sp.train), tab.take(sp.val), tab.take(sp.test)
    model = _model("lgbm_ps_tier4_fixed", [], tab.spec)
    assert model.grade_cuts == [0.5, 0.8, 0.95] and model.rank_levels == 4
    model.fit(train, val)
    ev = M.evaluate(test.frame, model.predict(test), calibrated=False).summary
    assert ev["spearman"] > 0.5 and ev["top1_score"] > ev["random_top1_score"], ev
    model.save(tmp_path / "m")
    np.testing.assert_allclose(registry.load(tmp_path / "m").predict(test), model.predict(test), rtol=1e-5)
    for bad in ("[0.8,0.5]", "[0.5,1.0]"):
        with pytest.raises(ValueError, match="grade_cuts=.*increasing normalized throughputs in"):
            _model("lgbm_ps_tier4", [f"model.grade_cuts={bad}"], tab.spec)
    with pytest.raises(ValueError, match="grade_cuts grade a ranking objective"):
        _model("lgbm_ps_tier4", ["model.objective=regression"], tab.spec)
    # the ensemble's two rankers are graded by tiers and all three members train a fixed length
    members = compose(["model=ens_ps_tier4_fixed"]).model.members
    assert [list(m.get("grade_cuts") or []) for m in members.values()] == [[0.5, 0.8, 0.95]] * 2 + [[]]
    assert {m.early_stopping_rounds for m in members.values()} == {0}


def test_task_time_weights_follow_each_tasks_share_of_its_network_time():
    import pandas as pd

    from models.gbdt import task_time_weights

    # net a: t1 twice at 3 s, t2 once at 1 s (shares 6/7, 1/7); net b: t2 and t3, 1 s each (1/2, 1/2)
    frame = pd.DataFrame({"task_id": ["t1", "t1", "t2", "t3"], "mean_s": [3.0, 5.0, 1.0, 1.0]})
    members = pd.DataFrame({"task_id": ["t1", "t2", "t2", "t3", "t9"], "group": ["a", "a", "b", "b", "b"],
                            "weight": [2, 1, 1, 1, 1]})  # t9: not in this part, left out of the sums
    share = np.array([6 / 7, 1 / 2, 1 / 2])  # t2: its larger share
    for p in (1.0, 0.5):
        w = share ** p / np.mean(share ** p)
        np.testing.assert_allclose(task_time_weights(frame, members, p), w[[0, 0, 1, 2]])
    # without memberships: the frame's own group and weight columns
    own = frame.assign(group="a", weight=1)
    np.testing.assert_allclose(task_time_weights(own, None, 1.0), np.array([3, 3, 1, 1]) / (5 / 3))
    np.testing.assert_allclose(task_time_weights(frame, None, 1.0), np.array([3, 3, 1, 1]) / (5 / 3))
    # a tuning session's table has labels but no latencies: every record weighs 1
    np.testing.assert_array_equal(task_time_weights(frame.drop(columns="mean_s"), None, 0.5), np.ones(4))


def test_task_weight_scales_each_tasks_gradient_and_roundtrips(tmp_path):
    from models import registry
    from pipeline.config import compose

    tab = small_table()
    frame = tab.frame.assign(group="net", mean_s=tab.frame["mean_s"] * np.where(tab.frame["task_id"] == "t0", 100, 1))
    tab = type(tab)(**{**tab.__dict__, "frame": frame, "members": None})
    plain = _model("lgbm_ps_rank4", [], tab.spec)
    heavy = _model("lgbm_ps_rank4", ["model.task_weight=0.5"], tab.spec)
    lay0, lay1 = plain._layout(tab, fitted=True), heavy._layout(tab, fitted=True)
    assert heavy._layout(tab).w is None  # validation records are not weighed
    scores = np.random.default_rng(0).normal(size=len(lay0.X))
    g0, h0 = plain._objective(lay0)(scores)
    g1, h1 = heavy._objective(lay1)(scores)
    tw = lay1.w[lay1.seg]
    np.testing.assert_allclose(g1, g0 * tw)
    np.testing.assert_allclose(h1, h0 * tw)
    heavy_task = lay1.codes[lay1.seg] == 0  # t0: 100x the time of the others
    assert tw[heavy_task].min() > 5 * tw[~heavy_task].max()
    heavy.fit(tab, tab.take(np.arange(0)))
    # refit on a tuning session's table (labels, no latencies or memberships): every task weighs 1
    session = type(tab)(**{**tab.__dict__, "frame": tab.frame.drop(columns=["mean_s", "group", "weight"])})
    trees = heavy.native().num_trees()
    heavy.continue_fit(session, rounds=3)
    assert heavy.native().num_trees() == trees + 3
    heavy.save(tmp_path / "m")
    loaded = registry.load(tmp_path / "m")
    assert loaded.task_weight == 0.5
    np.testing.assert_allclose(loaded.predict(tab), heavy.predict(tab), rtol=1e-6)
    with pytest.raises(ValueError, match="task_weight=0.5; valid: 0 .* with input=stores"):
        _model("lgbm_rank", ["+model.task_weight=0.5"], tab.spec)
    # the ensemble weighs every member's tasks so, at the fixed length of ens_ps_rank4_fixed
    members = compose(["model=ens_ps_time_fixed"]).model.members
    assert {m.task_weight for m in members.values()} == {0.5}
    assert {m.early_stopping_rounds for m in members.values()} == {0}


def test_model_all_composes_every_model_config_and_reaches_per_model_overrides():
    from pipeline.config import CONF_DIR, compose

    cfg = compose(["model.lgbm.params.num_leaves=63", "model.mlp.hidden=32"])
    files = {p.stem for p in (CONF_DIR / "model").glob("*.yaml")} - {"all"}
    assert set(cfg.model) - {"name"} == files  # a new model config must be listed in model/all.yaml
    from models import registry

    lgbm = registry.create(cfg.model.lgbm, small_table().spec)
    assert lgbm.library_params["num_leaves"] == 63 and lgbm.name == "lgbm"
    assert registry.create(cfg.model.mlp, small_table().spec).hidden == 32


def test_saved_model_of_an_earlier_layout_loads(tmp_path):
    """A model.json whose params hold only the keys its config had (no defaults recorded)."""
    import json

    from models import registry

    tab = small_table()
    model = _model("lgbm", ["model.rounds_without_val=5"], tab.spec)
    model.fit(tab, tab.take(np.zeros(0, np.int64)))
    model.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["params"] = {k: meta["params"][k] for k in ("objective", "num_boost_round", "early_stopping_rounds",
                                                     "rounds_without_val", "params")}
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    np.testing.assert_allclose(registry.load(tmp_path / "m").predict(tab), model.predict(tab))


def test_unknown_model_config_and_saved_class_are_clear_errors(tmp_path):
    import json

    from models import registry

    with pytest.raises(registry.UnknownModelError, match="'catboost' has no `_target_`.*model=<name>"):
        registry.create({"name": "catboost", "depth": 6}, small_table().spec)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.json").write_text(json.dumps({"name": "x", "class": "os.system"}))
    with pytest.raises(registry.UnknownModelError, match="names class 'os.system', not a cost model"):
        registry.load(tmp_path / "m")
