"""Global bin edges agreed on sums: each site counts its rows per cell of a public lattice, the server sees only the
sum over the sites and picks each feature's cuts at the pooled quantiles (XGBoost's hist idea, with an exact pooled
count instead of a sketch of each site's quantiles).

The lattice: 0, +-10^(k/256) for magnitudes 1e-4 .. 1e12 (neighbours 0.9% apart), and every half-integer between
-1000 and 1000, so an integer column keeps each of its values in a cell of its own: on integer data (pre-binned, or
small counts and codes) every distinct value is a bin of its own whenever a feature has at most ``max_bin`` of them,
as in XGBoost. What the sketch reveals: per feature, the pooled number of rows in each lattice cell.

A lattice cell holding more rows than a bin should (more than 1/``max_bin`` of a feature's pooled values: a narrow
peak, say 50% of the rows between 0.973 and 0.99) is split once more: the server names those cells, each site counts
its rows in ``REFINE_SPLITS`` equal parts of each (edges every site computes itself), and the cuts are chosen over the
refined cells. What that reveals: the pooled row counts in 64 equal parts of each such cell.

Cuts are lattice (or refined) edges rounded to float32 (XGBoost compares float32 values with float32 split conditions), so a
site's bin of a row is the side of every split the row takes at prediction time.
"""

from __future__ import annotations

import functools

import numpy as np

from ...trees.lattice import log_lattice

PER_DECADE = 256
DECADES = (-4, 12)
HALF_INTEGERS = 1000
F32_MAX = float(np.finfo(np.float32).max)
REFINE_SPLITS = 64


@functools.lru_cache(maxsize=1)
def lattice() -> np.ndarray:
    """The public cell edges, increasing, float32-exact (float64 array); cell i is [edge[i-1], edge[i])."""
    # rounded to float32 (half-integers already are): XGBoost compares float32 values with float32 conditions
    edges = np.unique(log_lattice(PER_DECADE, DECADES, HALF_INTEGERS).astype(np.float32).astype(np.float64))
    edges.setflags(write=False)
    return edges


def n_cells() -> int:
    return len(lattice()) + 1


def cell_of(x) -> np.ndarray:
    """Each value's lattice cell (0 .. n_cells-1), -1 for a missing one (NaN)."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    out = np.searchsorted(lattice(), x, side="right").astype(np.int64)
    out[np.isnan(x)] = -1
    return out


def sketch_counts(X) -> np.ndarray:
    """A site's rows per lattice cell, feature after feature (n_features * n_cells integers)."""
    X = np.asarray(X)
    m = n_cells()
    out = np.zeros(X.shape[1] * m, dtype=np.int64)
    for f in range(X.shape[1]):
        cells = cell_of(X[:, f])
        cells = cells[cells >= 0]
        out[f * m:(f + 1) * m] = np.bincount(cells, minlength=m)
    return out


def _lower_edge(cell: int) -> float:
    edges = lattice()
    return -F32_MAX if cell == 0 else float(edges[cell - 1])


def _upper_edge(cell: int) -> float:
    edges = lattice()
    return F32_MAX if cell >= len(edges) else float(edges[cell])


def sub_edges(cell: int) -> np.ndarray:
    """The inner edges of a refined cell: ``REFINE_SPLITS`` equal parts, float32-exact, strictly inside it."""
    lo, hi = _lower_edge(cell), _upper_edge(cell)
    k = np.arange(1, REFINE_SPLITS)
    e = np.unique((lo + (hi - lo) * k / REFINE_SPLITS).astype(np.float32).astype(np.float64))
    return e[(e > lo) & (e < hi)]


def heavy_cells(counts, n_features: int, max_bin: int) -> list[list[int]]:
    """[feature, cell] of every bounded cell holding more than 1/``max_bin`` of its feature's pooled values (at most
    ``max_bin`` a feature, by construction)."""
    m = n_cells()
    counts = np.asarray(counts, dtype=np.int64).reshape(n_features, m)
    out = []
    for f in range(n_features):
        total = int(counts[f].sum())
        for c in np.flatnonzero(counts[f] * max_bin > total):
            if 0 < c < m - 1:
                out.append([f, int(c)])
    return out


def check_refine(cells, n_features: int, max_bin: int, error) -> list[tuple[int, int]]:
    """A site's check of the cells the server asks it to refine: distinct bounded cells, at most ``max_bin`` a
    feature."""
    m = n_cells()
    if not isinstance(cells, list) or len(cells) > n_features * max_bin:
        raise error("cells", f"expected at most {max_bin} cells a feature")
    out, per = [], {}
    for i, fc in enumerate(cells):
        if not isinstance(fc, list) or len(fc) != 2 or not all(type(v) is int for v in fc):  # noqa: E721
            raise error(f"cells[{i}]", "expected [feature, cell]")
        f, c = fc
        if not (0 <= f < n_features and 0 < c < m - 1):
            raise error(f"cells[{i}]", "not a bounded lattice cell of a feature")
        per[f] = per.get(f, 0) + 1
        if per[f] > max_bin:
            raise error("cells", f"more than {max_bin} cells of feature {f}")
        out.append((f, c))
    if len(set(out)) != len(out):
        raise error("cells", "a cell is named twice")
    return out


