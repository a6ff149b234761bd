"""Rebuild one global tree from merged rules, under a leaf and depth budget.

The rules play the part of training samples: rule r weighs w_r (its support) and brings the class
weights w_r p_r. A node holds the rules whose box meets the node's region.

- Numeric split at v (binary, x <= v left): a rule goes left if its interval reaches below v
  (lower < v), right if it reaches above (upper > v), to both sides if it spans v, each side
  then receiving the share of the rule's weight that its estimated cell masses put there (see
  ``_Grower``; the reference sent the full weight to both sides, which double counts). Candidates
  are the rule bounds strictly inside the node's region.
- Categorical split on a feature not yet used on the path: one child per code tested by the
  node's rules; rules that do not test the feature go to every child with a share of their
  weight. A code with no child (and a missing value) stops at the node, which predicts from its
  own distribution.
- Missing values at a numeric split: a NaN follows the side where a larger share of the node's
  rules with a value condition on the feature admit NaN (they come from a local tree's ``missing``
  child, see rules.py); when none of them admits NaN, a NaN stops at the node. Missing-only rules
  spread over the cells like rules without a condition on the feature (no mass is known for NaN).
- Split quality: support-weighted impurity (entropy or Gini) of the children's class weights,
  weighted by the children's total weights. Ties go to the lowest feature, then the lowest value.
- Growth is best-first: the node whose best split reduces weighted impurity the most is split
  first, until ``max_leaves`` leaves, ``max_depth``, or no split reduces impurity. Deterministic.
- Every node's class counts are the support-weighted sum of its rules' distributions; leaves
  predict their argmax. Every input reaches a leaf or stops at an internal node; both predict.

``weighting="uniform"`` weighs every rule 1 (the reference's unweighted mean of distributions
and rule-count weighting); with no budget it grows like the reference builder.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..trees.impurity import impurity
from ..trees.tree import CATEGORICAL, LEAF, NUMERIC, Tree
from .rules import MISSING_ALLOWED, RuleSet

__all__ = ["grow_tree"]

DEFAULT_MAX_NODES = 100_000


class _Grower:
    """Split search over rules that carry a fraction of their weight into each node.

    Numeric feature j: the distinct finite rule bounds g_0 < ... < g_{m-1} cut the line into
    cells 0..m (cell i = (g_{i-1}, g_i]); a rule covers a run of cells. Each cell gets a mass
    estimate (a few EM steps: every rule spreads its weight over its cells in proportion to the
    current estimate), and a rule spanning a split sends each side the share of its weight that
    its cells on that side hold. Categorical feature j: a rule that does not test j spreads its
    weight over the codes in proportion to the weight of the rules that test each code.
    The children's masses thus add up to the parent's: no rule is counted twice.
    """

    def __init__(self, rules: RuleSet, criterion, weighting, min_gain, n_categories, em_steps=3):
        self.lower, self.upper, self.equals = rules.lower, rules.upper, rules.equals
        self.kinds = rules.feature_kinds
        if weighting == "support":
            w = rules.support
        elif weighting == "uniform":
            w = np.ones(rules.n_rules)
        else:
            raise ValueError(f"weighting must be 'support' or 'uniform', got {weighting!r}")
        self.class_weights = w[:, None] * rules.dist
        self.weight, self.missing = w, rules.missing
        self.criterion = criterion
        self.min_gain = min_gain
        R, d = rules.lower.shape
        self.grid, self.first, self.last, self.prefix = {}, {}, {}, {}
        for j, kind in enumerate(self.kinds):
            if kind != "numeric":
                continue
            lo, up = self.lower[:, j], self.upper[:, j]
            grid = np.unique(np.concatenate([lo[np.isfinite(lo)], up[np.isfinite(up)]]))
            if grid.size == 0:
                continue
            m = len(grid)
            first = np.where(np.isfinite(lo), np.searchsorted(grid, lo) + 1, 0)
            last = np.where(np.isfinite(up), np.searchsorted(grid, up), m)
            cells = np.ones(m + 1)
            for _ in range(em_steps):
                prefix = np.concatenate([[0.0], np.cumsum(cells)])
                share = w / (prefix[last + 1] - prefix[first])
                diff = np.bincount(first, weights=share, minlength=m + 2) - \
                    np.bincount(last + 1, weights=share, minlength=m + 2)
                cells = np.cumsum(diff)[: m + 1] * cells
                cells = cells + 1e-9 * max(cells.mean(), 1e-12)  # no cell may weigh 0
            self.grid[j], self.first[j], self.last[j] = grid, first, last
            self.prefix[j] = np.concatenate([[0.0], np.cumsum(cells / cells.sum())])
        self.code_share = {}
        for j, kind in enumerate(self.kinds):
            if kind != "categorical":
                continue
            e = self.equals[:, j]
            tested = e >= 0
            if not tested.any():
                continue
            k = int(e.max()) + 1
            if n_categories is not None and n_categories[j] is not None:
                k = max(k, int(n_categories[j]))
            mass = np.bincount(e[tested], weights=w[tested], minlength=k) + 1e-9 * max(w.mean(), 1e-12)
            self.code_share[j] = mass / mass.sum()

    def cell_bounds(self, j, idx, region):
        ra, rb = region[j]
        return np.maximum(self.first[j][idx], ra), np.minimum(self.last[j][idx], rb)

    def candidates(self, idx, frac, region, used):
        """Useful splits of a node, best first: (gain, feature, kind, point)."""
        cw = self.class_weights[idx] * frac[:, None]
        total = cw.sum(axis=0)
        parent = impurity(total, self.criterion)
        W = total.sum()
        out = []
        if parent <= 0 or W <= 0:
            return out, total
        for j, grid in self.grid.items():
            ra, rb = region[j]
            if rb <= ra:
                continue
            a, b = self.cell_bounds(j, idx, region)
            prefix = self.prefix[j]
            dens = cw / (prefix[b + 1] - prefix[a])[:, None]
            n_cells = len(grid) + 2
            cum = np.empty((n_cells, len(total)))
            for c in range(len(total)):
                cum[:, c] = np.bincount(a, weights=dens[:, c], minlength=n_cells) - \
                    np.bincount(b + 1, weights=dens[:, c], minlength=n_cells)
            cell_mass = np.cumsum(cum, axis=0)[ra:rb + 1] * np.diff(prefix)[ra:rb + 1, None]
            left = np.cumsum(cell_mass, axis=0)[:-1]          # split after cell k, k = ra..rb-1
            right = np.clip(total - left, 0.0, None)
            wl, wr = left.sum(axis=1), right.sum(axis=1)
            valid = (wl > 1e-9 * W) & (wr > 1e-9 * W)
            if not valid.any():
                continue
            score = (wl * impurity(left, self.criterion) + wr * impurity(right, self.criterion)) / (wl + wr)
            score = np.where(valid, score, np.inf)
            k = int(np.argmin(score))
            gain = parent - score[k]
            if gain > self.min_gain:
                out.append((float(gain), j, NUMERIC, int(ra + k)))
        for j, share in self.code_share.items():
            if used[j]:
                continue
            e = self.equals[idx, j]
            tested = e >= 0
            values = np.unique(e[tested])
            if len(values) < 2:
                continue
            spread = cw[~tested].sum(axis=0)
            mass = np.zeros((len(values), len(total)))
            np.add.at(mass, np.searchsorted(values, e[tested]), cw[tested])
            mass += share[values][:, None] * spread
            rest = spread * (1.0 - share[values].sum())      # unseen codes: stay at the node
            groups = np.vstack([mass, rest])
            wg = groups.sum(axis=1)
            score = float(np.sum(wg * impurity(groups, self.criterion)) / wg.sum())
            gain = parent - score
            if gain > self.min_gain:
                out.append((float(gain), j, CATEGORICAL, values))
        # best gain first; ties: lowest feature
        out.sort(key=lambda c: (-round(c[0], 12), c[1]))
        return out, total

    def _left_share(self, j, cell, idx, region):
        a, b = self.cell_bounds(j, idx, region)
        prefix = self.prefix[j]
        left_share = np.clip((prefix[np.minimum(b, cell) + 1] - prefix[a]) / (prefix[b + 1] - prefix[a]), 0, 1)
        return np.where(a <= cell, left_share, 0.0)

    def missing_side(self, j, cell, idx, frac, region) -> int:
        """Child a NaN in j follows after a split after ``cell`` (see module docstring): 0, 1 or -1 (stop)."""
        tested = np.isfinite(self.lower[idx, j]) | np.isfinite(self.upper[idx, j])
        admits = tested & (self.missing[idx, j] == MISSING_ALLOWED)
        if not admits.any():
            return -1
        left = self._left_share(j, cell, idx, region) * frac * self.weight[idx]
        right = (1.0 - self._left_share(j, cell, idx, region)) * frac * self.weight[idx]
        share = [float(side[admits].sum()) / max(float(side[tested].sum()), 1e-300) for side in (left, right)]
        return 0 if share[0] >= share[1] else 1

    def split_numeric(self, j, cell, idx, frac, region):
        """Children (idx, frac, region) of a split after ``cell``; returns the threshold too."""
        left_share = self._left_share(j, cell, idx, region)
        out = []
        for share, bounds in ((left_share, (region[j][0], cell)), (1.0 - left_share, (cell + 1, region[j][1]))):
            keep = share > 1e-12
            child_region = dict(region)
            child_region[j] = bounds
            out.append((idx[keep], frac[keep] * share[keep], child_region))
        return out, float(self.grid[j][cell])

    def split_categorical(self, j, values, idx, frac):
        e = self.equals[idx, j]
        share = self.code_share[j]
        out = []
        for v in values:
            part = np.where(e == v, 1.0, np.where(e < 0, share[v], 0.0))
            keep = part > 0
            out.append((idx[keep], frac[keep] * part[keep]))
        return out


def grow_tree(rules: RuleSet, *, n_categories=None, max_leaves=None, max_depth=None,
              criterion="entropy", weighting="support", min_gain=1e-9,
              max_nodes=DEFAULT_MAX_NODES) -> tuple[Tree, dict]:
    """Grow a tree from ``rules``; returns the tree and ``{"truncated": bool}``.

    ``max_leaves``/``max_depth`` None mean unlimited; ``max_nodes`` is a safety cap only.
    """
    if rules.n_rules == 0:
        raise ValueError("cannot build a tree from an empty rule set")
    if max_leaves is not None and max_leaves < 1:
        raise ValueError("max_leaves must be >= 1")
    max_leaves = np.inf if max_leaves is None else max_leaves
    max_depth = np.inf if max_depth is None else max_depth
    grower = _Grower(rules, criterion, weighting, min_gain, n_categories)
    d = rules.n_features

    kind, feature, points, children, counts, missing = [], [], [], [], [], []
    state = []  # per node: (idx, frac, region, used, depth, candidates)
    heap: list = []

    def add_node(idx, frac, region, used, depth):
        if depth < max_depth and len(idx):
            cands, total = grower.candidates(idx, frac, region, used)
        else:
            cands, total = [], (grower.class_weights[idx] * frac[:, None]).sum(axis=0)
        kind.append(LEAF), feature.append(-1), points.append(None), children.append(None)
        counts.append(total), missing.append(-1)
        state.append((idx, frac, region, used, depth, cands))
        node = len(kind) - 1
        if cands:
            heapq.heappush(heap, (-float(total.sum()) * cands[0][0], node))
        return node

    root_region = {j: (0, len(g)) for j, g in grower.grid.items()}
    add_node(np.arange(rules.n_rules), np.ones(rules.n_rules), root_region, np.zeros(d, dtype=bool), 0)
    n_leaves, truncated = 1, False
    while heap:
        _, node = heapq.heappop(heap)
        idx, frac, region, used, depth, cands = state[node]
        room = max_leaves - n_leaves
        fitting = [c for c in cands if (2 if c[2] == NUMERIC else len(c[3])) - 1 <= room]
        if not fitting:
            continue
        _, j, split_kind, point = fitting[0]
        if len(kind) + (2 if split_kind == NUMERIC else len(point)) > max_nodes:
            truncated = True
            break
        child_ids = []
        if split_kind == NUMERIC:
            parts, threshold = grower.split_numeric(j, point, idx, frac, region)
            missing[node] = grower.missing_side(j, point, idx, frac, region)
            for child_idx, child_frac, child_region in parts:
                child_ids.append(add_node(child_idx, child_frac, child_region, used, depth + 1))
            points[node] = np.array([threshold])
        else:
            child_used = used.copy()
            child_used[j] = True
            for child_idx, child_frac in grower.split_categorical(j, point, idx, frac):
                child_ids.append(add_node(child_idx, child_frac, region, child_used, depth + 1))
            points[node] = np.asarray(point, dtype=np.float64)
        kind[node], feature[node], children[node] = split_kind, j, np.asarray(child_ids)
        n_leaves += len(child_ids) - 1
        state[node] = None  # expanded: its rules are no longer needed

    tree = Tree(rules.feature_kinds, rules.n_classes, kind, feature, points, children,
                np.asarray(counts, dtype=np.float64).reshape(-1, rules.n_classes), n_categories, missing=missing)
    return tree, {"truncated": truncated}
