"""The step functions the FLARE glue calls, the global estimator, its JSON form, text and plot."""

import json

import numpy as np
import pytest

from treeflare.flare.icdta4fl.inprocess import run_in_process
from treeflare.icdta4fl import (GlobalTree, ModelPayloadError, aggregate, score_trees,
                                select_trees, train_local_tree)
from treeflare.icdta4fl.export import explain_row, export_text, plot_tree
from treeflare.trees import Tree
from treeflare.icdta4fl.pipeline import DEFAULT_MAX_LEAVES


def make_sites(n_sites=4, n=400, seed=0):
    """Five classes; a numeric column, a categorical column with 4 codes, a noise column."""
    rng = np.random.default_rng(seed)
    sites = []
    for s in range(n_sites):
        x0 = rng.uniform(0, 10, n)
        x1 = rng.integers(0, 4, n).astype(float)
        x2 = rng.normal(size=n)
        y = np.where(x0 < 3, 0, np.where(x0 < 6, 1 + (x1 >= 2), 3 + (x1 == 3)))
        flip = rng.random(n) < 0.05
        y = np.where(flip, rng.integers(0, 5, n), y)
        X = np.column_stack([x0, x1, x2])
        cut = int(0.8 * n)
        sites.append({"X_train": X[:cut], "y_train": y[:cut], "X_test": X[cut:], "y_test": y[cut:]})
    return sites


KINDS = ["numeric", "categorical", "numeric"]
NAMES = ["size", "colour", "noise"]
CLASSES = ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize("algorithm", ["id3", "cart"])
def test_run_in_process_end_to_end(algorithm):
    sites = make_sites()
    kinds = KINDS if algorithm == "id3" else ["numeric"] * 3
    test = make_sites(1, n=1000, seed=9)[0]
    out = run_in_process(sites, algorithm=algorithm, classes=CLASSES, feature_kinds=kinds,
                         feature_names=NAMES, n_categories=[None, 4, None], q=50,
                         X_global_test=test["X_test"], y_global_test=test["y_test"],
                         local_params={"max_depth": 4})
    model = out["model"]
    stats = out["stats"]
    assert out["selected"] and stats["n_leaves"] <= stats["max_leaves"] == DEFAULT_MAX_LEAVES
    assert model.get_depth() <= stats["local_max_depth"] + 2
    assert out["global"]["accuracy"] > 0.85
    assert out["global"]["macro_f1"] >= np.mean(out["local_on_global_test"]["macro_f1"]) - 0.02
    assert list(model.classes_) == CLASSES
    json.dumps(out["trees"], allow_nan=False)  # tree payloads are plain JSON
    json.dumps(stats, allow_nan=False)


def test_steps_match_the_glue_contract_and_site_order_does_not_matter():
    sites = make_sites(5, seed=3)
    trees = [train_local_tree(s["X_train"], s["y_train"], algorithm="id3", n_classes=5, feature_kinds=KINDS,
                              n_categories=[None, 4, None], params={"max_depth": 3}) for s in sites]
    assert all(isinstance(t, dict) and t["schema"] == "treeflare.tree" for t in trees)
    reports = [score_trees(trees, s["X_test"], s["y_test"]) for s in sites]
    assert set(reports[0]) == {"accuracy", "macro_f1"} and len(reports[0]["accuracy"]) == 5
    acc = [r["accuracy"] for r in reports]
    f1 = [r["macro_f1"] for r in reports]
    selected, thresholds = select_trees(acc, f1, statistic="percentile", q=0)
    assert selected == [0, 1, 2, 3, 4] and "accuracy" in thresholds
    model, stats = aggregate(trees, selected, classes=CLASSES, feature_names=NAMES)
    # the same trees arriving from the sites in another order give the same global tree
    perm = [3, 0, 4, 2, 1]
    model2, _ = aggregate([trees[i] for i in perm], selected, classes=CLASSES, feature_names=NAMES)
    assert model2.tree_.to_dict() == model.tree_.to_dict()
    assert set(stats) >= {"n_rules_merged", "n_rules", "n_leaves", "depth", "time_s", "selected"}


def test_aggregate_rejects_invalid_tree_payload():
    sites = make_sites(2)
    trees = [train_local_tree(s["X_train"], s["y_train"], algorithm="cart", n_classes=5) for s in sites]
    trees[1]["nodes"][0]["thresholds"] = [float("nan")]
    with pytest.raises(ValueError, match="thresholds"):
        aggregate(trees, [0, 1], classes=CLASSES)


def fitted_model():
    sites = make_sites(3, seed=4)
    out = run_in_process(sites, algorithm="id3", classes=CLASSES, feature_kinds=KINDS, feature_names=NAMES,
                         n_categories=[None, 4, None], category_names=[None, ["red", "green", "blue", "grey"], None],
                         q=0)
    return out["model"], sites


