"""Metrics, splits and the models' fit/predict contract on small arrays with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from models import metrics as M
from models.base import FeatureSpec
from models.splits import SplitError, make_split
from models.tables import TrainingTable, gather_segments

# ---------------------------------------------------------------------------- metrics


def test_peak_score_by_hand():
    labels = np.array([0.5, 1.0, 0.25, 0.8])
    scores = np.array([4.0, 2.0, 3.0, 1.0])  # predicted order: 0, 2, 1, 3
    assert M.peak_score(labels, scores, 1) == pytest.approx(0.5)
    assert M.peak_score(labels, scores, 2) == pytest.approx(0.5)
    assert M.peak_score(labels, scores, 3) == pytest.approx(1.0)
    np.testing.assert_allclose(M.peak_curve(labels, scores, 6), [0.5, 0.5, 1, 1, 1, 1])


def test_pairwise_accuracy():
    y = np.array([0.1, 0.2, 0.3, 0.4])
    assert M.pairwise_accuracy(y, y * 10) == 1.0
    assert M.pairwise_accuracy(y, -y) == 0.0
    assert M.pairwise_accuracy(y, np.zeros(4)) == 0.5  # ties count half
    # one swapped pair out of six
    assert M.pairwise_accuracy(y, np.array([1.0, 2.0, 4.0, 3.0])) == pytest.approx(5 / 6)
    assert math.isnan(M.pairwise_accuracy(np.ones(3), np.arange(3)))  # no pair with different labels


def test_topk_recall_and_sampling():
    y = np.arange(10, dtype=float)
    assert M.topk_recall(y, y, 3) == 1.0
    assert M.topk_recall(y, -y, 3) == 0.0
    assert M.topk_recall(y, np.array([0, 1, 2, 3, 4, 5, 6, 9, 8, 0.5]), 3) == pytest.approx(2 / 3)
    assert math.isnan(M.sampled_topk_recall(y, y))  # fewer than 128 records: skipped
    rng = np.random.default_rng(0)
    big = rng.random(300)
    assert M.sampled_topk_recall(big, big) == 1.0
    noisy = M.sampled_topk_recall(big, big + rng.normal(0, 0.3, 300), seed=1)
    assert 0.0 < noisy < 1.0


def test_correlations_match_scipy():
    rng = np.random.default_rng(3)
    y, s = rng.random(50), rng.random(50)
    m = M.task_metrics(y, s)
    assert m["spearman"] == pytest.approx(stats.spearmanr(y, s).statistic)
    assert m["kendall"] == pytest.approx(stats.kendalltau(y, s).statistic)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - s) ** 2)))
    assert m["r2"] == pytest.approx(1 - np.sum((y - s) ** 2) / np.sum((y - y.mean()) ** 2))
    un = M.task_metrics(y, s, calibrated=False)
    assert math.isnan(un["rmse"]) and math.isnan(un["r2"]) and un["spearman"] == m["spearman"]


def _frame(lat_by_task: dict, weights: dict, groups: dict) -> pd.DataFrame:
    rows = []
    for t, lats in lat_by_task.items():
        for i, lat in enumerate(lats):
            rows.append(dict(task_id=t, record_id=f"{t}{i}", mean_s=lat, weight=weights[t], group=groups[t]))
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    return df


def test_weighted_topk_score_by_hand():
    # task a (weight 2): latencies 1, 2, 4; task b (weight 1): 10, 5
    df = _frame({"a": [1.0, 2.0, 4.0], "b": [10.0, 5.0]}, {"a": 2, "b": 1}, {"a": "net", "b": "net"})
    # scores pick a2 (4 s) first for a, b0 (10 s) first for b
    scores = np.array([1.0, 2.0, 3.0, 1.0, 0.0])
    df["score"] = scores
    best = 2 * 1.0 + 1 * 5.0
    assert M.weighted_topk_score(df, 1) == pytest.approx(best / (2 * 4.0 + 1 * 10.0))
    assert M.weighted_topk_score(df, 2) == pytest.approx(best / (2 * 2.0 + 1 * 5.0))
    assert M.weighted_topk_score(df, 5) == pytest.approx(1.0)


def test_evaluate_aggregates_per_task_and_group():
    df = _frame({"a": [1.0, 2.0, 4.0, 8.0], "b": [3.0, 1.0], "c": [2.0, 2.5, 3.0]},
                {"a": 1, "b": 3, "c": 1}, {"a": "n1", "b": "n1", "c": "n2"})
    ev = M.evaluate(df, df["label"].to_numpy())  # a perfect model
    assert list(ev.per_task["task_id"]) == ["a", "b", "c"]
    assert ev.summary["peak1"] == 1.0 and ev.summary["pair_acc"] == 1.0 and ev.summary["rmse"] == 0.0
    assert ev.summary["top1_score"] == 1.0 and len(ev.per_group) == 2
    assert ev.summary["n_tasks_recall32of128"] == 0 and math.isnan(ev.summary["recall32of128"])
    worst = M.evaluate(df, -df["label"].to_numpy(), calibrated=False)
    assert worst.summary["pair_acc"] == 0.0 and math.isnan(worst.summary["rmse"])
    # per task a: worst pick is 8 s vs best 1 s
    assert worst.per_task.set_index("task_id").loc["a", "peak1"] == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="scores for"):
        M.evaluate(df, np.zeros(3))


# ---------------------------------------------------------------------------- splits


def _records(n_tasks=6, per_task=10, networks=None) -> pd.DataFrame:
    rows = []
    for t in range(n_tasks):
        for i in range(per_task):
            rows.append(dict(task_id=f"t{t}", record_id=f"t{t}r{i}",
                             network=(networks[t] if networks else "")))
    return pd.DataFrame(rows)


def _check_partition(sp, n):
    allrows = np.concatenate([sp.train, sp.val, sp.test])
    assert len(allrows) == n and len(np.unique(allrows)) == n


def test_within_task_split():
    df = _records()
    sp = make_split(df, "within_task", seed=1)
    _check_partition(sp, len(df))
    for t in df["task_id"].unique():
        rows = np.flatnonzero(df["task_id"] == t)
        assert len(np.intersect1d(rows, sp.test)) == 2 and len(np.intersect1d(rows, sp.val)) >= 1
    again = make_split(df, "within_task", seed=1)
    assert np.array_equal(sp.test, again.test)
    assert not np.array_equal(sp.test, make_split(df, "within_task", seed=2).test)


def test_by_task_split_holds_out_whole_tasks():
    df = _records(n_tasks=10)
    sp = make_split(df, "by_task", seed=0)
    _check_partition(sp, len(df))
    test_tasks = set(df["task_id"].iloc[sp.test])
    assert test_tasks == set(sp.info["test_tasks"]) and len(test_tasks) == 2
    assert not test_tasks & set(df["task_id"].iloc[sp.train])
    assert sp.info["val_unit"] == "tasks" and not set(sp.info["val_tasks"]) & set(df["task_id"].iloc[sp.train])
    with pytest.raises(SplitError, match="within_task"):
        make_split(_records(n_tasks=1), "by_task")


def test_by_network_split():
    nets = ["resnet", "resnet", "bert", "bert", "mobilenet", ""]
    df = _records(networks=nets)
    sp = make_split(df, "by_network", seed=0, test_networks=["bert"])
    _check_partition(sp, len(df))
    assert set(df["task_id"].iloc[sp.test]) == {"t2", "t3"}
    assert sp.info["test_networks"] == ["bert"]
    auto = make_split(df, "by_network", seed=0)
    assert len(auto.info["test_networks"]) == 1
    with pytest.raises(SplitError, match="not in this workspace"):
        make_split(df, "by_network", test_networks=["gpt"])
    with pytest.raises(SplitError, match="no networks in this workspace.*use split=by_task"):
        make_split(_records(), "by_network")
    with pytest.raises(SplitError, match="valid: within_task, by_task, by_network"):
        make_split(df, "random")


def test_by_network_shared_task_is_held_out_and_counts_in_both_networks():
    df = _records(n_tasks=4, per_task=6, networks=["resnet", "resnet", "bert", "bert"])
    members = pd.DataFrame({"task_id": ["t0", "t1", "t1", "t2", "t3"],
                            "group": ["resnet", "resnet", "bert", "bert", "bert"], "weight": [1, 2, 5, 1, 1]})
    sp = make_split(df, "by_network", test_networks=["bert"], members=members)
    assert set(df["task_id"].iloc[sp.test]) == {"t1", "t2", "t3"}  # t1 is also called by bert
    assert set(df["task_id"].iloc[sp.train]) | set(df["task_id"].iloc[sp.val]) == {"t0"}
    # the weighted score counts t1 in both networks with each network's weight
    lat = _frame({"t0": [1.0, 2.0], "t1": [1.0, 3.0]}, {"t0": 1, "t1": 1}, {"t0": "x", "t1": "x"})
    ev = M.evaluate(lat, np.array([0.0, 1.0, 0.0, 1.0]), members=members)  # always picks the slow one
    groups = ev.per_group.set_index("group")
    assert groups.loc["bert", "top1_score"] == pytest.approx(1 / 3)
    assert groups.loc["resnet", "top1_score"] == pytest.approx((1 * 1 + 2 * 1) / (1 * 2 + 2 * 3))


# ---------------------------------------------------------------------------- models on a small table


def _random_stores(seed: int, n_tasks: int, per_task: int, d: int, max_stores: int):
    """(task, record, store features) of random records with 1..max_stores stores each."""
    rng = np.random.default_rng(seed)
    for t in range(n_tasks):
        for i in range(per_task):
            yield rng, t, i, rng.normal(size=(int(rng.integers(1, max_stores + 1)), d)).astype(np.float32)


def _training_table(df: pd.DataFrame, stores: list, spec: FeatureSpec, sets: dict) -> TrainingTable:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in stores])]).astype(np.int64)
    return TrainingTable("ws", df, spec, sets, np.concatenate(stores), offsets)


def _table(seed=0, n_tasks=4, per_task=24, d=6) -> TrainingTable:
    """Records whose latency depends on their stores' first feature, so models can learn."""
    rows, stores = [], []
    for rng, t, i, s in _random_stores(seed, n_tasks, per_task, d, 3):
        stores.append(s)
        lat = float(np.exp(0.5 * s[:, 0].sum() + 0.05 * rng.normal()))
        rows.append(dict(record_id=f"t{t}r{i}", task_id=f"t{t}", network="", group="all", weight=1, mean_s=lat,
                         **{f"static.f{j}": float(s[:, j].sum()) for j in range(d)},
                         **{"profiler.c": lat * 1e3}))
    df = pd.DataFrame(rows)
    df["label"] = df.groupby("task_id")["mean_s"].transform("min") / df["mean_s"]
    cols = [c for c in df.columns if c.startswith(("static.", "profiler."))]
    spec = FeatureSpec("all", cols, [f"s{j}" for j in range(d)])
    return _training_table(df, stores, spec, {"static": cols[:d], "profiler": cols[d:]})


