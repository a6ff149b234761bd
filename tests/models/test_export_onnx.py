"""ONNX exports checked through onnxruntime: the global tree's pipeline (skl2onnx) on every embedded data set,
missing values, unknown categories, categorical stops and missing children; XGBoost (onnxmltools) on a numeric
model, and its refusal of a categorical one; scripts/export.py end to end on saved models."""

from __future__ import annotations

import importlib

import json
import warnings

import joblib
import numpy as np
import onnx
import pytest
import xgboost as xgb

from export_helpers import (EMBEDDED, cart_with_missing_children, deep_id3, embedded, hand_made_id3, mixed_rows)

from treeflare.data import load_dataset
from treeflare.icdta4fl.sklearn_export import to_sklearn
from treeflare.onnx_export import (OnnxExportError, input_columns, pipeline_to_onnx, run_onnx, tree_onnx_inputs,
                                   xgb_to_onnx)
from treeflare.xgb.model import XGBModel, attach_schema

# both files read the models export_helpers caches per process: one worker builds each once
pytestmark = pytest.mark.xdist_group("export_models")

TOL = 2.0 ** -23  # onnxruntime's tree ensemble classifier writes float32 probabilities
export_script = importlib.import_module("treeflare.tools.export")


def assert_onnx_same(model, rows):
    onx = pipeline_to_onnx(to_sklearn(model), model.data_schema)
    label, proba = run_onnx(onx.SerializeToString(), tree_onnx_inputs(onx, rows))
    assert proba.dtype == np.float32
    assert np.array_equal(label.ravel(), model.predict(rows).astype(str))
    assert np.max(np.abs(proba - model.predict_proba(rows))) <= TOL
    return onx


@pytest.mark.parametrize("dataset,algorithm", EMBEDDED)
def test_embedded_global_trees_through_onnxruntime(dataset, algorithm):
    model, rows = embedded(dataset, algorithm)
    onx = assert_onnx_same(model, rows)
    assert sorted(input_columns(onx).values()) == sorted(model.data_schema.feature_names)


@pytest.mark.parametrize("missing_pos", [-1, 1, 2])
def test_categorical_stops_and_missing_children_through_onnxruntime(missing_pos):
    rows, _ = mixed_rows(300, 5)
    rows.loc[:9, "u"] = [np.nextafter(-0.5, 0), np.nextafter(0.5, 1), -0.5, 0.5, 1e-9] * 2  # float32 would cross
    assert_onnx_same(hand_made_id3(missing_pos), rows)


def test_nan_follows_the_missing_child_in_onnx():
    """skl2onnx writes 'NaN goes to the false branch' everywhere; the export sets each split's own side."""
    model = cart_with_missing_children()
    onx = assert_onnx_same(model, mixed_rows(500, 6)[0])
    ensemble = next(n for n in onx.graph.node if n.op_type == "TreeEnsembleClassifier")
    tracks = next(onnx.helper.get_attribute_value(a) for a in ensemble.attribute
                  if a.name == "nodes_missing_value_tracks_true")
    assert 0 < sum(tracks) < len(tracks)


@pytest.fixture(scope="module")
def xgb_models(tmp_path_factory):
    """XGBoost models saved as the job saves them: higgs (numeric columns, binary), car (ordinal columns, four
    classes) and adult (categorical columns)."""
    from treeflare.xgb.encoding import dmatrix, table_arrays
    from treeflare.xgb.params import make_params

    out = {}
    for name in ("higgs_subset", "car", "adult"):
        table = load_dataset(name).subset(np.arange(1200))
        folder = tmp_path_factory.mktemp(f"xgb_{name}")
        booster = xgb.train(make_params(len(table.schema.classes), max_depth=3), dmatrix(table_arrays(table)), 4)
        attach_schema(booster, table.schema)
        booster.save_model(str(folder / "model.json"))
        out[name] = (folder, table)
    return out


