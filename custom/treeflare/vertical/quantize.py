"""Binning (each party bins its own columns) and fixed-point quantisation (active party)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np


def code_dtype(n_bins: int):
    """The narrowest unsigned dtype for bin codes 0 .. n_bins - 1 (uint8 up to 256 bins, else uint16)."""
    return np.uint8 if n_bins <= 256 else np.uint16


def _check_bins(max_bins: int) -> None:
    if max_bins < 2:
        raise ValueError("bins must be >= 2")


def _edges_of_sorted(s: np.ndarray, qs: np.ndarray, max_bins: int) -> np.ndarray:
    """Edges of one column from its values sorted ascending (NaN last, as np.sort leaves them): the same cut
    points as ``np.quantile(finite, qs, method="lower")`` (index floor((k - 1) q) of the sorted finite values),
    or every distinct finite value but the largest when there are at most ``max_bins``."""
    a = int(np.searchsorted(s, -np.inf, side="right"))
    b = int(np.searchsorted(s, np.inf, side="left"))
    x = s[a:b]                                   # the finite values, sorted
    if x.size == 0:
        return np.zeros(0, dtype=np.float64)
    first = np.empty(x.size, dtype=bool)         # first of each run of equal values (what np.unique keeps)
    first[0] = True
    np.not_equal(x[1:], x[:-1], out=first[1:])
    n_distinct = int(np.count_nonzero(first))
    if n_distinct <= max_bins:
        return x[first][:-1].astype(np.float64)
    idx = np.floor((x.size - 1) * qs).astype(np.intp)
    edges = np.unique(x[idx])
    return edges[edges < x[-1]].astype(np.float64)


def fit_edges(col: np.ndarray, max_bins: int) -> np.ndarray:
    """Cut points e_0 < ... < e_{k-1} (k <= max_bins - 1); bin(x) = #{e < x}; x <= e_b goes left.

    Missing values (NaN) and +inf fall in the last bin (they go right at every split), -inf in the first.
    """
    _check_bins(max_bins)
    qs = np.linspace(0.0, 1.0, max_bins + 1)[1:-1]
    return _edges_of_sorted(np.sort(np.asarray(col, dtype=np.float64)), qs, max_bins)


# values per row block of a pass over the matrix: a block's temporaries stay in the CPU cache
_BLOCK_VALUES = 1 << 16
# monotone buckets per column for the exact order statistics (see bin_matrix); fits the uint16 store
_MAX_BUCKETS = 1 << 14
_CHUNK_VALUES = 1 << 24


def apply_bins(X: np.ndarray, edges: list) -> np.ndarray:
    """Bin codes ``#{e < x}`` of every column (NaN and +inf in the last bin), uint8 up to 256 bins."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(edges):
        raise ValueError(f"{len(edges)} bin edge lists for a matrix of shape {X.shape}")
    out = np.empty(X.shape, dtype=code_dtype(max([len(e) + 1 for e in edges], default=1)))
    for j, e in enumerate(edges):
        col = X[:, j]
        b = np.searchsorted(e, col, side="left")
        b[np.isnan(col)] = len(e)
        out[:, j] = b
    return out


def fit_bins(X: np.ndarray, max_bins: int) -> list:
    """Edges of every column (those of :func:`fit_edges`)."""
    return bin_matrix(X, max_bins)[0]


