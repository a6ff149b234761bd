"""Binning: the vectorised bin_matrix gives exactly the edges and codes of the per-column reference (the code
it replaced, kept here verbatim), on data with NaN, +-inf, ties, constant columns, few distinct values, rare
values and extreme outliers; codes are uint8 up to 256 bins."""
from __future__ import annotations

import numpy as np
import pytest

from treeflare.vertical import quantize
from treeflare.vertical.quantize import apply_bins, bin_matrix, code_dtype, fit_bins, fit_edges


# ------------------------------------------------------------------ the reference (the code before bin_matrix)
def ref_fit_edges(col, max_bins):
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


def ref_apply(X, edges):
    out = np.empty(X.shape, dtype=np.int32)
    for j, e in enumerate(edges):
        col = X[:, j]
        b = np.searchsorted(e, col, side="left")
        b[np.isnan(col)] = len(e)
        out[:, j] = b
    return out


def honest_matrix(n, seed):
    """Columns of the kinds real data has (one kind per column, some twice)."""
    rng = np.random.default_rng(seed)
    cols = [
        rng.normal(size=n),                                              # continuous
        np.where(rng.random(n) < 0.1, np.nan, rng.normal(size=n)),      # 10 % missing
        np.round(rng.normal(size=n), 1),                                  # many ties
        np.full(n, 3.5),                                                  # constant
        rng.integers(0, 3, size=n).astype(float),                        # few distinct values
        (rng.random(n) < 0.003).astype(float),                           # rare ones
        rng.lognormal(0, 2, size=n),                                      # heavy right tail
        np.where(rng.random(n) < 0.01, 1e300, rng.normal(size=n)),       # extreme outliers
        np.where(rng.random(n) < 0.01, -1e300, rng.exponential(size=n)),
        np.where(rng.random(n) < 0.02, np.inf, rng.normal(size=n)),      # +inf
        np.where(rng.random(n) < 0.02, -np.inf, rng.normal(size=n)),     # -inf
        np.full(n, np.nan),                                               # all missing
        np.where(rng.random(n) < 0.5, np.nan, 7.0),                      # one value and missing
        rng.normal(size=n) * 1e-300,                                      # subnormal-ish range
        rng.integers(0, 60, size=n).astype(float),                       # just above 32 distinct values
        np.concatenate([np.zeros(n // 2), rng.normal(size=n - n // 2)]),  # a big atom at 0
        rng.uniform(-1e307, 1e307, size=n),                               # span overflows float64
        -np.abs(rng.normal(size=n)),
    ]
    return np.column_stack(cols)


@pytest.mark.parametrize("n,bins,seed", [(1, 32, 0), (7, 4, 1), (500, 2, 2), (3000, 32, 3), (20_000, 32, 4),
                                         (20_000, 255, 5), (6000, 256, 6), (6000, 300, 7), (40_000, 16, 8)])
def test_bin_matrix_same_as_reference(n, bins, seed, monkeypatch):
    X = honest_matrix(n, seed)
    if seed % 2:
        monkeypatch.setattr(quantize, "_CHUNK_VALUES", 3 * n)      # columns three at a time
    edges, codes = bin_matrix(X, bins)
    ref_edges = [ref_fit_edges(X[:, j], bins) for j in range(X.shape[1])]
    assert len(edges) == len(ref_edges)
    for j, (e, r) in enumerate(zip(edges, ref_edges)):
        assert e.dtype == np.float64 and np.array_equal(e, r), f"column {j}"
    assert np.array_equal(codes, ref_apply(X, ref_edges))
    assert codes.dtype == (np.uint8 if bins <= 256 else np.uint16)
    # the one-step functions agree with it
    assert all(np.array_equal(a, b) for a, b in zip(fit_bins(X, bins), edges))
    assert np.array_equal(apply_bins(X, edges), codes) and apply_bins(X, edges).dtype == codes.dtype
    for j in range(X.shape[1]):
        assert np.array_equal(fit_edges(X[:, j], bins), ref_edges[j])


def test_fast_path_is_taken_and_exact(monkeypatch):
    """Large continuous columns go through the bucket path (no column sorted whole), and stay exact, also with
    ties at the cut points and a slice of a wider matrix."""
    sorted_whole = []
    real = quantize._edges_of_sorted
    monkeypatch.setattr(quantize, "_edges_of_sorted", lambda s, qs, mb: sorted_whole.append(s.size) or real(s, qs, mb))
    rng = np.random.default_rng(11)
    n = 60_000
    X = np.column_stack([rng.normal(size=n), np.round(rng.normal(size=n) * 50), rng.exponential(size=n),
                         rng.standard_t(3, size=n)])
    X[rng.random(X.shape) < 0.05] = np.nan
    wide = np.hstack([X, X])[:, 2:6]
    for M in (X, wide):
        edges, codes = bin_matrix(M, 32)
        ref_edges = [ref_fit_edges(M[:, j], 32) for j in range(M.shape[1])]
        assert all(np.array_equal(a, b) for a, b in zip(edges, ref_edges))
        assert np.array_equal(codes, ref_apply(M, ref_edges))
        assert all(len(e) == 31 for e in edges)
    assert sorted_whole == []


def test_code_dtype_and_errors():
    assert code_dtype(256) == np.uint8 and code_dtype(257) == np.uint16
    with pytest.raises(ValueError, match="bins"):
        bin_matrix(np.zeros((3, 2)), 1)
    with pytest.raises(ValueError, match="2-D"):
        bin_matrix(np.zeros(3), 8)
    with pytest.raises(ValueError, match="edge lists"):
        apply_bins(np.zeros((3, 2)), [np.zeros(0)])
    e, c = bin_matrix(np.zeros((0, 3)), 8)
    assert c.shape == (0, 3) and all(x.size == 0 for x in e)


def ref_to_fixed(values, precision):
    import math
    from fractions import Fraction
    scale = 2.0 ** precision
    out = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        if not math.isfinite(v):
            raise ValueError("non-finite value cannot be quantised")
        x = v * scale
        if not math.isfinite(x):
            raise ValueError("does not fit")
        out.append(int(round(x)) if precision <= 60 else int(round(Fraction(v) * (1 << precision))))
    return out


@pytest.mark.parametrize("precision", [8, 32, 53, 60])
def test_to_fixed_same_as_reference(precision):
    """Vectorised fixed point: the same Python ints as round(v * 2^p), halves to even, huge values included."""
    from treeflare.vertical.quantize import to_fixed
    rng = np.random.default_rng(precision)
    v = np.concatenate([rng.normal(size=500), rng.normal(size=50) * 1e12, [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, -0.0],
                        [2.0 ** -precision * k / 2 for k in range(-7, 8)], [1e300 / 2.0 ** precision]])
    got = to_fixed(v, precision)
    assert got == ref_to_fixed(v, precision) and all(type(x) is int for x in got)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="non-finite"):
            to_fixed(np.array([1.0, bad]), precision)
    with pytest.raises(ValueError, match="does not fit"):
        to_fixed(np.array([1e308]), precision)