def test_gather_segments_and_take():
    tab = _table()
    idx, seg = gather_segments(tab.offsets, np.array([2, 0]))
    n2, n0 = np.diff(tab.offsets)[[2, 0]]
    assert list(seg) == [0] * n2 + [1] * n0
    assert list(idx[:n2]) == list(range(tab.offsets[2], tab.offsets[3]))
    sub = tab.take(np.array([2, 0]))
    assert np.array_equal(sub.stores, tab.stores[idx]) and list(sub.frame["record_id"]) == ["t0r2", "t0r0"]
    long = sub.store_frame()
    assert len(long) == n2 + n0 and list(long["record_id"].unique()) == ["t0r2", "t0r0"]


def _model(name: str, overrides: list[str] | None = None, spec: FeatureSpec | None = None):
    """An untrained model made as stage=train makes it: its composed config, instantiated."""
    from models import registry
    from pipeline.config import compose

    cfg = compose([f"model={name}", *(overrides or [])])
    return registry.create(cfg.model, spec or _table().spec, seed=0, threads=1)


STORE_MODELS = {"mlp", "lgbm_ps", "lgbm_ps_rank", "xgb_ps", "ens_ps"}


@pytest.mark.parametrize("name", ["lgbm", "lgbm_rank", "xgb", "xgb_rank", "mlp", "lgbm_w", "lgbm_ps", "lgbm_ps_rank",
                                  "xgb_ps", "ens_ps"])
