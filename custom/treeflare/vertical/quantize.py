"""Binning (each party bins its own columns) and fixed-point quantisation (active party)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def fit_edges(col: np.ndarray, max_bins: int) -> np.ndarray:
    """Cut points e_0 < ... < e_{k-1} (k <= max_bins - 1); bin(x) = #{e < x}; x <= e_b goes left.

    Missing values (NaN) fall in the last bin (they go right at every split).
    """
    if max_bins < 2:
        raise ValueError("bins must be >= 2")
    x = np.asarray(col, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.zeros(0, dtype=np.float64)
    u = np.unique(x)
    if u.size <= max_bins:
        edges = u[:-1]
    else:
        qs = np.linspace(0.0, 1.0, max_bins + 1)[1:-1]
        edges = np.unique(np.quantile(x, qs, method="lower"))
        edges = edges[edges < u[-1]]
    return edges.astype(np.float64)


def fit_bins(X: np.ndarray, max_bins: int) -> list:
    X = np.asarray(X, dtype=np.float64)
    return [fit_edges(X[:, j], max_bins) for j in range(X.shape[1])]


def apply_bins(X: np.ndarray, edges: list) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    out = np.empty(X.shape, dtype=np.int32)
    for j, e in enumerate(edges):
        col = X[:, j]
        b = np.searchsorted(e, col, side="left")
        b[np.isnan(col)] = len(e)
        out[:, j] = b
    return out


def to_fixed(values: np.ndarray, precision: int) -> list:
    """round(v * 2^p) as Python ints (round half to even; exact: 2^p scaling is exact)."""
    scale = 2.0 ** precision
    out = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        if not math.isfinite(v):
            raise ValueError("non-finite value cannot be quantised")
        x = v * scale
        if not math.isfinite(x):
            raise ValueError(f"value {v:.3g} does not fit in fixed point at {precision} fractional bits "
                             "(scale the target down or lower the precision)")
        out.append(int(round(x)) if precision <= 60 else int(round(Fraction(v) * (1 << precision))))
    return out


def fixed_scalar(x: float, precision: int) -> Fraction:
    """Exact x * 2^p as a Fraction (for lambda and min_child_weight)."""
    return Fraction(x) * (1 << precision)