def bin_matrix(X: np.ndarray, max_bins: int) -> tuple:
    """(edges of every column, codes): exactly :func:`fit_edges` and :func:`apply_bins`, in a few vectorised
    passes over row blocks (``X`` is never copied whole; codes are uint8 up to 256 bins).

    Why it is exact: each finite value gets a bucket ``floor(x * s - lo * s)`` (s ~ B / span; clipped), a
    non-decreasing function of x (IEEE multiplication by a positive constant and subtraction are monotone), so
    the k-th smallest value lies in the bucket where the bucket counts' cumulative sum passes k, and its rank
    there is known.  Only the values in the (at most ``max_bins - 1``) buckets holding a wanted rank are sorted;
    a value in any other bucket has the code of its bucket (every edge in a lower bucket is smaller, every one
    in a higher bucket larger).  Columns where that would not save work (few distinct values, or the wanted
    buckets holding many of the rows, e.g. extreme outliers) take the per-column sort of :func:`fit_edges`.
    Columns go by chunks (a bucket store of at most ``_CHUNK_VALUES`` values, 2 bytes each)."""
    _check_bins(max_bins)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError("a feature matrix must be 2-D")
    n, m = X.shape
    codes = np.empty((n, m), dtype=code_dtype(max_bins))
    edges: list = []
    step = max(1, _CHUNK_VALUES // max(1, n))     # columns at a time: bounds the 2-byte bucket store
    for j0 in range(0, m, step):
        e, codes[:, j0:j0 + step] = _bin_columns(X[:, j0:j0 + step], max_bins)
        edges += e
    return edges, codes


def _bin_columns(X: np.ndarray, max_bins: int) -> tuple:
    """:func:`bin_matrix` of one chunk of columns."""
    n, m = X.shape
    # buckets per column: about 16 rows each (so the wanted buckets hold few rows), at most 2^14
    B = int(min(_MAX_BUCKETS, max(256, 1 << int(max(1, n // 16) - 1).bit_length())))
    qs = np.linspace(0.0, 1.0, max_bins + 1)[1:-1]
    rb = max(1, _BLOCK_VALUES // max(1, m))
    blocks = [(r, min(n, r + rb)) for r in range(0, n, rb)]
    # pass 1: range (NaN ignored) and NaN count per column; a column with +-inf takes the per-column path
    lo, hi = np.full(m, np.nan), np.full(m, np.nan)
    n_nan = np.zeros(m, dtype=np.int64)
    for a, b in blocks:
        Xb = X[a:b]
        lo = np.fmin(lo, np.fmin.reduce(Xb, axis=0))
        hi = np.fmax(hi, np.fmax.reduce(Xb, axis=0))
        n_nan += np.count_nonzero(np.isnan(Xb), axis=0)
    n_fin = n - n_nan
    with np.errstate(all="ignore"):
        scale = B / (hi * 0.5 - lo * 0.5) * 0.5
        shift = lo * scale
        fast = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(scale) & (scale > 0) & np.isfinite(hi * scale) \
            & np.isfinite(shift)
    shift = np.where(fast, shift, 0.0)
    scale = np.where(fast, scale, 0.0)
    dump = m * B
    col_off = np.arange(m, dtype=np.intp) * B

    def buckets(Xb):
        """The bucket of every value (NaN and columns not ``fast``: bucket 0).  x * scale - shift is finite on
        [lo, hi] (checked above), so it is non-decreasing there."""
        with np.errstate(invalid="ignore"):       # +-inf * 0 in a column that is not fast
            t = Xb * scale
        t -= shift
        np.fmax(t, 0.0, out=t)                     # NaN -> 0 (fmax ignores NaN)
        np.minimum(t, B - 1, out=t)
        return t.astype(np.intp)

    def keys(a, b):
        """column * B + bucket of rows [a, b), from the store."""
        k = bucket_of[a:b].astype(np.intp)
        k += col_off
        return k

    # pass 2: buckets (kept: 2 bytes a value while binning) and their counts
    bucket_of = np.empty((n, m), dtype=np.uint16)
    counts = np.zeros(dump, dtype=np.int64)
    big = max(1, (1 << 21) // max(1, m))         # rows per bincount call: its minlength buffer is m * B long
    for a in range(0, n, big):
        k = buckets(X[a:a + big])
        bucket_of[a:a + big] = k
        k += col_off
        counts += np.bincount(k.ravel(), minlength=dump)
    counts = counts.reshape(m, B)
    counts[:, 0] -= n_nan                          # NaN were counted in bucket 0
    wanted = np.zeros(dump + 1, dtype=bool)
    plan = {}                                      # column -> (target buckets, their rank offsets)
    for j in np.flatnonzero(fast).tolist():
        cnt = counts[j]
        if np.count_nonzero(cnt) <= max_bins:      # possibly few distinct values: the exact per-column path
            continue
        k = int(n_fin[j])
        idx = np.floor((k - 1) * qs).astype(np.intp)
        cum = np.cumsum(cnt)
        tb = np.searchsorted(cum, idx, side="right")
        targets = np.unique(tb)
        size = int(cnt[targets].sum())
        if size > max(4096, k // 2):             # sorting most of the column: the per-column path is as cheap
            continue
        before = np.concatenate(([0], np.cumsum(cnt[targets])[:-1]))     # selected values below each target
        pos = before[np.searchsorted(targets, tb)] + (idx - (cum[tb] - cnt[tb]))
        plan[j] = (targets, pos)
        wanted[j * B + targets] = True
    # pass 3: the values in the wanted buckets
    sel_rows, sel_cols, sel_vals = [], [], []
    if plan:
        for a, b in blocks:
            Xb = X[a:b]
            f = np.flatnonzero(wanted[keys(a, b)])
            r, c = np.divmod(f, m)
            v = Xb[r, c]
            ok = ~np.isnan(v)
            sel_rows.append(r[ok] + a)
            sel_cols.append(c[ok])
            sel_vals.append(v[ok])
    rows = np.concatenate(sel_rows) if sel_rows else np.zeros(0, np.intp)
    cols = np.concatenate(sel_cols) if sel_cols else np.zeros(0, np.intp)
    vals = np.concatenate(sel_vals) if sel_vals else np.zeros(0)
    order = np.argsort(cols.astype(np.int32), kind="stable")     # by column (radix sort), rows in order
    rows, cols, vals = rows[order], cols[order], vals[order]
    starts = np.searchsorted(cols, np.arange(m + 1))
    edges: list = [None] * m
    code_of_bucket = np.zeros(dump, dtype=np.int64)
    for j in range(m):
        if j in plan:
            targets, pos = plan[j]
            sv = np.sort(vals[starts[j]:starts[j + 1]])
            e = np.unique(sv[pos])
            e = e[e < hi[j]].astype(np.float64)
            # the edges' own buckets, by the same float operations as buckets()
            eb = np.clip(e * scale[j] - shift[j], 0, B - 1).astype(np.int64)
            code_of_bucket[j * B:(j + 1) * B] = np.searchsorted(eb, np.arange(B), side="left")
            edges[j] = e
        else:
            x = np.sort(X[:, j])
            edges[j] = _edges_of_sorted(x, qs, max_bins)
    n_edges = np.array([len(e) for e in edges], dtype=np.int64)
    codes = np.empty((n, m), dtype=code_dtype(max_bins))
    # pass 4: codes from the buckets (fast columns), then the exact ones
    code_of_bucket = code_of_bucket.astype(codes.dtype)
    for a, b in blocks:
        Xb = X[a:b]
        c = code_of_bucket[keys(a, b)]
        np.copyto(c, n_edges.astype(codes.dtype), where=np.isnan(Xb))     # NaN in the last bin
        codes[a:b] = c
    del bucket_of
    for j in range(m):
        if j in plan:
            s_, e_ = starts[j], starts[j + 1]
            codes[rows[s_:e_], j] = np.searchsorted(edges[j], vals[s_:e_], side="left")
        else:
            col = X[:, j]
            c = np.searchsorted(edges[j], col, side="left")
            c[np.isnan(col)] = len(edges[j])
            codes[:, j] = c
    return edges, codes


def to_fixed(values: np.ndarray, precision: int) -> list:
    """round(v * 2^p) as Python ints (round half to even; exact: 2^p scaling is exact)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(v)):
        raise ValueError("non-finite value cannot be quantised")
    if precision > 60:
        return [int(round(Fraction(t) * (1 << precision))) for t in v.tolist()]
    with np.errstate(over="ignore"):          # reported just below
        x = v * (2.0 ** precision)
    bad = ~np.isfinite(x)
    if bad.any():
        raise ValueError(f"value {v[np.argmax(bad)]:.3g} does not fit in fixed point at {precision} fractional bits "
                         "(scale the target down or lower the precision)")
    if x.size and float(np.max(np.abs(x))) < 2.0 ** 62:
        return np.rint(x).astype(np.int64).tolist()     # rint rounds half to even, as round() does
    return [int(round(t)) for t in x.tolist()]


def fixed_scalar(x: float, precision: int) -> Fraction:
    """Exact x * 2^p as a Fraction (for lambda and min_child_weight)."""
    return Fraction(x) * (1 << precision)
