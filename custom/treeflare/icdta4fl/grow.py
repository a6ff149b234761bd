"""Growth from the root on summed histograms: the global tree a centralized greedy learner would grow, then pruned.

``--refine-from root`` (issue 35). The one-round tree recombines the local trees' rules; a refinement round adds one
level under it. This grows the tree the way a centralized CART grows on the pooled rows, each step a sum over every
site (pairwise-masked, as every refinement round):

1. **The grid round** (``grid_candidates``): every site counts its rows at the root over a public lattice of
   thresholds (``lattice``: 0 and +-10^(k/64), 64 per decade from 1e-3 to 1e9, and every half-integer up to 1000, so
   that counts, ages and hours keep each value in a cell of its own; the same for every job and column),
   one cell per code for code columns. The sum is the pooled histogram of every numeric column by class: the
   server picks the root's split on the full lattice and the growth rounds' thresholds at the pooled quantiles of
   every column (``quantile_candidates``, XGBoost's ``hist`` idea with sums in place of a sketch). Nothing beyond
   the sum over all sites on a grid nobody chose is revealed.
2. **Growth rounds** (``grow_round``): every leaf above the depth budget with rows of more than one class sends its
   histogram on those thresholds; the server splits each by its best Gini split (binary: a threshold, or one code
   against the rest; a categorical column with two codes splits in two), each side with at least
   ``GROW_MIN_CHILD_ROWS`` pooled rows, the best first up to ``max_grown`` leaves; where no leaf can be split, the
   next round is the last.
3. **The last round** is ``refine.refine_tree``: one more level, then the knapsack keeps, within the leaf and depth
   budget, the subtree with the fewest training errors. A same-size best-first CART on those thresholds is one of
   the subtrees it chooses from (best-first order does not change which split a node gets), so on training rows the
   result is at least as good as that CART's whenever the grown tree holds it.

Every tree a site counts on in rounds 2..R is the tree of the round before with some leaves split once as growth
splits them, on the candidates (``extends``), and carries the splits only (``structure_only``): a site checks that
itself, and its leaf count (``max_counted_leaves``).
"""

from __future__ import annotations

import numpy as np

from ..trees.lattice import log_lattice
from ..trees.tree import CATEGORICAL, LEAF, NUMERIC, Tree
from .refine import _categorical_used, _fill_counts, _Nodes, _pseudo_counts, _split_options, _stop_mass, gini
from .refine_counts import RefinePlan, SplitCandidates, is_code_column

__all__ = ["lattice", "is_free_numeric", "grid_candidates", "quantile_candidates", "root_tree", "grow_round",
           "plan_growth", "extends", "LATTICE_PER_DECADE", "DEFAULT_GRID_THRESHOLDS", "MAX_GRID_THRESHOLDS",
           "GROWTH_ROUND_VALUES", "GROWN_LEAVES_FACTOR", "GROW_FROM", "DEFAULT_GROW_FROM", "DEFAULT_ROUNDS",
           "grow_depth", "GROW_MIN_CHILD_ROWS", "MAX_LEAF_BUDGET", "structure_only", "can_grow",
           "max_counted_leaves", "on_lattice", "LATTICE_SIZE"]

# where the refinement grows from: the root, on the sums alone; or the one-round tree (the paper's, then refined)
GROW_FROM = ("root", "one_round")
DEFAULT_GROW_FROM = "root"
# the default rounds of each start: from the root every round adds one level, so the rounds are the depth
DEFAULT_ROUNDS = {"root": 8, "one_round": 1}

LATTICE_PER_DECADE = 64
_DECADES = (-3, 9)  # magnitudes 1e-3 .. 1e9; smaller values share the cells beside 0, larger the outer cells
DEFAULT_GRID_THRESHOLDS = 63  # per numeric column for the growth rounds: 64 cells, as XGBoost's hist at 64 bins
MAX_GRID_THRESHOLDS = 255
# values a site sends per growth round: 400,000 masked uint64 values are 3.2 MB
GROWTH_ROUND_VALUES = 400_000
# the grown tree may hold this many times the leaf budget before the last round prunes it back
GROWN_LEAVES_FACTOR = 4
# a child of a grown split holds at least this many of the pooled training rows: every tree a site counts on, and the
# global tree every site receives, has no leaf describing fewer people (the minimum cell of statistical disclosure
# control); no share of the rows on top (scikit-learn's CART has min_samples_leaf=1: on the front's data, 5 seeds,
# IID and label skew, no adopt check, a 0.2% share stopped adult and default_credit_card at 21-45 of 64 leaves, 0.1-0.3
# points lower, and car at 64 leaves 0.9 points lower)
GROW_MIN_CHILD_ROWS = 5
# the largest leaf budget growth from the root takes; a site never counts on more than 4 x this many leaves,
# whatever a server announces
MAX_LEAF_BUDGET = 256