def test_global_tree_estimator_api(tmp_path):
    model, sites = fitted_model()
    X, y = sites[0]["X_test"], sites[0]["y_test"]
    assert model.n_features_in_ == 3 and list(model.feature_names_in_) == NAMES
    proba = model.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert set(model.predict(X)) <= set(CLASSES)
    assert model.score(X, y) == pytest.approx(np.mean(model.predict_codes(X) == y))
    assert model.score(X, np.asarray(CLASSES, dtype=object)[y]) == model.score(X, y)
    path = tmp_path / "global_tree.json"
    model.save_json(path)
    back = GlobalTree.load_json(path)
    np.testing.assert_array_equal(back.predict_proba(X), proba)
    assert back.get_n_leaves() == model.get_n_leaves() and back.get_depth() == model.get_depth()
    assert "import" not in path.read_text()


def test_model_json_validation(tmp_path):
    model, _ = fitted_model()
    d = model.to_dict()
    bad = json.loads(json.dumps(d))
    bad["classes"] = bad["classes"][:-1]
    with pytest.raises(ModelPayloadError, match="classes"):
        GlobalTree.from_dict(bad)
    for version in (3, 0, True, "2"):
        bad = json.loads(json.dumps(d))
        bad["version"] = version
        with pytest.raises(ModelPayloadError, match="version"):
            GlobalTree.from_dict(bad)
    assert d["version"] == 2
    bad = json.loads(json.dumps(d))
    bad["tree"]["nodes"][0]["counts"] = [1.0]
    with pytest.raises(ValueError, match="counts"):
        GlobalTree.from_dict(bad)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelPayloadError):
        GlobalTree.load_json(deep)


def test_export_text_and_plot(tmp_path):
    model, _ = fitted_model()
    text = export_text(model)
    assert "class:" in text and "support=" in text
    assert "size" in text and ("colour = " in text or "size <=" in text)
    assert text.count("class:") >= model.get_n_leaves()
    png = tmp_path / "tree.png"
    plot_tree(model, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_text_renders_onehot_columns():
    from treeflare.trees import fit_cart
    X = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]] * 10, dtype=float)
    y = np.array([0, 1, 1, 0] * 10)
    tree = fit_cart(X, y, n_classes=2, max_depth=1)
    text = export_text(GlobalTree(tree, ["no", "yes"], ["buying=vhigh", "buying=high", "buying=low"]))
    assert "buying != vhigh" in text and "buying = vhigh" in text
    big = GlobalTree(Tree.from_dict(tree.to_dict()), ["no", "yes"])
    assert "x0 <= 0.5" in export_text(big)


def test_unknown_parameters_are_rejected():
    sites = make_sites(1)
    with pytest.raises(ValueError, match="rule_cap"):
        train_local_tree(sites[0]["X_train"], sites[0]["y_train"], algorithm="cart", n_classes=5,
                         params={"rule_cap": 10})
    tree = train_local_tree(sites[0]["X_train"], sites[0]["y_train"], algorithm="cart", n_classes=5)
    with pytest.raises(ValueError, match="rule_cap"):
        aggregate([tree], [0], classes=CLASSES, params={"rule_cap": 10})


def test_global_tree_predicts_raw_rows_with_its_schema(tmp_path):
    """A saved global tree takes a DataFrame of raw values named as in the schema, like the encoded rows."""
    import pandas as pd

    from treeflare.data import load_dataset
    from treeflare.icdta4fl.encoding import category_names, encode, feature_space
    from treeflare.icdta4fl.model import GlobalTree

    table = load_dataset("adult").subset(np.arange(3000))
    for algorithm in ("cart", "id3"):
        names, kinds, n_cat = feature_space(table.schema, algorithm)
        tree = Tree.from_dict(train_local_tree(encode(table, algorithm), table.y_codes(), algorithm=algorithm,
                                               n_classes=2, feature_kinds=kinds, n_categories=n_cat,
                                               params={"max_depth": 4}))
        model = GlobalTree(tree, table.schema.classes, names, category_names(table.schema, algorithm),
                           data_schema=table.schema, encoding=algorithm)
        model.save_json(tmp_path / "m.json")
        loaded = GlobalTree.load_json(tmp_path / "m.json")
        raw = table.frame.copy()
        expected = model.predict(encode(table, algorithm))
        assert (loaded.predict(raw) == expected).all()
        assert np.allclose(loaded.predict_proba(raw), model.predict_proba(encode(table, algorithm)))
        assert loaded.score(raw, table.y) == model.score(encode(table, algorithm), table.y)
        # column order does not matter; extra columns are ignored; an unknown category and a missing value
        # stop at the node that tests them, as in training
        shuffled = raw[list(reversed(raw.columns))].assign(extra=1)
        assert (loaded.predict(shuffled) == expected).all()
        odd = raw.head(2).copy()
        odd.loc[0, "workclass"] = "Astronaut"
        odd.loc[1, "age"] = None
        assert loaded.predict(odd).shape == (2,)
        assert explain_row(loaded, raw.head(1)) and isinstance(explain_row(loaded, raw.head(1))[0], str)
        with pytest.raises(ValueError, match="age"):
            loaded.predict(raw.drop(columns=["age"]))