def test_models_learn_and_roundtrip(name, tmp_path):
    from models import registry

    tab = _table()
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


def _additive_table(seed=0, n_tasks=6, per_task=40, d=5) -> TrainingTable:
    """Records whose label is a sum of per-store terms (what a pack-sum model assumes)."""
    rows, stores = [], []
    for _, t, i, s in _random_stores(seed, n_tasks, per_task, d, 4):
        stores.append(s)
        rows.append(dict(record_id=f"t{t}r{i}", task_id=f"t{t}", network="", group="all", weight=1,
                         label=float(np.sum(np.where(s[:, 0] > 0, 0.3, 0.05) + 0.1 * np.tanh(s[:, 1])))))
    df = pd.DataFrame(rows)
    df["mean_s"] = 1.0 / df["label"].clip(lower=1e-3)
    return _training_table(df, stores, FeatureSpec("static", [], [f"s{j}" for j in range(d)]), {"static": []})


@pytest.mark.parametrize("name", ["lgbm_ps", "xgb_ps", "lgbm_ps_rank"])
def test_pack_sum_models_learn_store_costs(name):
    """input=stores: the loss on each record's sum of store outputs trains the per-store trees,
    and a record's score is exactly that sum."""
    tab = _additive_table(n_tasks=8, per_task=50)
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

    tab = _table()
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
    tab = _additive_table()
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


