"""Score a booster on a test set with the report's metric keys."""

from __future__ import annotations

import numpy as np

from ..metrics import classification_metrics
from .encoding import Arrays, dmatrix
from .params import metric_keys


def predict_proba(booster, a: Arrays) -> np.ndarray:
    """(n,) P(class 1) for binary objectives, (n, K) for multi:softprob.

    A column-split (vertical) model names its features ``"<rank>.<name>"``; its feature order is the parties'
    columns in rank order, which is the schema order, so names are checked without the rank prefix.
    """
    names = booster.feature_names
    if names is not None:
        bare = [n.split(".", 1)[1] if n.split(".", 1)[0].isdigit() and "." in n else n for n in names]
        if bare != list(a.feature_names):
            raise ValueError(f"model features {names} do not match the test set's {a.feature_names}")
    return np.asarray(booster.predict(dmatrix(a, with_label=False), validate_features=False), dtype=np.float64)


def score(y: np.ndarray, proba: np.ndarray, n_classes: int) -> dict:
    """Binary: auc, accuracy, logloss; multiclass: accuracy, macro_f1, mlogloss."""
    if n_classes == 2:
        p1 = proba if proba.ndim == 1 else proba[:, 1]
        full = np.column_stack([1 - p1, p1])
        pred = (p1 >= 0.5).astype(np.int64)
    else:
        full = proba.reshape(len(y), n_classes)
        pred = full.argmax(axis=1)
    m = classification_metrics(y, pred, full, n_classes=n_classes)
    return {k: m[k] for k in metric_keys(n_classes)}


def score_booster(booster, a: Arrays, n_classes: int) -> tuple[dict, np.ndarray]:
    proba = predict_proba(booster, a)
    return score(a.y, proba, n_classes), proba


def metric_diffs(a: dict, b: dict) -> dict:
    """a - b for every shared key."""
    return {k: a[k] - b[k] for k in a if k in b and a[k] is not None and b[k] is not None}
