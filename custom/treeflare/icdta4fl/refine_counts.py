"""What crosses the wire in a refinement round: candidate splits, the plan of a round, a site's counts.

* Candidates reveal nothing new (``candidates_from_trees``): numeric thresholds are those that already appear
  in the local trees every site was sent for peer scoring; ordinal codes and one-hot indicators split between
  the schema's codes; categorical features (ID3) split into the schema's categories.
* A site's reply is one vector of non-negative integer counts (``count_vector``): per split leaf and feature,
  a histogram over the feature's cells (between thresholds, or one per code, plus one for missing values) and
  classes; per count-only leaf (at the depth budget, or beyond the round's size), its class counts. Sums of
  such vectors are the vector of the union of the rows.
* ``add_noise`` adds clipped two-sided geometric noise (discrete Laplace) to a site's counts for
  ``--refine-epsilon``; a row changes one cell per feature in its leaf, so the L1 sensitivity is the number
  of features.

The server's side (growing the tree on the sums) is ``refine.py``.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from ..trees.impurity import impurity
from ..trees.tree import LEAF, NUMERIC, Tree
from ..trees.validate import PayloadError, check_int, check_list, check_number

__all__ = ["SplitCandidates", "candidates_from_trees", "is_code_column", "RefinePlan", "plan_round", "count_vector", "add_noise",
           "noise_bound", "gini", "MAX_THRESHOLDS_PER_FEATURE", "MAX_REFINE_VALUES", "DEFAULT_ROUND_VALUES",
           "MAX_REFINE_ROUNDS"]

MAX_THRESHOLDS_PER_FEATURE = 32
MAX_REFINE_ROUNDS = 10  # per job (--refine-rounds); each round spends the sites' privacy budget again
# values in one site's reply: 1M masked uint64 values are 8 MB
MAX_REFINE_VALUES = 1_000_000
DEFAULT_ROUND_VALUES = 100_000  # what the server asks per round: ~0.8 MB of masked values per site


def gini(mass: np.ndarray) -> np.ndarray:
    return impurity(mass, "gini")


@dataclass(frozen=True)
class SplitCandidates:
    """Per feature of the tree's matrix: sorted numeric thresholds, or the number of category codes.

    ``thresholds[j]`` is an array for numeric features (possibly empty: no candidate), None for categorical
    ones; ``n_codes[j]`` is the code count of categorical features, None for numeric ones. Feature j has
    ``n_cells(j)`` cells: one per interval between thresholds (or per code), and one for missing values.
    """

    thresholds: tuple
    n_codes: tuple

    @property
    def n_features(self) -> int:
        return len(self.thresholds)

    def n_cells(self, j: int) -> int:
        if self.thresholds[j] is not None:
            return len(self.thresholds[j]) + 2
        return int(self.n_codes[j]) + 1

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([self.n_cells(j) for j in range(self.n_features)])]).astype(np.int64)

    def cells(self, X: np.ndarray) -> np.ndarray:
        """(n, d) cell index of each value; the last cell of a feature holds missing (and unknown) values."""
        X = np.asarray(X, dtype=np.float64)
        out = np.empty(X.shape, dtype=np.int64)
        for j in range(self.n_features):
            x, missing = X[:, j], np.isnan(X[:, j])
            if self.thresholds[j] is not None:
                cell = np.searchsorted(self.thresholds[j], x, side="left")  # x <= t_0 -> 0
            else:
                k = int(self.n_codes[j])
                ok = ~missing & (x >= 0) & (x < k) & (x == np.round(x))
                cell = np.where(ok, np.nan_to_num(x, nan=0.0), k).astype(np.int64)
                missing = missing | ~ok
            out[:, j] = np.where(missing, self.n_cells(j) - 1, cell)
        return out

    def to_dict(self) -> dict:
        return {"thresholds": [None if t is None else [float(v) for v in t] for t in self.thresholds],
                "n_codes": [None if k is None else int(k) for k in self.n_codes]}

    @classmethod
    def from_dict(cls, payload, *, feature_kinds, max_thresholds: int = MAX_THRESHOLDS_PER_FEATURE
                  ) -> "SplitCandidates":
        if not isinstance(payload, dict):
            raise PayloadError("candidates", f"expected a dict, got {type(payload).__name__}")
        d = len(feature_kinds)
        thr = check_list(payload.get("thresholds"), "candidates.thresholds", length=d)
        codes = check_list(payload.get("n_codes"), "candidates.n_codes", length=d)
        out_t, out_k = [], []
        for j, kind in enumerate(feature_kinds):
            if kind == "categorical":
                if thr[j] is not None:
                    raise PayloadError(f"candidates.thresholds[{j}]", "thresholds on a categorical feature")
                out_t.append(None)
                out_k.append(check_int(codes[j], f"candidates.n_codes[{j}]", lo=1, hi=10_000))
            else:
                if codes[j] is not None:
                    raise PayloadError(f"candidates.n_codes[{j}]", "codes on a numeric feature")
                values = check_list(thr[j], f"candidates.thresholds[{j}]", max_len=max_thresholds)
                values = np.array([check_number(v, f"candidates.thresholds[{j}][{i}]") for i, v in enumerate(values)])
                if np.any(np.diff(values) <= 0):
                    raise PayloadError(f"candidates.thresholds[{j}]", "must be strictly increasing")
                out_t.append(values)
                out_k.append(None)
        return cls(tuple(out_t), tuple(out_k))


def is_code_column(bound) -> bool:
    """A numeric column whose schema range is a small set of codes (``bound`` (0, K-1) with K <= 64: ordinal codes,
    one-hot 0/1 indicators; ``encoding.threshold_bounds``): split only between adjacent codes."""
    return bound is not None and bound[0] == 0.0 and float(bound[1]).is_integer() and 1 <= bound[1] < 64


def _spread(values: np.ndarray, k: int) -> np.ndarray:
    """At most k of the sorted values, evenly spaced in rank (always the outermost)."""
    if len(values) <= k:
        return values
    return values[np.unique(np.round(np.linspace(0, len(values) - 1, k)).astype(np.int64))]


def candidates_from_trees(trees, *, feature_kinds, n_categories, bounds,
                          max_thresholds=MAX_THRESHOLDS_PER_FEATURE) -> SplitCandidates:
    """Candidate splits that reveal nothing beyond what every site has already seen.

    Numeric features: the thresholds of the local ``trees`` (every site received them all for peer scoring)
    on that feature, at most ``max_thresholds`` of them evenly spaced in rank. Columns whose schema range is
    a small set of codes (``bounds`` (0, K-1) with K <= 64: ordinal codes, one-hot 0/1 indicators) also
    split between every pair of adjacent codes. Categorical features: the schema's ``n_categories``.
    """
    d = len(feature_kinds)
    found = [[] for _ in range(d)]
    for tree in trees:
        for node in np.flatnonzero(tree.kind == NUMERIC):
            found[tree.feature[node]].append(np.asarray(tree.split_points[node], dtype=np.float64))
    thresholds, codes = [], []
    for j, kind in enumerate(feature_kinds):
        if kind == "categorical":
            thresholds.append(None)
            codes.append(int(n_categories[j]))
            continue
        values = np.unique(np.concatenate(found[j])) if found[j] else np.empty(0)
        b = bounds[j] if bounds is not None else None
        if is_code_column(b):
            values = np.arange(int(b[1])) + 0.5  # between adjacent codes: all a threshold can mean here
        thresholds.append(_spread(values[np.isfinite(values)], max_thresholds))
        codes.append(None)
    return SplitCandidates(tuple(thresholds), tuple(codes))


@dataclass(frozen=True)
class RefinePlan:
    """Which leaves send full histograms (``split_leaves``) and which only their class
    counts (``count_leaves``), and where each block sits in the count vector."""

    split_leaves: tuple
    count_leaves: tuple
    n_classes: int
    n_cells: int  # cells per split leaf, summed over features

    @property
    def n_values(self) -> int:
        return (len(self.split_leaves) * self.n_cells + len(self.count_leaves)) * self.n_classes

    def to_dict(self) -> dict:
        return {"split_leaves": [int(v) for v in self.split_leaves],
                "count_leaves": [int(v) for v in self.count_leaves]}

    def unpack(self, summed) -> tuple[np.ndarray, np.ndarray]:
        """A summed count vector as (histograms (split leaves, cells, classes), class counts (count leaves,
        classes)); negative values (from noise) clipped to 0."""
        summed = np.clip(np.asarray(summed, dtype=np.float64), 0.0, None)
        if summed.shape != (self.n_values,):
            raise ValueError(f"expected {self.n_values} summed counts, got {summed.shape}")
        hist_size = len(self.split_leaves) * self.n_cells * self.n_classes
        return (summed[:hist_size].reshape(len(self.split_leaves), self.n_cells, self.n_classes),
                summed[hist_size:].reshape(len(self.count_leaves), self.n_classes))

    @classmethod
    def from_dict(cls, payload, *, tree: Tree, candidates: SplitCandidates) -> "RefinePlan":
        """The plan a server sent, checked against the tree it sent: every leaf exactly once."""
        if not isinstance(payload, dict):
            raise PayloadError("plan", f"expected a dict, got {type(payload).__name__}")
        leaves = set(np.flatnonzero(tree.kind == LEAF).tolist())
        lists = []
        for key in ("split_leaves", "count_leaves"):
            values = check_list(payload.get(key), f"plan.{key}", max_len=tree.n_nodes)
            lists.append(tuple(check_int(v, f"plan.{key}[{i}]", lo=0, hi=tree.n_nodes - 1) for i, v in enumerate(values)))
        if sorted(lists[0] + lists[1]) != sorted(leaves):
            raise PayloadError("plan", "must list every leaf of the tree exactly once")
        plan = cls(lists[0], lists[1], tree.n_classes, int(candidates.offsets[-1]))
        if plan.n_values > MAX_REFINE_VALUES:
            raise PayloadError("plan", f"{plan.n_values} counts exceed the limit of {MAX_REFINE_VALUES}")
        return plan


def plan_round(tree: Tree, candidates: SplitCandidates, max_depth=None,
               max_values: int = DEFAULT_ROUND_VALUES) -> RefinePlan:
    """Which leaves send full histograms this round, and which only their class counts.

    A leaf's histogram serves the leaf itself (if it is above the depth budget) and every ancestor (an
    internal node's histogram is the sum of its leaves'), which the server may cut and re-split. So every
    leaf sends one, as long as a reply stays within ``max_values`` counts (about 0.8 MB of masked
    values); beyond that the leaves with the most estimated impurity (count x Gini of the tree's own
    counts), those above the depth budget first, get histograms and the rest send class counts only.
    """
    depth = tree.node_depths()
    leaves = [int(v) for v in np.flatnonzero(tree.kind == LEAF)]
    limit = np.inf if max_depth is None else max_depth
    cells, C = int(candidates.offsets[-1]), tree.n_classes
    room = (max_values - len(leaves) * C) // max((cells - 1) * C, 1)  # each histogram replaces a count block
    if len(leaves) > room:
        weight = tree.counts[leaves].sum(axis=1) * gini(tree.counts[leaves])
        order = sorted(range(len(leaves)), key=lambda i: (depth[leaves[i]] >= limit, -round(float(weight[i]), 9),
                                                          leaves[i]))
        chosen = set(leaves[i] for i in order[:max(room, 0)])
    else:
        chosen = set(leaves)
    return RefinePlan(tuple(v for v in leaves if v in chosen), tuple(v for v in leaves if v not in chosen), C, cells)


def count_vector(tree: Tree, candidates: SplitCandidates, plan: RefinePlan, X, y) -> np.ndarray:
    """A site's counts for one round (int64, length ``plan.n_values``): what it encrypts and sends.

    A row follows the tree as prediction does (a NaN takes a node's ``missing`` child); rows that stop at an
    internal node (a NaN where the node has no ``missing`` child, as ID3's, or an unseen category) count nowhere.
    Within a leaf's histogram a NaN falls in its feature's last cell, which the split search sends to one side.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    C, cells_per_leaf = plan.n_classes, plan.n_cells
    node = tree.apply(X)
    split_pos = np.full(tree.n_nodes, -1, dtype=np.int64)
    split_pos[list(plan.split_leaves)] = np.arange(len(plan.split_leaves))
    count_pos = np.full(tree.n_nodes, -1, dtype=np.int64)
    count_pos[list(plan.count_leaves)] = np.arange(len(plan.count_leaves))
    hist_size = len(plan.split_leaves) * cells_per_leaf * C
    out = np.zeros(plan.n_values, dtype=np.int64)
    rows = split_pos[node] >= 0
    if rows.any():
        leaf, cls = split_pos[node[rows]], y[rows]
        cell = candidates.cells(X[rows]) + candidates.offsets[:-1][None, :]
        index = ((leaf[:, None] * cells_per_leaf + cell) * C + cls[:, None]).ravel()
        out[:hist_size] = np.bincount(index, minlength=hist_size)
    rows = count_pos[node] >= 0
    if rows.any():
        index = count_pos[node[rows]] * C + y[rows]
        out[hist_size:] = np.bincount(index, minlength=len(plan.count_leaves) * C)
    return out


# ---------------------------------------------------------------------------------------- noise
def noise_bound(epsilon: float, sensitivity: int, tail: float = 20.0) -> int:
    """Clip of the per-value noise: P(|noise| > bound) is about exp(-tail) (the delta of the guarantee)."""
    return int(math.ceil(tail * sensitivity / epsilon))


def add_noise(counts: np.ndarray, *, epsilon: float, sensitivity: int) -> np.ndarray:
    """counts + two-sided geometric noise of scale sensitivity/epsilon, clipped at ``noise_bound``.

    Discrete Laplace: the difference of two geometric variables with p = 1 - exp(-epsilon/sensitivity) is
    epsilon-differentially private for integer counts with that L1 sensitivity (Ghosh et al. 2009). Drawn
    from the OS's randomness, not a seeded generator.
    """
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
    p = 1.0 - math.exp(-epsilon / sensitivity)
    rng = np.random.default_rng(secrets.randbits(128))
    noise = rng.geometric(p, counts.shape) - rng.geometric(p, counts.shape)
    bound = noise_bound(epsilon, sensitivity)
    return counts + np.clip(noise, -bound, bound)
