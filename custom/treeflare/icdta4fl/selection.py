"""Peer-score filter: which local trees enter the aggregation.

Every site scores every tree (its own included) on its local test set. The server averages each
tree's scores over the sites (unweighted; NaN = a site that did not report, ignored), derives one
threshold per metric with a statistic over the trees, and keeps the trees reaching both
thresholds (>=, ties kept). If none pass, both thresholds are multiplied by 0.989 once; if still
none pass, the single best tree is kept (highest mean accuracy, then mean macro-F1, then lowest
index). The selection is never empty.
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


def select_trees(accuracy, macro_f1, *, statistic="percentile", q=75.0) -> tuple[list[int], dict]:
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
    if not keep.any():
        # lexsort sorts by the last key first; -index makes the lowest index win ties
        order = np.lexsort((-np.arange(len(mean_acc)), mean_f1, mean_acc))
        keep = np.zeros(len(mean_acc), dtype=bool)
        keep[order[-1]] = True
        how = "best_tree"
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