def test_label_weight_and_early_stopping_metric():
    from models.metrics import STOP_METRICS

    tab = _table()
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


@pytest.mark.parametrize("name", ["lgbm", "xgb", "mlp"])
def test_continue_fit_trains_further_in_place(name):
    tab = _table()
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


def test_model_all_composes_every_model_config_and_reaches_per_model_overrides():
    from pipeline.config import CONF_DIR, compose

    cfg = compose(["model.lgbm.params.num_leaves=63", "model.mlp.hidden=32"])
    files = {p.stem for p in (CONF_DIR / "model").glob("*.yaml")} - {"all"}
    assert set(cfg.model) - {"name"} == files  # a new model config must be listed in model/all.yaml
    from models import registry

    lgbm = registry.create(cfg.model.lgbm, _table().spec)
    assert lgbm.library_params["num_leaves"] == 63 and lgbm.name == "lgbm"
    assert registry.create(cfg.model.mlp, _table().spec).hidden == 32


def test_saved_model_of_an_earlier_layout_loads(tmp_path):
    """A model.json whose params hold only the keys its config had (no defaults recorded)."""
    import json

    from models import registry

    tab = _table()
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
        registry.create({"name": "catboost", "depth": 6}, _table().spec)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.json").write_text(json.dumps({"name": "x", "class": "os.system"}))
    with pytest.raises(registry.UnknownModelError, match="names class 'os.system', not a cost model"):
        registry.load(tmp_path / "m")


def test_by_network_validates_on_a_whole_training_network_rotating_with_the_seed():
    nets = ["resnet", "resnet", "bert", "bert", "mobilenet", "mobilenet", "vit", ""]
    df = _records(n_tasks=8, networks=nets)
    seen = set()
    for seed in range(3):
        sp = make_split(df, "by_network", seed=seed, test_networks=["bert"], val_unit="network")
        _check_partition(sp, len(df))
        (vnet,) = sp.info["val_networks"]
        assert sp.info["val_unit"] == "network" and vnet != "bert"
        val_tasks = set(df["task_id"].iloc[sp.val])
        assert val_tasks == {f"t{i}" for i, n in enumerate(nets) if n == vnet} == set(sp.info["val_tasks"])
        assert "t7" in set(df["task_id"].iloc[sp.train])  # a standalone operator always trains
        seen.add(vnet)
    assert seen == {"mobilenet", "resnet", "vit"}  # each training network validates once over 3 seeds
    # one training network left: validation by tasks, and the split says so
    two = make_split(_records(n_tasks=4, networks=["a", "a", "b", "b"]), "by_network", test_networks=["a"],
                     val_unit="network")
    assert two.info["val_unit"] != "network"
    with pytest.raises(SplitError, match="split.val_unit"):
        make_split(df, "by_network", val_unit="records")


