"""Split criteria on exact integer statistics.

Every criterion maps integer channel sums (left child, parent) to a gain that is compared
**exactly** (``fractions.Fraction`` for gini and the GBDT gain; entropy uses one fixed
float formula on the same integers), so the federated build and the plaintext oracle pick
identical splits, ties included (tie-break: party, feature, bin -- by iteration order).
"""
from __future__ import annotations

import math
from fractions import Fraction

from .quantize import fixed_scalar


class Criterion:
    name = "abstract"

    def node_ok(self, parent: list) -> bool:
        """Is this node worth splitting at all (before looking at candidates)?"""
        raise NotImplementedError

    def gain(self, left: list, parent: list):
        """Gain of a split, or None when the split is not admissible."""
        raise NotImplementedError

    def leaf(self, parent: list):
        raise NotImplementedError


class GiniCriterion(Criterion):
    """Channels = per-class counts.  gain = S_L/n_L + S_R/n_R - S/n  (S = sum of squared counts);
    the impurity decrease times n."""

    name = "gini"

    def __init__(self, min_samples_leaf: int = 1):
        self.min_leaf = max(1, int(min_samples_leaf))

    def node_ok(self, parent):
        n = sum(parent)
        return n >= 2 * self.min_leaf and sum(1 for c in parent if c) > 1

    def split_counts(self, left, parent):
        """(n_left, n_right, n, right counts), or None when a child would be under min_leaf."""
        nl = sum(left)
        n = sum(parent)
        nr = n - nl
        if nl < self.min_leaf or nr < self.min_leaf:
            return None
        right = [p - l for p, l in zip(parent, left)]
        if min(right) < 0:
            raise ValueError("decoded counts exceed the node's counts")
        return nl, nr, n, right

    def gain(self, left, parent):
        split = self.split_counts(left, parent)
        if split is None:
            return None
        nl, nr, n, right = split
        sl = sum(c * c for c in left)
        sr = sum(c * c for c in right)
        sp = sum(c * c for c in parent)
        return Fraction(sl * nr * n + sr * nl * n - sp * nl * nr, nl * nr * n)

    def leaf(self, parent):
        return [int(c) for c in parent]


def _nh(counts) -> float:
    """n * H(counts) in nats, one fixed formula."""
    n = sum(counts)
    if n == 0:
        return 0.0
    s = n * math.log(n)
    for c in counts:
        if c:
            s -= c * math.log(c)
    return s


class EntropyCriterion(GiniCriterion):
    name = "entropy"

    def gain(self, left, parent):
        split = self.split_counts(left, parent)
        if split is None:
            return None
        return _nh(parent) - _nh(left) - _nh(split[3])


class GBDTCriterion(Criterion):
    """Channels = (G, H) in fixed point 2^p.  gain = G_L^2/(H_L+l) + G_R^2/(H_R+l) - G^2/(H+l)
    (all scaled by the same 2^p, so comparisons are exact)."""

    name = "gbdt"

    def __init__(self, reg_lambda: float, min_child_weight: float, precision: int,
                 learning_rate: float):
        self.lam = fixed_scalar(reg_lambda, precision)
        self.mcw = fixed_scalar(min_child_weight, precision)
        self.lr = float(learning_rate)
        self.precision = int(precision)
        if self.lam < 0 or self.mcw < 0:
            raise ValueError("lambda and min_child_weight must be >= 0")

    def node_ok(self, parent):
        return parent[1] >= 2 * self.mcw and (parent[1] + self.lam) > 0

    def _score(self, g, h):
        d = h + self.lam
        return Fraction(0) if d == 0 else Fraction(g * g) / d

    def gain(self, left, parent):
        gl, hl = left
        g, h = parent
        gr, hr = g - gl, h - hl
        if hl < 0 or hr < 0:
            raise ValueError("decoded hessian sums are inconsistent with the node")
        if hl < self.mcw or hr < self.mcw:
            return None
        return self._score(gl, hl) + self._score(gr, hr) - self._score(g, h)

    def leaf(self, parent):
        g, h = parent
        d = h + self.lam
        if d == 0:
            return 0.0
        return -self.lr * float(Fraction(g) / d)


def make_criterion(params, n_classes: int) -> Criterion:
    if params.model == "gbdt":
        return GBDTCriterion(params.reg_lambda, params.min_child_weight, params.precision,
                             params.learning_rate)
    mcw = max(1, int(params.min_child_weight))
    if params.criterion == "gini":
        return GiniCriterion(mcw)
    if params.criterion == "entropy":
        return EntropyCriterion(mcw)
    raise ValueError(f"unknown criterion {params.criterion!r}")
