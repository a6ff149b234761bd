"""The federated XGBoost job's pure parts: parameters, shared category encoding, metrics, baselines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from treeflare.data import Feature, Schema, Table, prepare_federation, write_federation
from treeflare.xgb import (ENCRYPT_MESSAGE, check_federated_build, make_params, metric_keys, score, table_arrays,
                           union_train)
from treeflare.xgb.encoding import global_test, load_site

xgb = pytest.importorskip("xgboost")


def small_table(n=240, seed=0, multiclass=False) -> Table:
    rng = np.random.default_rng(seed)
    cats = ("a", "b", "c", "d")
    colour = rng.choice(cats, n)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    score_ = x1 + (colour == "c") * 1.5 - (colour == "a")
    if multiclass:
        y = np.digitize(score_, [-0.5, 0.5, 1.5]).astype(str)
        classes = ("0", "1", "2", "3")
    else:
        y = (score_ + 0.3 * rng.normal(size=n) > 0.2).astype(int).astype(str)
        classes = ("0", "1")
    frame = pd.DataFrame({"x1": x1, "colour": colour, "x2": x2})
    schema = Schema((Feature("x1", "numeric"), Feature("colour", "categorical", cats), Feature("x2", "numeric")),
                    "y", classes)
    return Table(frame, y.astype(object), schema, None, "small")


def test_params_binary_and_multiclass():
    b = make_params(2, max_depth=3, eta=0.2)
    assert b["objective"] == "binary:logistic" and "num_class" not in b and b["nthread"] == 1
    m = make_params(5)
    assert m["objective"] == "multi:softprob" and m["num_class"] == 5
    assert metric_keys(2) == ("auc", "accuracy", "logloss")
    assert metric_keys(4) == ("accuracy", "macro_f1", "mlogloss")
    with pytest.raises(ValueError):
        make_params(1)


def test_federated_build_and_encrypt_message():
    check_federated_build()  # the pinned wheel has USE_FEDERATED
    assert "treeflare vertical" in ENCRYPT_MESSAGE and "clear" in ENCRYPT_MESSAGE


def test_categories_encoded_from_shared_schema_not_local_values():
    t = small_table()
    only_d = t.subset(np.flatnonzero(t.frame["colour"].to_numpy() == "d"))
    only_b = t.subset(np.flatnonzero(t.frame["colour"].to_numpy() == "b"))
    # a site that only ever saw "d" still encodes it as 3 (schema order), not 0
    assert set(table_arrays(only_d).X[:, 1]) == {3.0}
    assert set(table_arrays(only_b).X[:, 1]) == {1.0}
    a = table_arrays(t)
    assert a.feature_types == ["q", "c", "q"] and a.has_categorical


def test_score_keys_and_values():
    y = np.array([0, 1, 1, 0])
    s = score(y, np.array([0.1, 0.9, 0.8, 0.3]), 2)
    assert set(s) == {"auc", "accuracy", "logloss"} and s["auc"] == 1.0 and s["accuracy"] == 1.0
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    s3 = score(np.array([0, 1, 2]), p, 3)
    assert set(s3) == {"accuracy", "macro_f1", "mlogloss"} and s3["accuracy"] == 1.0


def test_vertical_parties_align_on_ids_and_only_owner_has_label(tmp_path):
    fed = prepare_federation(small_table(), 3, vertical=True, n_passive=2, seed=1)
    write_federation(fed, tmp_path / "fed")
    tr1, _ = load_site(tmp_path / "fed", "site-1", fed.schema.to_dict(), vertical=True)
    tr2, _ = load_site(tmp_path / "fed", "site-2", fed.schema.to_dict(), vertical=True)
    assert tr1.y is not None and tr2.y is None
    assert np.array_equal(tr1.ids, tr2.ids)
    joined = union_train(tmp_path / "fed")
    assert joined.feature_names == fed.schema.feature_names
    test = global_test(tmp_path / "fed")
    assert test.X.shape == (len(fed.server_test), 3) and test.y is not None


def test_centralized_equals_native_distributed_on_small_multiclass(tmp_path):
    from treeflare.xgb import baselines

    fed = prepare_federation(small_table(multiclass=True), 3, "iid", seed=0)
    write_federation(fed, tmp_path / "fed")
    params = make_params(4, max_depth=3, eta=0.3)
    c = baselines.centralized(tmp_path / "fed", params, 4)
    n = baselines.native_distributed(tmp_path / "fed", params, 4, timeout=120)
    assert set(c["metrics"]) == {"accuracy", "macro_f1", "mlogloss"}
    assert c["proba"].shape == (len(fed.server_test), 4)
    assert abs(c["metrics"]["mlogloss"] - n["metrics"]["mlogloss"]) < 1e-3


def test_missing_federated_support_fails_clearly(monkeypatch):
    from treeflare.xgb import XGBSetupError

    monkeypatch.setattr(xgb, "build_info", lambda: {"USE_FEDERATED": False})
    with pytest.raises(XGBSetupError, match="USE_FEDERATED"):
        check_federated_build()