# ---------------------------------------------------------------------------- chance and intervals


def test_random_pick_scores_are_exact_expectations():
    # one task, latencies 1, 2, 4 s: a random pick has expected latency 7/3 s -> top-1 3/7;
    # the best of 2 random picks: 1 s with prob 2/3, 2 s with prob 1/3 -> 4/3 s
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 2) == pytest.approx(4 / 3)
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 1) == pytest.approx(7 / 3)
    assert M.expected_random_best(np.array([4.0, 1.0, 2.0]), 9) == pytest.approx(1.0)
    df = _frame({"a": [1.0, 2.0, 4.0]}, {"a": 1}, {"a": "net"})
    ev = M.evaluate(df, np.array([3.0, 2.0, 1.0]))
    assert ev.summary["random_top1_score"] == pytest.approx(3 / 7)
    assert ev.summary["random_top5_score"] == pytest.approx(1.0)  # 3 records: the top-5 holds them all
    # weighted over tasks as the models' scores are: (w_a*1 + w_b*1) / (w_a*7/3 + w_b*1.5)
    df = _frame({"a": [1.0, 2.0, 4.0], "b": [1.0, 2.0]}, {"a": 1, "b": 3}, {"a": "net", "b": "net"})
    ev = M.evaluate(df, np.zeros(5))
    assert ev.summary["random_top1_score"] == pytest.approx(4 / (7 / 3 + 3 * 1.5))


def _per_task(model, seed, top1, best=1.0, heldout="net", features="static"):
    return [dict(features=features, model=model, heldout=heldout, seed=str(seed), task_id=f"t{i}", best_s=best,
                 top1_s=t) for i, t in enumerate(top1)]


def test_paired_intervals_against_the_reference():
    from models.evaluation import paired_intervals

    rows = []
    for seed in (0, 1):
        rows += _per_task("ms_xgb", seed, [2.0] * 20)  # score 0.5 on every task
        rows += _per_task("good", seed, [1.0] * 20)  # score 1.0: +0.5 on every resample
        rows += _per_task("same", seed, [2.0] * 20)
        rows += _per_task("mixed", seed, [1.0] * 10 + [4.0] * 10)  # sum best 20 / sum 50 = 0.4
    weights = pd.DataFrame({"heldout": "net", "task_id": [f"t{i}" for i in range(20)], "weight": 1.0})
    out = paired_intervals(pd.DataFrame(rows), weights, resamples=500).set_index("model")
    assert out.loc["good", "diff"] == pytest.approx(0.5) and out.loc["good", "lo"] == pytest.approx(0.5)
    assert out.loc["same", ["diff", "lo", "hi"]].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert out.loc["mixed", "diff"] == pytest.approx(-0.1) and out.loc["mixed", "lo"] < -0.1 < out.loc["mixed", "hi"]
    assert (out["n_tasks"] == 20).all() and (out["n_seeds"] == 2).all()
    # two networks: a `mean` row averaging them
    rows2 = rows + [{**r, "heldout": "net2"} for r in rows]
    weights2 = pd.concat([weights, weights.assign(heldout="net2")])
    both = paired_intervals(pd.DataFrame(rows2), weights2, resamples=200)
    mean = both[both["heldout"] == "mean"].set_index("model")
    assert mean.loc["good", "diff"] == pytest.approx(0.5) and mean.loc["good", "n_tasks"] == 40