@pytest.mark.parametrize("name", ["higgs_subset", "car"])
def test_xgboost_numeric_model_through_onnxruntime(xgb_models, name):
    folder, table = xgb_models[name]
    model = XGBModel.load(folder / "model.json")
    rows = table.frame.copy()
    rows.iloc[::7, 3] = np.nan  # XGBoost's default branches
    onx = xgb_to_onnx(model)
    X = np.asarray(model.encode_rows(rows).X, dtype=np.float32)
    label, proba = run_onnx(onx, {"input": X})
    assert np.array_equal(label, model.predict_codes(rows))
    assert np.max(np.abs(proba - model.predict_proba(rows))) <= 2 * TOL
    meta = {p.key: p.value for p in onx.metadata_props}
    assert json.loads(meta["treeflare_features"]) == table.schema.feature_names


def test_xgboost_categorical_model_is_refused_with_the_reason(xgb_models):
    model = XGBModel.load(xgb_models["adult"][0] / "model.json")
    with pytest.raises(OnnxExportError, match="categorical features .*workclass.*sets of categories"):
        xgb_to_onnx(model)


@pytest.fixture(scope="module")
def tree_workspace(tmp_path_factory):
    model, rows = embedded("adult", "id3")
    folder = tmp_path_factory.mktemp("icdta4fl_ws")
    model.save_json(folder / "global_tree.json")
    return folder, rows


def test_export_script_sklearn_and_onnx_on_a_saved_global_tree(tree_workspace, capsys):
    import onnxruntime as ort

    from treeflare.icdta4fl.model import GlobalTree

    folder, rows = tree_workspace
    model = GlobalTree.load_json(folder / "global_tree.json")
    assert export_script.main(["--model", str(folder), "--format", "sklearn"]) == 0
    assert "equal bit for bit" in capsys.readouterr().out
    pipeline = joblib.load(folder / "global_tree.joblib")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert np.array_equal(pipeline.predict_proba(rows), model.predict_proba(rows))
    out = folder / "served.onnx"
    assert export_script.main(["--model", str(folder / "global_tree.json"), "--format", "onnx", "--out", str(out)]) == 0
    onx = onnx.load(str(out))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # onnxruntime alone
    label, proba = session.run(None, tree_onnx_inputs(onx, rows))
    assert np.array_equal(label.ravel(), model.predict(rows).astype(str))
    assert np.max(np.abs(proba - model.predict_proba(rows))) <= TOL


def test_export_script_xgboost_onnx_and_refusals(xgb_models, capsys):
    folder, _ = xgb_models["higgs_subset"]
    assert export_script.main(["--model", str(folder), "--format", "onnx"]) == 0
    assert (folder / "model.onnx").stat().st_size > 0 and "labels equal" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        export_script.main(["--model", str(folder), "--format", "sklearn"])
    assert exc.value.code == 2 and "no scikit-learn tree" in capsys.readouterr().err
    adult = xgb_models["adult"][0]
    with pytest.raises(SystemExit) as exc:
        export_script.main(["--model", str(adult), "--format", "onnx"])
    assert exc.value.code == 2 and "categorical features" in capsys.readouterr().err
    assert not (adult / "model.onnx").exists()


def test_export_script_writes_nothing_when_the_check_fails(tmp_path, capsys):
    """--portable rounds numbers to float32 as scikit-learn does: the check rows next to thresholds catch it."""
    folder = tmp_path
    hand_made_id3(0).save_json(folder / "global_tree.json")
    out = tmp_path / "portable.joblib"
    code = export_script.main(["--model", str(folder), "--format", "sklearn", "--portable", "--out", str(out)])
    assert code == 1 and not out.exists() and "predict differently" in capsys.readouterr().err


