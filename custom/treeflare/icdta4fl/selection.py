"""Peer-score filter: which local trees enter the aggregation.

Every site scores every tree (its own included) on its local test set. The server averages each
tree's scores over the sites (unweighted; NaN = a site that did not report, ignored), derives one
threshold per metric with a statistic over the trees, and keeps the trees reaching both
thresholds (>=). If none pass, both thresholds are multiplied by 0.989 once; if still none pass, the
single best tree is kept (highest mean accuracy, then mean macro-F1, then lowest tie key). The
selection is never empty.

Ties. With the percentile (or quantile) statistic at q, the filter means to keep the best
ceil(n (1 - q/100)) trees; trees tied at the threshold used to all pass (adult, 10 IID sites, seed 0:
6 tied trees of 10 kept at q = 75, and a global tree below the mean local tree). Now at most that many
are kept: the passing trees ranked by mean accuracy, then mean macro-F1, then their tie key, which the
server sets to a digest of each tree's content (so the choice does not depend on site names or order;
without keys, the lower index). Without ties nothing changes. The mean and median statistics, and the
relaxed thresholds, keep ties.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = ["select_trees", "threshold", "STATISTICS", "RELAX_FACTOR"]

STATISTICS = ("percentile", "quantile", "mean", "median")
RELAX_FACTOR = 0.989


def threshold(values: np.ndarray, statistic: str = "percentile", q: float = 75.0) -> float:
    if statistic == "percentile":
        return float(np.percentile(values, q))
    if statistic == "quantile":  # q given in [0, 1]
        return float(np.quantile(values, q))
    if statistic == "mean":
        return float(np.mean(values))
    if statistic == "median":
        return float(np.median(values))
    raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")


def select_trees(accuracy, macro_f1, *, statistic="percentile", q=75.0, tie_keys=None) -> tuple[list[int], dict]:
    """Select trees from score matrices of shape (n_sites, n_trees).

    Returns the selected tree indices (ascending) and a report dict with the per-tree means,
    the thresholds used and how the selection was reached (``"thresholds"``, ``"relaxed"`` or
    ``"best_tree"``).
    """
    acc = np.atleast_2d(np.asarray(accuracy, dtype=np.float64))
    f1 = np.atleast_2d(np.asarray(macro_f1, dtype=np.float64))
    if acc.shape != f1.shape or acc.shape[1] == 0:
        raise ValueError(f"score matrices must share a shape (n_sites, n_trees>0); got {acc.shape}, {f1.shape}")
    with warnings.catch_warnings():  # all-NaN columns are handled below
        warnings.simplefilter("ignore", RuntimeWarning)
        mean_acc = np.nanmean(acc, axis=0)
        mean_f1 = np.nanmean(f1, axis=0)
    # a tree nobody could score ranks last
    mean_acc = np.where(np.isnan(mean_acc), -np.inf, mean_acc)
    mean_f1 = np.where(np.isnan(mean_f1), -np.inf, mean_f1)
    finite = np.isfinite(mean_acc) & np.isfinite(mean_f1)
    if finite.any():
        thr_acc = threshold(mean_acc[finite], statistic, q)
        thr_f1 = threshold(mean_f1[finite], statistic, q)
    else:
        thr_acc = thr_f1 = np.inf
    how = "thresholds"
    keep = (mean_acc >= thr_acc) & (mean_f1 >= thr_f1)
    if not keep.any():
        thr_acc, thr_f1 = thr_acc * RELAX_FACTOR, thr_f1 * RELAX_FACTOR
        keep = (mean_acc >= thr_acc) & (mean_f1 >= thr_f1)
        how = "relaxed"
    n = len(mean_acc)
    # rank: best first by mean accuracy, mean macro-F1, then the tie key (ascending)
    keys = list(range(n)) if tie_keys is None else list(tie_keys)
    if len(keys) != n:
        raise ValueError(f"{len(keys)} tie keys for {n} trees")
    key_rank = np.empty(n, dtype=np.int64)
    key_rank[sorted(range(n), key=lambda i: (keys[i], i))] = np.arange(n)
    order = np.lexsort((key_rank, -np.round(mean_f1, 12), -np.round(mean_acc, 12)))
    if not keep.any():
        keep = np.zeros(n, dtype=bool)
        keep[order[0]] = True
        how = "best_tree"
    elif statistic in ("percentile", "quantile") and how == "thresholds":
        share = (100.0 - q) / 100.0 if statistic == "percentile" else 1.0 - q
        limit = max(1, math.ceil(round(n * share, 9)))
        if keep.sum() > limit:
            ranked = [i for i in order if keep[i]]
            keep = np.zeros(n, dtype=bool)
            keep[ranked[:limit]] = True
            how += f" (ties broken: {limit} of {len(ranked)} kept)"
    selected = [int(i) for i in np.flatnonzero(keep)]
    report = {
        "statistic": statistic,
        "q": float(q) if statistic in ("percentile", "quantile") else None,
        "accuracy": _json_number(thr_acc),
        "macro_f1": _json_number(thr_f1),
        "how": how,
        "mean_accuracy": [_json_number(v) for v in mean_acc],
        "mean_macro_f1": [_json_number(v) for v in mean_f1],
    }
    return selected, report


def _json_number(value):
    value = float(value)
    return value if math.isfinite(value) else None
