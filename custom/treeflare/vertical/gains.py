"""Split criteria on exact integer statistics, and the one function that picks a split.

Every criterion maps integer channel sums (left child, parent) to a gain that is compared
**exactly** (``fractions.Fraction`` for gini and the GBDT gain; entropy uses one fixed float
formula on the same integers), so the federated build and the plaintext oracle pick identical
splits, ties included (tie-break: candidate order, i.e. party, feature, bin).  Exact fractions
are slow, so :func:`select` first computes every candidate's gain in floating point and only
evaluates exactly the candidates within a safe margin of the float maximum (the float error is
below 1e-15 of the terms' magnitude; the margin is 1e-9 of it): the result is the one a full exact
scan would give.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .quantize import fixed_scalar

_MARGIN = 1e-9


class Criterion:
    name = "abstract"

    def node_ok(self, parent: list) -> bool:
        """Is this node worth splitting at all (before looking at candidates)?"""
        raise NotImplementedError

    def gain(self, left: list, parent: list):
        """Exact gain of a split, or None when the split is not admissible."""
        raise NotImplementedError

    def float_gain(self, left: list, parent: list):
        """(float gain, magnitude of its terms), or None when the split is not admissible."""
        raise NotImplementedError

    def leaf(self, parent: list):
        raise NotImplementedError

    def float_gains(self, lefts: list, parent: list) -> tuple:
        """(indices of the admissible candidates, their float gains, the magnitudes of their terms), as arrays;
        OverflowError when a value is beyond float range."""
        idx, gains, mags = [], [], []
        for i, left in enumerate(lefts):
            r = self.float_gain(left, parent)
            if r is not None:
                idx.append(i)
                gains.append(r[0])
                mags.append(r[1])
        return np.asarray(idx, dtype=np.intp), np.asarray(gains, dtype=np.float64), np.asarray(mags, dtype=np.float64)


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
        if min(right) < 0 or min(left) < 0:
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

    def float_gain(self, left, parent):
        split = self.split_counts(left, parent)
        if split is None:
            return None
        nl, nr, n, right = split
        a = sum(c * c for c in left) / nl
        b = sum(c * c for c in right) / nr
        c = sum(v * v for v in parent) / n
        return a + b - c, a + b + c

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

    def float_gain(self, left, parent):
        split = self.split_counts(left, parent)
        if split is None:
            return None
        a, b, c = _nh(parent), _nh(left), _nh(split[3])
        return a - b - c, 0.0          # already the exact definition: no margin needed


class GBDTCriterion(Criterion):
    """Channels = (G_0, H_0, G_1, H_1, ...) in fixed point 2^p, one (G, H) pair per output.
    gain = sum_k G_Lk^2/(H_Lk+l) + G_Rk^2/(H_Rk+l) - G_k^2/(H_k+l) (all scaled by the same 2^p, so
    comparisons are exact); a child needs sum_k H_k >= min_child_weight."""

    name = "gbdt"

    def __init__(self, reg_lambda: float, min_child_weight: float, precision: int,
                 learning_rate: float, n_outputs: int = 1):
        self.lam = fixed_scalar(reg_lambda, precision)
        self.mcw = fixed_scalar(min_child_weight, precision)
        self.mcw_int = math.ceil(self.mcw)      # for an integer sum s: s < mcw exactly when s < ceil(mcw)
        self.flam = float(self.lam)
        self.lr = float(learning_rate)
        self.precision = int(precision)
        self.k = int(n_outputs)
        if self.lam < 0 or self.mcw < 0:
            raise ValueError("lambda and min_child_weight must be >= 0")

    def node_ok(self, parent):
        hs = parent[1::2]
        return sum(hs) >= 2 * self.mcw and all(h + self.lam > 0 for h in hs)

    def _score(self, g, h):
        d = h + self.lam
        return Fraction(0) if d == 0 else Fraction(g * g) / d

    def _children(self, left, parent):
        hl = left[1::2]
        hr = [h - x for h, x in zip(parent[1::2], hl)]
        if min(hl) < 0 or min(hr) < 0:
            raise ValueError("decoded hessian sums are inconsistent with the node")
        if sum(hl) < self.mcw_int or sum(hr) < self.mcw_int:
            return None
        return hl, hr

    def gain(self, left, parent):
        ch = self._children(left, parent)
        if ch is None:
            return None
        hl, hr = ch
        total = Fraction(0)
        for k in range(self.k):
            g, h, gl = parent[2 * k], parent[2 * k + 1], left[2 * k]
            total += self._score(gl, hl[k]) + self._score(g - gl, hr[k]) - self._score(g, h)
        return total

    def float_gain(self, left, parent):
        ch = self._children(left, parent)
        if ch is None:
            return None
        hl, hr = ch
        lam = self.flam
        tot, mag = 0.0, 0.0
        for k in range(self.k):
            g, h, gl = parent[2 * k], parent[2 * k + 1], left[2 * k]
            terms = []
            for gg, hh in ((gl, hl[k]), (g - gl, hr[k]), (g, h)):
                d = float(hh) + lam
                terms.append(0.0 if d == 0 else (gg * gg) / d)   # OverflowError if beyond float range
            tot += terms[0] + terms[1] - terms[2]
            mag += terms[0] + terms[1] + terms[2]
        return tot, mag

    def float_gains(self, lefts, parent):
        """:meth:`float_gain` of every candidate at once: the admissibility checks on the exact integers (one
        pass), the float terms in numpy (the same formula; errors far below the selection margin)."""
        k, mcw = self.k, self.mcw_int
        idx = []
        # the right child's sums exactly (as float_gain has them) before rounding: a small child of a large node
        # would otherwise lose its low bits
        if k == 1:
            G, H = parent
            if not lefts:
                return np.zeros(0, np.intp), np.zeros(0), np.zeros(0)
            hl_ = [x[1] for x in lefts]
            if min(hl_) < 0 or max(hl_) > H:
                raise ValueError("decoded hessian sums are inconsistent with the node")
            # exact integer comparisons (object arrays: Python's own int comparison, one C loop each)
            hl_o = np.array(hl_, dtype=object)
            idx = np.flatnonzero((hl_o >= mcw) & (hl_o <= H - mcw)).tolist()
            if not idx:
                return np.zeros(0, np.intp), np.zeros(0), np.zeros(0)
            gl_ = [lefts[i][0] for i in idx]
            hl_ = [hl_[i] for i in idx]
            L = np.array([gl_, hl_], dtype=np.float64).T                # OverflowError beyond float range
            R = np.array([[G - x for x in gl_], [H - x for x in hl_]], dtype=np.float64).T
        else:
            idx = [i for i, left in enumerate(lefts) if self._children(left, parent) is not None]
            if not idx:
                return np.zeros(0, np.intp), np.zeros(0), np.zeros(0)
            L = np.array([lefts[i] for i in idx], dtype=np.float64)
            R = np.array([[p - x for p, x in zip(parent, lefts[i])] for i in idx], dtype=np.float64)
        par = np.array([parent], dtype=np.float64)
        with np.errstate(all="ignore"):
            def score(M):
                gg, d = M[:, 0::2], M[:, 1::2] + self.flam
                return np.where(d == 0, 0.0, (gg * gg) / np.where(d == 0, 1.0, d))
            tl, tr, tp = score(L), score(R), score(par)
            tot = (tl + tr - tp).sum(axis=1)
            mag = (tl + tr + tp).sum(axis=1)
        if not (np.all(np.isfinite(tot)) and np.all(np.isfinite(mag))):
            raise OverflowError("split statistics beyond float range")
        return np.asarray(idx, dtype=np.intp), tot, mag

    def leaf(self, parent):
        vals = []
        for k in range(self.k):
            g, h = parent[2 * k], parent[2 * k + 1]
            d = h + self.lam
            vals.append(0.0 if d == 0 else -self.lr * float(Fraction(g) / d))
        return vals[0] if self.k == 1 else vals


def select(lefts, parent, crit: Criterion):
    """Best candidates among ``lefts`` (left-child channel sums, in tie-break order).

    Returns (exact best gain, indices of every candidate with exactly that gain, in order), or
    (None, []) when no candidate is admissible."""
    try:
        idx, fg, mags = crit.float_gains(lefts, parent)
        if not idx.size:
            return None, []
        near = idx[fg >= fg.max() - _MARGIN * mags.max()].tolist()
    except OverflowError:
        # statistics beyond float range (huge regression targets): exact scan of every candidate
        near = [i for i, left in enumerate(lefts) if crit.gain(left, parent) is not None]
        if not near:
            return None, []
    best, winners = None, []
    for i in near:
        e = crit.gain(lefts[i], parent)
        if best is None or e > best:
            best, winners = e, [i]
        elif e == best:
            winners.append(i)
    return best, winners


def make_criterion(params, n_classes: int, n_outputs: int = 1) -> Criterion:
    if params.model == "gbdt":
        return GBDTCriterion(params.reg_lambda, params.min_child_weight, params.precision,
                             params.learning_rate, n_outputs)
    mcw = max(1, int(params.min_child_weight))
    if params.criterion == "gini":
        return GiniCriterion(mcw)
    if params.criterion == "entropy":
        return EntropyCriterion(mcw)
    raise ValueError(f"unknown criterion {params.criterion!r}")