def test_portable_pipeline_converts_with_float_inputs():
    """Without Float32Snap the graph takes float numbers, as scikit-learn rounds them itself: it predicts as the
    portable pipeline does."""
    model = hand_made_id3(1)
    rows, _ = mixed_rows(300, 7)
    pipeline = to_sklearn(model, portable=True)
    onx = pipeline_to_onnx(pipeline, model.data_schema)
    assert [i.type.tensor_type.elem_type for i in onx.graph.input] == [1, 1, 8, 8]  # float, float, string, string
    label, proba = run_onnx(onx, tree_onnx_inputs(onx, rows))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert np.array_equal(label.ravel(), pipeline.predict(rows).astype(str))
        assert np.max(np.abs(proba - pipeline.predict_proba(rows))) <= TOL


@pytest.mark.parametrize("thresholds", [(0.1, 0.3), (-0.3, 0.7), (1 / 3, 2 / 3)])
def test_thresholds_that_are_no_float32_route_neighbouring_values_exactly(thresholds):
    """The graph's float32 thresholds (rounded up or down from ours) and the snapped inputs around them."""
    model = hand_made_id3(0)
    model.tree_.split_points[1] = np.array(thresholds)  # the red branch's u split
    rows, _ = mixed_rows(48, 8)
    rows["colour"] = "red"
    rows["u"] = [f(t) for t in thresholds for f in (lambda t: t, lambda t: np.nextafter(t, 1),
                                                    lambda t: np.nextafter(t, -1), lambda t: float(np.float32(t)))] * 6
    assert any(float(np.float32(t)) > t for t in thresholds) or any(float(np.float32(t)) < t for t in thresholds)
    assert_onnx_same(model, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert np.array_equal(to_sklearn(model).predict_proba(rows), model.predict_proba(rows))


def test_a_leaf_whose_best_class_is_a_float32_tie_is_refused():
    """Counts [10, 1e8, 1e8 + 3]: classes b and c are equal in float32 (onnxruntime would say b), c wins in
    float64; the export is refused, naming the node."""
    from export_helpers import MIXED
    from treeflare.icdta4fl.encoding import feature_space
    from treeflare.icdta4fl.model import GlobalTree
    from treeflare.trees.tree import LEAF, NUMERIC, Tree

    tie = [10.0, 1e8, 1e8 + 3]
    proba = np.array(tie) / sum(tie)
    assert proba[1] < proba[2] and np.float32(proba[1]) == np.float32(proba[2])
    tree = Tree(["numeric", "numeric", "categorical", "numeric"], 3, [NUMERIC, LEAF, LEAF], [0, -1, -1],
                [np.array([0.0]), None, None], [np.array([1, 2]), None, None], [np.add(tie, 9), [9, 0, 0], tie],
                n_categories=[None, None, 4, None], missing=[0, -1, -1])
    model = GlobalTree(tree, MIXED.classes, feature_space(MIXED, "id3")[0], data_schema=MIXED, encoding="id3")
    with pytest.raises(OnnxExportError, match=r"node 2 of the global tree .*equal in float32"):
        pipeline_to_onnx(to_sklearn(model), MIXED)
    tree.counts[2] = [10.0, 1e8, 1e8 + 30]  # distinct in float32 too: exported, labels agree
    assert_onnx_same(model, mixed_rows(200, 9)[0])


def _leaves(model):
    return {n for n in range(model.tree_.n_nodes) if model.tree_.children[n] is None}


def test_check_rows_reach_every_leaf_the_random_rows_miss(tmp_path):
    """The pre-write check's leaf rows (one per leaf, from its decision path) reach the deep leaves that its 400
    random rows miss; also on a CART tree's one-hot columns."""
    from treeflare.prediction import load_model

    model = deep_id3()
    model.save_json(tmp_path / "global_tree.json")
    loaded = load_model(tmp_path, None)
    assert _leaves(model) - set(model.apply(export_script.random_rows(loaded)))  # what the check missed before
    rows = export_script.check_rows(loaded)
    assert set(model.apply(rows)) >= _leaves(model)
    assert export_script.main(["--model", str(tmp_path), "--format", "sklearn"]) == 0
    cart, _ = embedded("adult", "cart")
    (tmp_path / "cart").mkdir()
    cart.save_json(tmp_path / "cart" / "global_tree.json")
    loaded = load_model(tmp_path / "cart", None)
    assert set(cart.apply(export_script.check_rows(loaded))) >= _leaves(cart)


@pytest.mark.parametrize("algorithm", ["id3", "cart"])
def test_refined_global_tree_exports_exactly(algorithm):
    """The job's default tree (one refinement round) on adult: its one-vs-rest categorical nodes (ID3: a node with
    one value and one child, the other values stopping or going on through ``missing``; CART: a split on one
    one-hot column) predict bit for bit in scikit-learn and label alike in onnxruntime."""
    from treeflare.trees.tree import CATEGORICAL

    model, rows = embedded("adult", algorithm, refine_rounds=1)
    tree = model.tree_
    inner = [n for n in range(tree.n_nodes) if tree.children[n] is not None]
    if algorithm == "id3":
        one_vs_rest = [n for n in inner if tree.kind[n] == CATEGORICAL and len(tree.split_points[n]) == 1
                       and len(tree.children[n]) == 1]
        reached = model.apply(rows)
        assert one_vs_rest and np.isin(reached, one_vs_rest).any()  # rows stop there (the "rest")
    else:
        categorical = {f.name for f in model.data_schema.features if f.kind == "categorical"}
        assert any(model.feature_names_in_[int(tree.feature[n])].split("=")[0] in categorical for n in inner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pipeline = to_sklearn(model)
        assert np.array_equal(pipeline.predict_proba(rows), model.predict_proba(rows))
        assert np.array_equal(pipeline.predict(rows), model.predict(rows))
    assert_onnx_same(model, rows)


def test_the_docs_onnxruntime_example_gives_treeflare_predicts_answers(tmp_path, monkeypatch):
    """docs/icdta4fl.md's onnxruntime snippet, run as printed on an adult global tree exported by `treeflare export`
    (its paths: out/icd_car/global_tree.onnx, new.csv): the same classes as `treeflare predict`, the same
    probabilities to float32 rounding, with a blank cell and an unknown category among the rows."""
    import contextlib
    import io
    from pathlib import Path

    import pandas as pd
    from test_predict import tree_model
    from treeflare.data import load_dataset
    from treeflare.prediction import predict_csv
    from treeflare.tools.export import main as export_main

    docs = (Path(__file__).resolve().parents[2] / "docs" / "icdta4fl.md").read_text()
    section = docs.split("### Serving the ONNX tree with onnxruntime", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    table = load_dataset("adult")
    (tmp_path / "out" / "icd_car").mkdir(parents=True)  # the snippet's path, whatever the data
    model_file = tmp_path / "out" / "icd_car" / "global_tree.json"
    tree_model(table, "cart", model_file)
    assert export_main(["--model", str(model_file), "--format", "onnx"]) == 0
    rows = table.frame.head(80).astype(str).replace("nan", "")
    kinds = {f.name: f.kind for f in table.schema.features}
    numeric = next(c for c in rows.columns if kinds[c] == "numeric")
    categorical = next(c for c in rows.columns if kinds[c] == "categorical")
    rows.loc[rows.index[0], numeric] = ""                        # a missing cell
    rows.loc[rows.index[1], categorical] = "a value never seen"  # an unknown category
    rows.to_csv(tmp_path / "new.csv", index=False)
    ran = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(snippet, "docs/icdta4fl.md", "exec"), ran)
    predict_csv(model_file, tmp_path / "new.csv", tmp_path / "p.csv")
    expected = pd.read_csv(tmp_path / "p.csv", dtype={"predicted": str})
    assert list(ran["label"].ravel()) == list(expected["predicted"])
    classes = [c.removeprefix("p_") for c in expected.columns if c.startswith("p_")]
    np.testing.assert_allclose(ran["probabilities"], expected[[f"p_{c}" for c in classes]].to_numpy(), atol=1e-6)
