"""Impurity of class weights, the one implementation every tree builder and rule ranker uses.

Each row of ``weights`` holds non-negative class weights (counts, or fractional masses); its distribution is
the row over its sum. The callers differ in two ways, kept as arguments so that each gets exactly what it had:
the log's base (ID3 gains are in bits, the rule merge and rebuild use nats) and what an empty row is (zero
impurity for a node without rows; the uniform distribution, the most impure, for a rule that lost its mass).
"""

from __future__ import annotations

import numpy as np

__all__ = ["entropy", "gini", "impurity"]


def shares(weights: np.ndarray, empty: str) -> np.ndarray:
    """Each row's distribution; an all-zero row is zeros (empty="zero") or uniform (empty="uniform")."""
    totals = weights.sum(axis=-1, keepdims=True)
    if empty == "zero":
        fill = 0.0
    elif empty == "uniform":
        fill = 1.0 / max(weights.shape[-1], 1)
    else:
        raise ValueError(f"empty must be 'zero' or 'uniform', got {empty!r}")
    return np.where(totals > 0, weights / np.where(totals > 0, totals, 1.0), fill)


def entropy(weights: np.ndarray, *, bits: bool = False, empty: str = "zero") -> np.ndarray:
    """Entropy of each row's distribution, in nats (``bits=True``: base 2); 0 log 0 is 0. An all-zero row is
    0 (``empty="zero"``) or log(n_classes) (``empty="uniform"``)."""
    p = shares(weights, empty)
    log = np.log2 if bits else np.log
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(p > 0, p * log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def gini(weights: np.ndarray) -> np.ndarray:
    """Gini impurity 1 - sum p^2 of each row's distribution (0 for an all-zero row)."""
    totals = weights.sum(axis=-1, keepdims=True)
    p = shares(weights, "zero")
    return np.where(totals[..., 0] > 0, 1.0 - np.sum(p * p, axis=-1), 0.0)


def impurity(weights: np.ndarray, criterion: str = "entropy") -> np.ndarray:
    """Impurity of each row by criterion ("entropy" in nats, or "gini"); negative weights count as 0 and an
    all-zero row is 0."""
    weights = np.clip(weights, 0.0, None)
    if criterion == "gini":
        return gini(weights)
    if criterion == "entropy":
        return entropy(weights)
    raise ValueError(f"criterion must be 'entropy' or 'gini', got {criterion!r}")
