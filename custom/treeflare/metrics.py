"""Classification metrics every job reports, the same way: accuracy, macro-F1, AUC and log loss."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score


def classification_metrics(y_true, y_pred, proba=None, n_classes: int | None = None) -> dict:
    """accuracy and macro-F1 (over the classes 0 .. n_classes - 1 when ``n_classes`` is given, else over those
    that occur); for probabilities also AUC (binary; None when the true labels hold one class only) and log
    loss (``logloss`` binary, ``mlogloss`` from an (n, k) array)."""
    y_true = np.asarray(y_true)
    out = {"accuracy": float(accuracy_score(y_true, y_pred)),
           "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0,
                                      labels=list(range(n_classes)) if n_classes else None))}
    if proba is not None:
        proba = np.asarray(proba, dtype=np.float64)
        k = n_classes or proba.shape[1]
        labels = list(range(k))
        if k == 2:
            pos = proba[:, 1] if proba.ndim == 2 else proba
            out["auc"] = float(roc_auc_score(y_true, pos)) if len(np.unique(y_true)) == 2 else None
            out["logloss"] = float(log_loss(y_true, np.clip(pos, 1e-15, 1 - 1e-15), labels=labels))
        elif proba.ndim == 2:
            p = np.clip(proba, 1e-15, 1.0)
            out["mlogloss"] = float(log_loss(y_true, p / p.sum(axis=1, keepdims=True), labels=labels))
    return out