def refine_counts(X, cells) -> np.ndarray:
    """A site's rows in each part of each named cell, cell after cell (``REFINE_SPLITS`` integers each; a cell whose
    float32 parts collapse pads with zeros)."""
    X = np.asarray(X, dtype=np.float32)
    out = np.zeros(len(cells) * REFINE_SPLITS, dtype=np.int64)
    by_feature: dict = {}
    for i, (f, c) in enumerate(cells):
        by_feature.setdefault(f, []).append((i, c))
    for f, items in by_feature.items():
        cell = cell_of(X[:, f])
        x = X[:, f].astype(np.float64)
        for i, c in items:
            inside = x[cell == c]
            part = np.searchsorted(sub_edges(c), inside, side="right")
            out[i * REFINE_SPLITS:(i + 1) * REFINE_SPLITS] = np.bincount(part, minlength=REFINE_SPLITS)
    return out


def _units(counts_f, refined: dict):
    """A feature's occupied units in order: (lower edge, upper edge, rows), a refined cell by its parts."""
    units = []
    for c in np.flatnonzero(counts_f > 0):
        c = int(c)
        if c in refined:
            inner = sub_edges(c)
            edges = np.concatenate([[_lower_edge(c)], inner, [_upper_edge(c)]])
            for j, k in enumerate(refined[c][:len(inner) + 1]):
                if k > 0:
                    units.append((float(edges[j]), float(edges[j + 1]), int(k)))
        else:
            units.append((_lower_edge(c), _upper_edge(c), int(counts_f[c])))
    return units


def cuts_from_counts(counts, n_features: int, max_bin: int, refined: dict | None = None) -> list[list[float]]:
    """Each feature's cut values from the pooled counts (lattice cells; ``refined``: {(feature, cell): the pooled
    counts of its parts}): ``[c_0, .., c_m]`` for m bins, bin j holding the values in [c_j, c_{j+1}). At most
    ``max_bin`` bins: one per occupied unit when they are that few, else units merged at the pooled quantiles. A
    feature with no value anywhere gets no bin (``[]``)."""
    m = n_cells()
    counts = np.asarray(counts, dtype=np.int64).reshape(n_features, m)
    refined = refined or {}
    out = []
    for f in range(n_features):
        units = _units(counts[f], {c: v for (g, c), v in refined.items() if g == f})
        if not units:
            out.append([])
            continue
        if len(units) > max_bin:  # bin boundaries where the pooled cumulative count passes k / max_bin
            cum = np.cumsum([u[2] for u in units])
            targets = cum[-1] * np.arange(1, max_bin) / max_bin
            last = np.unique(np.searchsorted(cum, targets, side="left"))
            starts = np.concatenate([[0], last[last < len(units) - 1] + 1])
        else:
            starts = np.arange(len(units))
        out.append([units[0][0]] + [units[int(i)][0] for i in starts[1:]] + [units[-1][1]])
    return out


def check_cuts(cuts, n_features: int, max_bin: int, error, refined=()) -> list[np.ndarray]:
    """A site's check of the server's cuts: per feature increasing lattice edges (or edges of the cells this site
    refined, ``refined``: [(feature, cell)], or +-float32 max at the ends), at most ``max_bin`` bins; returns them as
    float64 arrays."""
    if not isinstance(cuts, list) or len(cuts) != n_features:
        raise error("cuts", f"expected one list per feature ({n_features})")
    edges = lattice()
    allowed_ends = (-F32_MAX, F32_MAX)
    out = []
    for f, c in enumerate(cuts):
        a = np.asarray(c, dtype=np.float64) if isinstance(c, (list, np.ndarray)) else None
        if a is None or a.ndim != 1 or (a.size and a.size < 2) or a.size > max_bin + 1 or \
                not np.all(np.isfinite(a)) or np.any(np.diff(a) <= 0):
            raise error(f"cuts[{f}]", f"expected 2 to {max_bin + 1} increasing values, or none")
        inner = [v for v in a if v not in allowed_ends]
        extra = [sub_edges(c) for g, c in refined if g == f]
        allowed = np.concatenate([edges, *extra]) if extra else edges
        if inner and not np.all(np.isin(inner, allowed)):
            raise error(f"cuts[{f}]", "holds a value that is not a lattice edge")
        out.append(a)
    return out


def bin_matrix(X, cuts: list[np.ndarray]) -> np.ndarray:
    """Each value's bin within its feature (int32), -1 for a missing value. A value outside the cuts (a row the sketch
    did not count, e.g. a validation row) falls in the nearest end bin, as XGBoost's do."""
    X = np.asarray(X, dtype=np.float32)
    out = np.full(X.shape, -1, dtype=np.int32)
    for f, c in enumerate(cuts):
        x = X[:, f].astype(np.float64)
        present = ~np.isnan(x)
        if len(c) == 0:
            continue
        b = np.searchsorted(c[1:-1], x[present], side="right")
        out[present, f] = b
    return out
