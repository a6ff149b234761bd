"""Rules: one per root-to-leaf path, held column-wise in a ``RuleSet``.

A rule is a box over the features: per numeric feature an interval (lower, upper] (±inf when
untested), per categorical feature a code it must equal (-1 when untested), and per feature whether
a missing value (NaN) satisfies it (``missing``): MISSING_REFUSED (NaN fails the condition),
MISSING_ALLOWED (NaN passes, as do the values in the interval or equal to the code; an untested
feature is this) or MISSING_ONLY (only NaN passes; the interval or code is then untested). A leaf's
rule says what its tree does: a NaN passes where the path followed the node's ``missing`` child
(MISSING_ONLY below a missing-only child) and fails where it did not or where the node stops NaN.
It carries

- ``mass``: class weights over the global class list; its normalisation is the rule's class
  distribution. For a leaf, mass = the leaf's sample-weighted class counts. Merging rules adds
  masses, so the merged distribution is the sample-weighted mean (n_a p_a + n_b p_b)/(n_a + n_b)
  and does not depend on the order of the merges;
- ``support``: the estimated number of training samples in the box. For a leaf it is the leaf's
  sample count; for a conjunction of k leaves it is the geometric mean of their counts (the
  reference's round(sqrt(n_a n_b)) for two trees, but symmetric in k trees, unrounded);
- ``n_sources``: how many leaves the rule conjoins (needed to keep the geometric mean associative).

Both tree kinds give the same rule model: CART and binned-numeric ID3 splits give intervals,
categorical ID3 splits give equalities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trees.impurity import entropy, shares
from ..trees.tree import CATEGORICAL, LEAF, NUMERIC, Tree
from ..trees.validate import PayloadError, check_header, check_int, check_list, check_number

__all__ = ["RuleSet", "RulePayloadError", "extract_rules", "count_rules", "RULESET_SCHEMA", "MISSING_REFUSED",
           "MISSING_ALLOWED", "MISSING_ONLY", "default_missing",
           "RULESET_SCHEMA_VERSION", "DEFAULT_MAX_RULES_PAYLOAD", "MAX_RULE_CELLS"]

RULESET_SCHEMA = "treeflare.ruleset"
RULESET_SCHEMA_VERSION = 2  # 2 added ``missing``; 1 (NaN fails every tested condition) is still read
MISSING_REFUSED, MISSING_ALLOWED, MISSING_ONLY = 0, 1, 2
DEFAULT_MAX_RULES_PAYLOAD = 100_000
# rules x features of one tree's rule set: about 100 MB for its three bound arrays, whatever the tree declares
MAX_RULE_CELLS = 4_000_000


class RulePayloadError(PayloadError):
    """A rule-set payload is malformed."""


@dataclass
class RuleSet:
    lower: np.ndarray      # (R, d) float, -inf when untested; categorical columns stay -inf
    upper: np.ndarray      # (R, d) float, +inf when untested; categorical columns stay +inf
    equals: np.ndarray     # (R, d) int, -1 when untested; numeric columns stay -1
    mass: np.ndarray       # (R, C) float >= 0, class weights
    support: np.ndarray    # (R,) float >= 0
    n_sources: np.ndarray  # (R,) int >= 1
    feature_kinds: list = field(default_factory=list)
    missing: np.ndarray = None  # (R, d) int8 MISSING_*; None: refused where tested, allowed elsewhere (version 1)

    def __post_init__(self):
        self.lower = np.asarray(self.lower, dtype=np.float64)
        self.upper = np.asarray(self.upper, dtype=np.float64)
        self.equals = np.asarray(self.equals, dtype=np.int64)
        self.mass = np.asarray(self.mass, dtype=np.float64)
        self.support = np.asarray(self.support, dtype=np.float64)
        self.n_sources = np.asarray(self.n_sources, dtype=np.int64)
        self.feature_kinds = list(self.feature_kinds)
        if self.missing is None:
            self.missing = default_missing(self.lower, self.upper, self.equals)
        self.missing = np.asarray(self.missing, dtype=np.int8).reshape(self.lower.shape)

    # ------------------------------------------------------------------ basics
    @property
    def n_rules(self) -> int:
        return len(self.support)

    @property
    def n_features(self) -> int:
        return self.lower.shape[1]

    @property
    def n_classes(self) -> int:
        return self.mass.shape[1]

    def __len__(self) -> int:
        return self.n_rules

    @property
    def dist(self) -> np.ndarray:
        """Class distribution of each rule (uniform where the mass is zero)."""
        return shares(self.mass, "uniform")

    def entropy(self) -> np.ndarray:
        """Entropy (nats) of each rule's class distribution; a rule without mass counts as uniform."""
        return entropy(self.mass, empty="uniform")

    def take(self, index) -> "RuleSet":
        index = np.asarray(index)
        return RuleSet(self.lower[index], self.upper[index], self.equals[index], self.mass[index],
                       self.support[index], self.n_sources[index], self.feature_kinds, self.missing[index])

    @classmethod
    def empty(cls, n_features, n_classes, feature_kinds) -> "RuleSet":
        return cls(np.empty((0, n_features)), np.empty((0, n_features)),
                   np.empty((0, n_features), dtype=np.int64), np.empty((0, n_classes)),
                   np.empty(0), np.empty(0, dtype=np.int64), feature_kinds)

    @classmethod
    def concatenate(cls, sets) -> "RuleSet":
        sets = list(sets)
        return cls(np.concatenate([s.lower for s in sets]), np.concatenate([s.upper for s in sets]),
                   np.concatenate([s.equals for s in sets]), np.concatenate([s.mass for s in sets]),
                   np.concatenate([s.support for s in sets]),
                   np.concatenate([s.n_sources for s in sets]), sets[0].feature_kinds,
                   np.concatenate([s.missing for s in sets]))

    def covers(self, X) -> np.ndarray:
        """Boolean (n, R): which rules each row satisfies (a NaN as ``missing`` says)."""
        X = np.asarray(X, dtype=np.float64)
        out = np.ones((len(X), self.n_rules), dtype=bool)
        for j in range(self.n_features):
            x = X[:, j:j + 1]
            state = self.missing[:, j]
            if self.feature_kinds[j] == "categorical":
                tested = (self.equals[:, j] >= 0) | (state != MISSING_ALLOWED)
                if tested.any():
                    value_ok = (self.equals[:, j] < 0) | (x == self.equals[:, j])
            else:
                lo, up = self.lower[:, j], self.upper[:, j]
                tested = np.isfinite(lo) | np.isfinite(up) | (state != MISSING_ALLOWED)
                if tested.any():
                    with np.errstate(invalid="ignore"):
                        value_ok = (x > lo) & (x <= up)
            if tested.any():
                out &= np.where(np.isnan(x), state != MISSING_REFUSED, value_ok & (state != MISSING_ONLY))
        return out

    def canonical_order(self) -> np.ndarray:
        """A permutation that sorts rules by their content only (bounds, codes, mass, support)."""
        keys = [self.support, *self.mass.T[::-1], *self.missing.T[::-1], *self.equals.T[::-1],
                *self.upper.T[::-1], *self.lower.T[::-1]]
        return np.lexsort(keys) if self.n_rules else np.empty(0, dtype=np.int64)

    def sorted(self) -> "RuleSet":
        return self.take(self.canonical_order())

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        def bounds(a):
            return [[None if not np.isfinite(v) else float(v) for v in row] for row in a]
        return {
            "schema": RULESET_SCHEMA,
            "version": RULESET_SCHEMA_VERSION,
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "feature_kinds": list(self.feature_kinds),
            "lower": bounds(self.lower),   # null = -inf
            "upper": bounds(self.upper),   # null = +inf
            "equals": self.equals.astype(int).tolist(),
            "missing": self.missing.astype(int).tolist(),  # MISSING_REFUSED/ALLOWED/ONLY per rule and feature
            "mass": self.mass.astype(float).tolist(),
            "support": self.support.astype(float).tolist(),
            "n_sources": self.n_sources.astype(int).tolist(),
        }

    @classmethod
    def from_dict(cls, payload, *, max_rules=DEFAULT_MAX_RULES_PAYLOAD, n_features=None,
                  n_classes=None) -> "RuleSet":
        """Validate a payload made by ``to_dict`` and build the rule set."""
        err = RulePayloadError
        if not isinstance(payload, dict):
            raise err("ruleset", f"expected a dict, got {type(payload).__name__}")
        d, C, kinds = check_header(payload, RULESET_SCHEMA, (1, RULESET_SCHEMA_VERSION), n_features=n_features,
                                   n_classes=n_classes, error=err)
        has_missing = payload["version"] >= 2
        support = check_list(payload.get("support"), "support", max_len=max_rules, error=err)
        R = len(support)
        rows = {}
        names = (("lower", d), ("upper", d), ("equals", d), ("mass", C)) + ((("missing", d),) if has_missing else ())
        for name, width in names:
            table = check_list(payload.get(name), name, length=R, error=err)
            for r, row in enumerate(table):
                check_list(row, f"{name}[{r}]", length=width, error=err)
            rows[name] = table
        n_sources = check_list(payload.get("n_sources"), "n_sources", length=R, error=err)
        lower = np.full((R, d), -np.inf)
        upper = np.full((R, d), np.inf)
        equals = np.full((R, d), -1, dtype=np.int64)
        mass = np.zeros((R, C))
        missing = np.full((R, d), -1, dtype=np.int8)
        for r in range(R):
            for j in range(d):
                lo, up, eq = rows["lower"][r][j], rows["upper"][r][j], rows["equals"][r][j]
                eq = check_int(eq, f"equals[{r}][{j}]", lo=-1, hi=10_000, error=err)
                if lo is not None:
                    lower[r, j] = check_number(lo, f"lower[{r}][{j}]", error=err)
                if up is not None:
                    upper[r, j] = check_number(up, f"upper[{r}][{j}]", error=err)
                if kinds[j] == "categorical" and (lo is not None or up is not None):
                    raise err(f"lower[{r}][{j}]", "interval on a categorical feature")
                if kinds[j] == "numeric" and eq != -1:
                    raise err(f"equals[{r}][{j}]", "equality on a numeric feature")
                if lower[r, j] >= upper[r, j]:
                    raise err(f"upper[{r}][{j}]", "empty interval (lower >= upper)")
                equals[r, j] = eq
                if has_missing:
                    missing[r, j] = check_int(rows["missing"][r][j], f"missing[{r}][{j}]", lo=MISSING_REFUSED,
                                              hi=MISSING_ONLY, error=err)
                    if missing[r, j] == MISSING_ONLY and (lo is not None or up is not None or eq != -1):
                        raise err(f"missing[{r}][{j}]", "a missing-only condition with a value condition")
            for c in range(C):
                mass[r, c] = check_number(rows["mass"][r][c], f"mass[{r}][{c}]", nonnegative=True, error=err)
        sup = np.array([check_number(s, f"support[{r}]", nonnegative=True, error=err)
                        for r, s in enumerate(support)], dtype=np.float64)
        src = np.array([check_int(s, f"n_sources[{r}]", lo=1, error=err)
                        for r, s in enumerate(n_sources)], dtype=np.int64)
        return cls(lower, upper, equals, mass, sup, src, kinds,
                   missing if has_missing else default_missing(lower, upper, equals))


