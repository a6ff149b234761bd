"""Hand-made rules and trees for the ICDTA4FL tests."""

import numpy as np

from treeflare.icdta4fl import RuleSet


def rules(kinds, items, n_classes=2):
    """items: list of (conditions, distribution, count); conditions map feature ->
    (lower, upper) for numeric features (None = unbounded) or a code for categorical ones."""
    d = len(kinds)
    R = len(items)
    lower, upper = np.full((R, d), -np.inf), np.full((R, d), np.inf)
    equals = np.full((R, d), -1)
    mass, support = np.zeros((R, n_classes)), np.zeros(R)
    for r, (conds, dist, n) in enumerate(items):
        for j, c in conds.items():
            if kinds[j] == "categorical":
                equals[r, j] = c
            else:
                lo, up = c
                lower[r, j] = -np.inf if lo is None else lo
                upper[r, j] = np.inf if up is None else up
        mass[r] = np.asarray(dist, float) * n
        support[r] = n
    return RuleSet(lower, upper, equals, mass, support, np.ones(R, dtype=int), kinds)


def random_rules(rng, n_rules, kinds, n_classes, n_categories=3):
    lower = np.full((n_rules, len(kinds)), -np.inf)
    upper = np.full((n_rules, len(kinds)), np.inf)
    equals = np.full((n_rules, len(kinds)), -1)
    for j, kind in enumerate(kinds):
        tested = rng.random(n_rules) < 0.6
        if kind == "categorical":
            equals[tested, j] = rng.integers(0, n_categories, tested.sum())
        else:
            a = rng.integers(0, 10, n_rules).astype(float)
            b = a + rng.integers(1, 6, n_rules)
            lo_on = tested & (rng.random(n_rules) < 0.7)
            up_on = tested & (rng.random(n_rules) < 0.7)
            lower[lo_on, j] = a[lo_on]
            upper[up_on, j] = b[up_on]
    mass = rng.integers(0, 20, (n_rules, n_classes)).astype(float)
    mass[mass.sum(axis=1) == 0, 0] = 1.0
    support = rng.integers(0, 50, n_rules).astype(float)
    return RuleSet(lower, upper, equals, mass, support, np.ones(n_rules, dtype=int), kinds)


def random_inputs(rng, n, kinds, n_categories=3):
    X = np.empty((n, len(kinds)))
    for j, kind in enumerate(kinds):
        if kind == "categorical":
            X[:, j] = rng.integers(0, n_categories + 1, n)  # includes an unseen code
        else:
            X[:, j] = rng.integers(-1, 17, n) + rng.choice([0.0, 0.5], n)  # on and between bounds
    X[rng.random(X.shape) < 0.03] = np.nan
    return X