def grow_depth(rounds: int, max_depth) -> int:
    """The depth budget of growth from the root: ``max_depth`` where the job sets one, else the rounds (one level
    each): the depth a tree can reach, not a budget that binds before the leaf budget does."""
    return int(max_depth) if isinstance(max_depth, int) and not isinstance(max_depth, bool) else int(rounds)


_HALF_INTEGERS = 1000  # every n + 0.5 with |n + 0.5| < 1000 is a lattice point


def lattice() -> np.ndarray:
    """The public thresholds of the grid round, increasing: 0, +-10^(k/64) for magnitudes 1e-3 .. 1e9 (3.7% apart),
    and the half-integers between -1000 and 1000 (an integer column's every value in a cell of its own)."""
    return log_lattice(LATTICE_PER_DECADE, _DECADES, _HALF_INTEGERS)


LATTICE_SIZE = len(lattice())


def is_free_numeric(bound) -> bool:
    """A numeric column whose values the schema does not restrict to a few codes (``encoding.threshold_bounds``)."""
    return not is_code_column(bound)


def on_lattice(thresholds) -> bool:
    """Whether a column's grid-round thresholds are the lattice (a free numeric column), not codes or categories."""
    return thresholds is not None and len(thresholds) == LATTICE_SIZE


def grid_candidates(feature_kinds, n_categories, bounds) -> SplitCandidates:
    """The grid round's cells: the lattice on free numeric columns, between every pair of codes on code columns
    (ordinal codes, one-hot indicators), one per category on categorical columns. The same for every site and job."""
    grid = lattice()
    thresholds, codes = [], []
    for j, kind in enumerate(feature_kinds):
        if kind == "categorical":
            thresholds.append(None)
            codes.append(int(n_categories[j]))
            continue
        b = bounds[j] if bounds is not None else None
        thresholds.append(grid if is_free_numeric(b) else np.arange(int(b[1])) + 0.5)
        codes.append(None)
    return SplitCandidates(tuple(thresholds), tuple(codes))


def root_tree(feature_kinds, n_classes, n_categories) -> Tree:
    """A single leaf: the tree the grid round counts on (its counts are the pooled class totals)."""
    return Tree(feature_kinds, n_classes, [LEAF], [-1], [None], [None], np.zeros((1, n_classes)), n_categories)


def quantile_candidates(grid: SplitCandidates, root_hist: np.ndarray, k: int = DEFAULT_GRID_THRESHOLDS
                        ) -> SplitCandidates:
    """The growth rounds' thresholds from the grid round's summed root histogram ((cells, C)): per free numeric
    column at most ``k`` lattice points, at the pooled quantiles (the lattice point closest to each of the k
    cut points, counted between cells that hold rows, so every threshold separates rows); code columns keep theirs."""
    offsets = grid.offsets
    thresholds = []
    for j in range(grid.n_features):
        t = grid.thresholds[j]
        if not on_lattice(t):  # categorical, or a code column: as in the grid
            thresholds.append(t)
            continue
        mass = root_hist[offsets[j]:offsets[j + 1] - 1].sum(axis=1)  # the lattice's cells, without missing
        occupied = np.flatnonzero(mass > 0)
        if len(occupied) < 2:
            thresholds.append(np.empty(0))
            continue
        # a cut between two occupied cells a < b: any lattice point t[a] .. t[b-1]; the upper edge of a is taken
        edges = occupied[:-1]
        below = np.cumsum(mass[occupied])[:-1]  # rows at or below each such cut
        if len(edges) > k:
            total = float(mass.sum())
            targets = total * np.arange(1, k + 1) / (k + 1)
            pick = np.unique(np.abs(below[None, :] - targets[:, None]).argmin(axis=1))
            edges = edges[pick]
        thresholds.append(np.asarray(t[edges], dtype=np.float64))
    return SplitCandidates(tuple(thresholds), grid.n_codes)


