"""to_sklearn(GlobalTree): a fitted scikit-learn Pipeline that predicts as the global tree, bit for bit, on raw
rows: every embedded data set and both learners, missing values, unknown categories, multiway ID3 splits,
``missing`` children, NaN and categories that stop at a node; sklearn's own tree tools work on it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.tree import export_graphviz, export_text, plot_tree

from export_helpers import (EMBEDDED, MIXED, cart_with_missing_children, embedded, hand_made_id3, mixed_rows)
from treeflare.icdta4fl.sklearn_export import ExportError, Float32Snap, to_sklearn
from treeflare.trees.tree import LEAF

# both files read the models export_helpers caches per process: one worker builds each once
pytestmark = pytest.mark.xdist_group("export_models")


def predictions(pipeline, rows):
    with warnings.catch_warnings():  # OneHotEncoder announces the unknown categories the rows hold on purpose
        warnings.simplefilter("ignore", UserWarning)
        return pipeline.predict(rows), pipeline.predict_proba(rows)


def assert_same(model, rows, **kw):
    pipeline = to_sklearn(model, **kw)
    label, proba = predictions(pipeline, rows)
    assert np.array_equal(proba, model.predict_proba(rows))  # bit for bit
    assert np.array_equal(label, model.predict(rows))
    return pipeline


@pytest.mark.parametrize("dataset,algorithm", EMBEDDED)
def test_embedded_global_trees_predict_the_same_bit_for_bit(dataset, algorithm):
    model, rows = embedded(dataset, algorithm)
    assert model.get_n_leaves() >= 4 and rows.isna().any().all()
    pipeline = assert_same(model, rows)
    assert pipeline[-1].get_n_leaves() >= model.get_n_leaves()
    if algorithm == "id3":  # rows with holes stop at internal nodes (ID3 names no missing child): they are covered
        assert (model.tree_.kind[model.apply(rows)] != LEAF).any()


def test_multiway_splits_are_chains_of_binary_tests():
    model, rows = embedded("adult", "id3")
    tree = model.tree_
    widths = [len(tree.children[n]) for n in range(tree.n_nodes) if tree.kind[n] != LEAF]
    assert max(widths) > 2  # multiway numeric and categorical ID3 nodes are in the tree
    sk = to_sklearn(model)[-1].tree_
    internal = sk.children_left >= 0
    assert internal.sum() >= sum(w - 1 for w in widths)


@pytest.mark.parametrize("missing_pos", [-1, 0, 1, 2])
def test_categorical_node_stops_unlisted_categories_and_routes_missing(missing_pos):
    """Every colour (two with a child, two without), missing, unknown; u and size missing; values at the u
    thresholds."""
    model = hand_made_id3(missing_pos)
    rows, _ = mixed_rows(300, 2)
    rows.loc[:20, "u"] = [-0.5, 0.5, np.nextafter(-0.5, 0), np.nextafter(0.5, 1)] * 5 + [0.0]
    assert set(rows["colour"].dropna()) >= {"red", "green", "blue", "grey"}
    stops = model.tree_.kind[model.apply(rows)] != LEAF
    assert stops.any() and not stops.all()
    assert_same(model, rows)


def test_cart_missing_children_and_missing_only_children():
    model = cart_with_missing_children()
    tree = model.tree_
    assert (tree.missing[tree.kind != LEAF] >= 0).all()
    assert any(tree.missing_only(n) for n in range(tree.n_nodes) if tree.kind[n] != LEAF)
    rows, _ = mixed_rows(500, 3)
    assert rows["v"].isna().any() and rows["u"].isna().any()
    assert_same(model, rows)


def test_float64_values_next_to_a_threshold_do_not_cross_it():
    """scikit-learn casts to float32: without Float32Snap a value just above a threshold may land on it."""
    model = hand_made_id3(0)
    rows, _ = mixed_rows(60, 4)
    rows["colour"] = "red"  # every row reaches the u split at -0.5 and 0.5
    rows["u"] = np.repeat([np.nextafter(-0.5, 0), np.nextafter(0.5, 1), -0.5, 0.5, 1e-9, np.nan], 10)
    assert_same(model, rows)
    label, _ = predictions(to_sklearn(model, portable=True), rows)
    assert not np.array_equal(label, model.predict(rows))  # what the snap is for
    portable = to_sklearn(model, portable=True)
    assert all(type(s).__module__.startswith("sklearn") for _, s, _ in portable[0].transformers_)


def test_snap_keeps_float32_inputs_and_refuses_thresholds_closer_than_float32():
    snap = Float32Snap([0.1, 0.5]).fit()
    x = np.array([[0.1], [np.float32(0.1)], [0.5], [np.nextafter(0.5, 1)], [np.nan], [3.0]])
    z = snap.transform(x)
    assert np.array_equal(z.astype(np.float32).astype(np.float64), z, equal_nan=True)
    assert list((z[:, 0] <= 0.1)[:4]) == list((x[:, 0] <= 0.1)[:4]) and np.isnan(z[4, 0]) and z[5, 0] == 3.0
    assert z[1, 0] == np.float32(0.1)
    with pytest.raises(ExportError, match="closer than float32"):
        Float32Snap([0.5, np.nextafter(0.5, 1)]).fit()


def test_sklearn_tools_work_on_the_tree_step(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    model, _ = embedded("nursery", "id3")
    pipeline = to_sklearn(model)
    names = list(pipeline[0].get_feature_names_out())
    tree = pipeline[-1]
    text = export_text(tree, feature_names=names)
    assert "class: " in text and any(f"{n} <=" in text for n in names)
    dot = export_graphviz(tree, feature_names=names, class_names=list(tree.classes_))
    assert dot.startswith("digraph") and "->" in dot
    assert len(plot_tree(tree, feature_names=names, max_depth=2)) > 3
    assert tree.feature_importances_.sum() == pytest.approx(1.0)


def test_refuses_a_model_without_its_schema():
    model, _ = embedded("car", "cart")
    bare = type(model)(model.tree_, model.classes_, model.feature_names_in_)
    with pytest.raises(ExportError, match="no data schema"):
        to_sklearn(bare)


def test_mixed_schema_columns():
    pipeline = to_sklearn(hand_made_id3(-1))
    names = list(pipeline[0].get_feature_names_out())
    assert names == ["u", "v", "colour_red", "colour_green", "colour_blue", "colour_grey", "size"]
    assert [f.name for f in MIXED.features] == list(pipeline[0].feature_names_in_)
