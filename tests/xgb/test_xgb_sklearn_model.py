"""XGBModel as a scikit-learn estimator, and its one-call conversion to XGBoost's own scikit-learn classifier
(``to_xgboost``, ``load_sklearn_model``): on small models trained here with XGBoost as the job trains them (the
schema's codes, categorical columns declared 'c'), the classifier's predictions are the booster's."""

from __future__ import annotations

import json

import joblib
import numpy as np
import pytest
from sklearn.base import clone, is_classifier
from sklearn.utils.validation import check_is_fitted

from export_helpers import MIXED, mixed_rows
from test_global_tree_estimator import assert_checks_apply
from treeflare.data import Schema
from treeflare.data.csv_io import features_table
from treeflare.xgb.encoding import dmatrix, table_arrays
from treeflare.xgb.model import ModelError, XGBModel, attach_schema, load_sklearn_model
from treeflare.xgb.params import make_params

xgb = pytest.importorskip("xgboost")

BINARY = Schema(MIXED.features, "y", ("no", "yes"))


def train(tmp_path, schema, *, vertical=False, attach=True):
    """(path of model.json, encoded new rows, raw new rows): 5 rounds of depth 3 on MIXED's rows."""
    frame, y = mixed_rows(600, 1)
    if len(schema.classes) == 2:
        y = (y > 0).astype(np.int64)
    a = table_arrays(features_table(frame, schema))
    a.y = y
    if vertical:  # a column-split model names its features "<rank>.<name>"
        a.feature_names = [f"{r}.{n}" for r, n in zip([0, 0, 1, 1], a.feature_names)]
    booster = xgb.train(make_params(len(schema.classes), max_depth=3), dmatrix(a), 5)
    if attach:
        attach_schema(booster, schema, "vertical" if vertical else "horizontal",
                      {"site-1": 0, "site-2": 1} if vertical else None)
    booster.save_model(str(tmp_path / "model.json"))
    rows, _ = mixed_rows(400, 5)
    return tmp_path / "model.json", table_arrays(features_table(rows, schema)).X, rows


@pytest.mark.parametrize("schema", [MIXED, BINARY], ids=["multiclass", "binary"])
def test_to_xgboost_predicts_as_the_booster(tmp_path, schema):
    path, X, rows = train(tmp_path, schema)
    model = XGBModel.load(path)
    clf = model.to_xgboost()
    assert type(clf) is xgb.XGBClassifier and is_classifier(clf) and clf.n_classes_ == len(schema.classes)
    assert np.isnan(X).any() and clf.enable_categorical  # missing values and categorical splits both exercised
    proba = clf.predict_proba(X)
    assert np.array_equal(proba, model.predict_proba(rows).astype(proba.dtype))
    # XGBoost's wrapper numbers the classes; the labels are the schema's, in the same order
    assert np.array_equal(clf.classes_, np.arange(len(schema.classes)))
    clear = np.abs(proba.max(axis=1) - 0.5) > 1e-6  # binary: XGBoost says class 1 above 0.5, XGBModel at 0.5
    assert clear.sum() > 300
    assert np.array_equal(model.classes_[clf.predict(X)][clear], model.predict(rows)[clear])
    assert json.loads(clf.get_booster().attr("treeflare"))["schema"] == schema.to_dict()  # goes along


def test_load_sklearn_model_needs_no_schema_and_checks_the_file(tmp_path):
    path, X, rows = train(tmp_path, MIXED, attach=False)
    clf = load_sklearn_model(path)
    assert np.array_equal(clf.predict_proba(X), xgb.Booster(model_file=str(path)).predict(
        xgb.DMatrix(X, feature_names=["u", "v", "colour", "size"], feature_types=["q", "q", "c", "q"],
                    enable_categorical=True)))
    doc = json.loads(path.read_text())
    doc["learner"]["gradient_booster"]["model"]["trees"][0]["left_children"][0] = 0  # would crash XGBoost
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=r"trees\[0\]\.left_children\[0\]"):
        load_sklearn_model(path)
    with pytest.raises(ModelError, match="file not found"):
        load_sklearn_model(tmp_path / "absent.json")


def test_xgb_model_is_a_fitted_estimator_that_clones(tmp_path):
    path, _, rows = train(tmp_path, MIXED, vertical=True)
    model = XGBModel.load(path)
    assert is_classifier(model) and model.mode == "vertical" and model.n_features_in_ == 4
    check_is_fitted(model)
    copy = clone(model)
    assert copy.booster is not model.booster and copy.mode == "vertical" and copy.ranks == model.ranks
    assert np.array_equal(copy.predict_proba(rows), model.predict_proba(rows))
    with pytest.raises(NotImplementedError, match="the federation trained"):
        model.fit(rows, np.zeros(len(rows)))
    before = model.get_params(deep=False)
    with pytest.raises(ValueError, match="mode must be one of"):
        model.set_params(mode="diagonal")
    assert all(model.get_params(deep=False)[k] is before[k] for k in before)
    joblib.dump(model, tmp_path / "m.joblib")  # a user's own file
    assert np.array_equal(joblib.load(tmp_path / "m.joblib").predict_proba(rows), model.predict_proba(rows))


def test_check_estimator_passes_every_check_that_does_not_refit(tmp_path):
    assert_checks_apply(XGBModel.load(train(tmp_path, BINARY)[0]))