def plan_growth(tree: Tree, candidates: SplitCandidates, max_depth=None, *, min_rows: float = 0.0,
                max_values: int = GROWTH_ROUND_VALUES) -> RefinePlan:
    """Which leaves send histograms in a growth round: those above the depth budget whose counts hold more than
    one class and at least ``min_rows`` rows (two children's worth), the most impure mass first within
    ``max_values``; every other leaf sends its class counts."""
    depth = tree.node_depths()
    leaves = [int(v) for v in np.flatnonzero(tree.kind == LEAF)]
    limit = np.inf if max_depth is None else max_depth
    cells, C = int(candidates.offsets[-1]), tree.n_classes
    counts = tree.counts[leaves]
    weight = counts.sum(axis=1) * gini(counts)
    able = [i for i, v in enumerate(leaves)
            if depth[v] < limit and weight[i] > 0 and counts[i].sum() >= min_rows]
    room = max((max_values - len(leaves) * C) // max((cells - 1) * C, 1), 0)
    chosen = set(leaves[i] for i in sorted(able, key=lambda i: (-round(float(weight[i]), 9), leaves[i]))[:room])
    return RefinePlan(tuple(v for v in leaves if v in chosen), tuple(v for v in leaves if v not in chosen), C, cells)


def grow_round(tree: Tree, candidates: SplitCandidates, plan: RefinePlan, summed, *, max_depth=None,
               min_child: float = GROW_MIN_CHILD_ROWS, min_child_share: float = 0.0, max_grown=None
               ) -> tuple[Tree, dict]:
    """Relabel ``tree`` with the summed counts and split every histogram leaf by its best Gini split.

    Binary splits only (a threshold with the missing rows sent where they score better, or one code against the
    rest), or a categorical column's split into its codes when at most two hold rows: the leaf budget is spent by
    the last round's knapsack, which prefers two leaves to one per code. Splits are made best first by the Gini
    decrease they bring (weighted by rows) while the tree holds at most ``max_grown`` leaves. Every new child's
    counts are exact (read off the histogram). Returns the grown tree (not collapsed) and stats."""
    hists, leaf_counts = plan.unpack(summed)
    stops = _stop_mass(tree)
    nodes = _Nodes(tree)
    first = slice(candidates.offsets[0], candidates.offsets[1])
    for i, leaf in enumerate(plan.split_leaves):
        nodes.counts[leaf] = hists[i, first].sum(axis=0)
    for i, leaf in enumerate(plan.count_leaves):
        nodes.counts[leaf] = leaf_counts[i]
    _fill_counts(nodes, set(), stops)
    total = float(nodes.counts[0].sum())
    min_child = max(min_child, min_child_share * total)
    depth = tree.node_depths()
    limit = np.inf if max_depth is None else max_depth
    used = _categorical_used(tree)
    options = []
    for i, leaf in enumerate(plan.split_leaves):
        if depth[leaf] >= limit:
            continue
        binary = [o for o in _split_options(hists[i], candidates, used[leaf], min_child)
                  if o[2] == NUMERIC or len(o[4]) <= 2]
        if binary:
            best = max(binary, key=lambda o: o[0])
            rows = float(hists[i, first].sum())
            if best[0] * rows > 1e-9 * max(rows, 1.0):
                options.append((best[0] * rows, leaf, best))
    n_leaves = tree.n_leaves
    cap = np.inf if max_grown is None else max_grown
    n_split = 0
    for _, leaf, (gain, j, kind, point, groups, rest, missing) in sorted(options, key=lambda o: (-o[0], o[1])):
        extra = len(groups) - 1 + int(kind == CATEGORICAL and len(groups) == 1)
        if n_leaves + extra > cap:
            continue
        nodes.kind[leaf], nodes.feature[leaf], nodes.missing[leaf] = kind, j, missing
        if kind == NUMERIC:  # point -1: no threshold, the missing-only child
            nodes.points[leaf] = np.empty(0) if point < 0 else np.array([candidates.thresholds[j][point]])
        else:
            nodes.points[leaf] = np.asarray(point, dtype=np.float64)
        nodes.children[leaf] = np.array([nodes.add(g) for g in groups], dtype=np.int64)
        nodes.counts[leaf] = np.sum(groups, axis=0) + rest
        n_leaves += extra
        n_split += 1
    _pseudo_counts(nodes)
    out = _renumber(nodes)
    return out, {"leaves_split": n_split, "n_leaves_before": int(tree.n_leaves), "n_leaves": int(out.n_leaves),
                 "depth": int(out.depth)}


def _renumber(nodes: _Nodes) -> Tree:
    """Breadth-first order (children after their parent; the Tree's invariant holds either way, this keeps a
    node's index stable in reading order)."""
    order, queue = [], [0]
    while queue:
        v = queue.pop(0)
        order.append(v)
        if nodes.children[v] is not None:
            queue.extend(int(c) for c in nodes.children[v])
    index = {v: i for i, v in enumerate(order)}
    t = nodes.tree
    return Tree(t.feature_kinds, t.n_classes, [nodes.kind[v] for v in order], [nodes.feature[v] for v in order],
                [nodes.points[v] for v in order],
                [None if nodes.children[v] is None else np.array([index[int(c)] for c in nodes.children[v]])
                 for v in order], np.vstack([nodes.counts[v] for v in order]), t.n_categories,
                missing=[nodes.missing[v] for v in order])


def extends(tree: Tree, before: Tree, candidates: SplitCandidates) -> bool:
    """Whether ``tree`` is ``before`` with some leaves split once as growth splits them (``grow_round``): the same
    internal nodes in the same places, and each new split binary on ``candidates``: one threshold (or none: the
    missing-only child), or one or two category codes of a column not split on above it, each with a leaf child.
    What a site counts on in a growth round."""
    used = _categorical_used(before)
    stack = [(0, 0)]
    while stack:
        v, w = stack.pop()
        if before.kind[w] != LEAF:
            if (tree.kind[v] != before.kind[w] or tree.feature[v] != before.feature[w]
                    or tree.missing[v] != before.missing[w]
                    or not np.array_equal(tree.split_points[v], before.split_points[w])
                    or len(tree.children[v]) != len(before.children[w])):
                return False
            stack.extend(zip((int(c) for c in tree.children[v]), (int(c) for c in before.children[w])))
            continue
        if tree.kind[v] == LEAF:
            continue
        kids = tree.children[v]
        if len(kids) != 2 and not (tree.kind[v] == CATEGORICAL and len(kids) == 1):
            return False  # growth splits in two (one code against the rest: one child)
        if any(tree.kind[c] != LEAF for c in kids):
            return False
        j, points = int(tree.feature[v]), tree.split_points[v]
        if tree.kind[v] == NUMERIC:
            allowed = candidates.thresholds[j]
            if allowed is None or not np.all(np.isin(points, allowed)) or len(points) > 1:
                return False
        else:
            codes = candidates.n_codes[j]
            if codes is None or used[w, j] or len(points) != len(kids) or not np.all((points >= 0) & (points < codes)):
                return False
    return True


def structure_only(tree: Tree) -> Tree:
    """The tree a site counts on, without the server's counts: the splits are all a site needs to count, and a
    leaf's pooled counts would tell a site, less its own, the other sites' rows there."""
    return Tree(tree.feature_kinds, tree.n_classes, tree.kind, tree.feature, tree.split_points, tree.children,
                np.zeros_like(tree.counts), tree.n_categories, missing=tree.missing)


def can_grow(tree: Tree, candidates: SplitCandidates, max_depth=None) -> bool:
    """Whether a growth round has a leaf to split (above the depth budget, rows of more than one class, room for two
    children): otherwise the rounds go straight to the last."""
    return bool(plan_growth(tree, candidates, max_depth, min_rows=2 * GROW_MIN_CHILD_ROWS).split_leaves)


def max_counted_leaves(announced) -> int | None:
    """The most leaves a site counts on in growth from the root: 4 x the announced leaf budget, never more than
    4 x ``MAX_LEAF_BUDGET`` (None: nothing announced, which a site refuses)."""
    return None if announced is None else GROWN_LEAVES_FACTOR * min(int(announced), MAX_LEAF_BUDGET)