def default_missing(lower, upper, equals) -> np.ndarray:
    """Version-1 meaning of a box: NaN fails every tested condition and passes the untested ones."""
    tested = np.isfinite(lower) | np.isfinite(upper) | (np.asarray(equals) >= 0)
    return np.where(tested, MISSING_REFUSED, MISSING_ALLOWED).astype(np.int8)


def count_rules(tree: Tree, *, fallback_support: float = 1.0) -> int:
    """How many rules :func:`extract_rules` yields, counted without building them (a bound to check
    before the work: each categorical node adds a fallback rule per code it has no child for)."""
    n = tree.n_leaves
    if fallback_support > 0:
        for node in np.flatnonzero(tree.kind == CATEGORICAL):
            k = tree.n_categories[tree.feature[node]]
            if k is not None:
                n += max(int(k) - len(tree.split_points[node]), 0)
    return int(n)


def extract_rules(tree: Tree, *, fallback_support: float = 1.0) -> RuleSet:
    """One rule per leaf of ``tree``: its box, class counts (as mass) and sample count.

    A categorical node has no child for the codes it did not see in training; the tree predicts
    those from the node's own counts. When the feature's number of categories is known, each such
    code also gets a rule (the node's distribution, support ``fallback_support``: a pseudo-count,
    as no training sample fell there), so the rules cover what the tree covers. 0 disables them.

    A NaN passes a rule's condition on feature f where its path followed the ``missing`` child of
    every node on f (MISSING_ONLY below a missing-only child); a NaN that stops at a node (no
    ``missing`` child) is covered by no rule. A leaf no input can reach (a value branch under a
    missing-only condition, a missing-only child below a node that refused NaN) yields no rule.
    """
    d, C = tree.n_features, tree.n_classes
    lowers, uppers, equals, nans, leaves = [], [], [], [], []
    fallback_boxes, fallback_nodes = [], []
    stack = [(0, np.full(d, -np.inf), np.full(d, np.inf), np.full(d, -1, dtype=np.int64),
              np.full(d, MISSING_ALLOWED, dtype=np.int8))]
    while stack:
        node, lo, up, eq, nan = stack.pop()
        if tree.kind[node] == LEAF:
            lowers.append(lo), uppers.append(up), equals.append(eq), nans.append(nan), leaves.append(node)
            continue
        f = tree.feature[node]
        points = tree.split_points[node]
        branches = tree.n_branches(node)
        for i, child in enumerate(tree.children[node]):
            clo, cup, ceq, cnan = lo.copy(), up.copy(), eq.copy(), nan.copy()
            if i >= branches:  # the missing-only child: NaN in f, whatever the value conditions said
                if nan[f] == MISSING_REFUSED:
                    continue
                clo[f], cup[f], ceq[f], cnan[f] = -np.inf, np.inf, -1, MISSING_ONLY
            elif nan[f] == MISSING_ONLY:  # only NaN reaches this node on f, and NaN goes elsewhere
                if i != tree.missing[node]:
                    continue
            else:
                if i != tree.missing[node]:
                    cnan[f] = MISSING_REFUSED
                if tree.kind[node] == NUMERIC:
                    if i > 0:
                        clo[f] = max(clo[f], points[i - 1])
                    if i < len(points):
                        cup[f] = min(cup[f], points[i])
                    if clo[f] >= cup[f]:  # no number satisfies both this and an ancestor's interval
                        if cnan[f] != MISSING_ALLOWED:
                            continue
                        clo[f], cup[f], cnan[f] = -np.inf, np.inf, MISSING_ONLY
                elif tree.kind[node] == CATEGORICAL:
                    ceq[f] = int(points[i])
            stack.append((int(child), clo, cup, ceq, cnan))
        k = tree.n_categories[f] if tree.kind[node] == CATEGORICAL else None
        if k is not None and fallback_support > 0 and nan[f] != MISSING_ONLY:
            fallback_nan = nan.copy()
            fallback_nan[f] = MISSING_REFUSED  # a NaN is no unseen code (it follows ``missing`` or stops)
            for code in sorted(set(range(k)) - {int(v) for v in points}):
                ceq = eq.copy()
                ceq[f] = code
                fallback_boxes.append((lo, up, ceq, fallback_nan))
                fallback_nodes.append(node)
    if not leaves and not fallback_nodes:
        return RuleSet.empty(d, C, tree.feature_kinds)
    mass = tree.counts[np.asarray(leaves, dtype=np.int64)].reshape(len(leaves), C)
    support = mass.sum(axis=1)
    if fallback_nodes:
        lowers += [b[0] for b in fallback_boxes]
        uppers += [b[1] for b in fallback_boxes]
        equals += [b[2] for b in fallback_boxes]
        nans += [b[3] for b in fallback_boxes]
        mass = np.vstack([mass, tree.node_proba()[np.asarray(fallback_nodes)] * fallback_support])
        support = np.concatenate([support, np.full(len(fallback_nodes), float(fallback_support))])
    return RuleSet(np.vstack(lowers), np.vstack(uppers), np.vstack(equals), mass, support,
                   np.ones(len(support), dtype=np.int64), tree.feature_kinds, np.vstack(nans))
