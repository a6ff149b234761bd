"""XGBoost's hist split finding and leaf weights (src/tree/param.h, split_evaluator.h, hist/evaluate_splits.h), with
its float32 roundings, on pooled histograms.

The sums arrive exact (integers of the masked aggregation, decoded to float64, as XGBoost sums float32 gradients in
double); every place XGBoost rounds to ``float`` is rounded here too, so that on the same bins the same split wins:
- each side's gain is a float, their sum a float, and ``loss_chg = float(gain - root_gain)``;
- weights are floats, leaf values ``float(weight) * float(eta)``;
- candidates are scanned feature by feature: forward (missing values to the right), then, when the node has missing
  values in the feature, backward (missing to the left); a candidate replaces the best only when strictly better,
  and equal gains go to the lower feature index (``SplitEntry::NeedReplace``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32
RT_EPS = F32(1e-6)  # XGBoost's kRtEps: a split must gain more than this


@dataclass(frozen=True)
class Regularization:
    """The parameters the formulas read, as XGBoost holds them (float32)."""

    reg_lambda: float
    reg_alpha: float
    min_child_weight: float
    max_delta_step: float
    gamma: float
    eta: float

    @classmethod
    def of(cls, params) -> "Regularization":
        return cls(*(float(F32(getattr(params, k))) for k in ("reg_lambda", "reg_alpha", "min_child_weight",
                                                               "max_delta_step", "gamma", "eta")))


def threshold_l1(g, alpha: float):
    g = np.asarray(g, dtype=np.float64)
    return np.where(g > alpha, g - alpha, np.where(g < -alpha, g + alpha, 0.0))


def calc_weight(G, H, r: Regularization):
    """XGBoost's CalcWeight in double, returned as float32: 0 below ``min_child_weight``, L1/L2-shrunk Newton step,
    clipped to ``max_delta_step`` when set."""
    G, H = np.asarray(G, dtype=np.float64), np.asarray(H, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        dw = -threshold_l1(G, r.reg_alpha) / (H + r.reg_lambda)
    if r.max_delta_step != 0.0:
        dw = np.where(np.abs(dw) > r.max_delta_step, np.copysign(r.max_delta_step, dw), dw)
    dw = np.where((H < r.min_child_weight) | (H <= 0.0), 0.0, dw)
    return dw.astype(F32)


def calc_gain(G, H, r: Regularization):
    """One side's gain (TreeEvaluator's CalcGainGivenWeight), float32; 0 for an empty side."""
    G, H = np.asarray(G, dtype=np.float64), np.asarray(H, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if r.max_delta_step == 0.0:
            gain = (threshold_l1(G, r.reg_alpha) ** 2 / (H + r.reg_lambda)).astype(F32)
        else:
            w = calc_weight(G, H, r)
            gf, hf = G.astype(F32), H.astype(F32)
            gain = -(F32(2.0) * gf * w + (hf + F32(r.reg_lambda)) * w * w)
    return np.where(H <= 0.0, F32(0.0), gain).astype(F32)


@dataclass(frozen=True)
class Split:
    """The best split of one node: left = bins <= ``bin`` of ``feature`` (a bin index within the feature; -1: no
    bin, only the missing values, go left), missing values left when ``default_left``."""

    feature: int
    bin: int
    default_left: bool
    loss_chg: float
    left: tuple  # (count, G, H) as pooled integers' decoded values; count an int
    right: tuple


def best_split(C, G, H, total, ptr, r: Regularization) -> Split | None:
    """The node's best split from its pooled histogram (``C``, ``G``, ``H`` per bin, features' bins at
    ``ptr[f]:ptr[f+1]``) and its totals ``total = (count, G, H)``, or None when no candidate gains (XGBoost then
    keeps the node a leaf). Validity of the expansion (gamma, depth) is :func:`expands`."""
    n_all, g_all, h_all = total
    root_gain = calc_gain(g_all, h_all, r)
    mcw = r.min_child_weight
    best = None  # (loss, feature, bin, default_left, left, right)
    for f in range(len(ptr) - 1):
        lo, hi = int(ptr[f]), int(ptr[f + 1])
        if hi == lo:
            continue
        c, g, h = C[lo:hi], G[lo:hi], H[lo:hi]
        ec, eg, eh = np.cumsum(c), np.cumsum(g), np.cumsum(h)
        cands = []  # (loss array, bins, default_left, left stats fn)
        # forward: left = bins <= i, missing right
        lg, lh, rg, rh = eg, eh, g_all - eg, h_all - eh
        ok = (lh >= mcw) & (rh >= mcw)
        loss = (calc_gain(lg, lh, r) + calc_gain(rg, rh, r)) - root_gain
        cands.append((np.where(ok, loss, -np.inf).astype(F32), np.arange(hi - lo), False))
        has_missing = int(ec[-1]) != int(n_all)  # rows of the node without a value in this feature
        if has_missing:  # backward: right = bins >= i, missing left; scanned from the last bin down
            rc_, rg_, rh_ = (np.cumsum(x[::-1])[::-1] for x in (c, g, h))
            lg2, lh2 = g_all - rg_, h_all - rh_
            ok2 = (rh_ >= mcw) & (lh2 >= mcw)
            loss2 = (calc_gain(lg2, lh2, r) + calc_gain(rg_, rh_, r)) - root_gain
            order = np.arange(hi - lo)[::-1]
            # the backward candidate at bin i sends bins < i left: its left-most bin is i - 1
            cands.append((np.where(ok2, loss2, -np.inf).astype(F32)[order], order - 1, True))
        for losses, bins, default_left in cands:
            k = int(np.argmax(losses))  # the first of equal maxima: XGBoost's scan order
            if not np.isfinite(losses[k]) or not losses[k] > (best[0] if best else F32(0.0)):
                continue
            best = (losses[k], f, int(bins[k]), default_left)
    if best is None:
        return None
    loss, f, b, default_left = best
    lo, hi = int(ptr[f]), int(ptr[f + 1])
    left = (int(np.sum(C[lo:lo + b + 1])), float(np.sum(G[lo:lo + b + 1])), float(np.sum(H[lo:lo + b + 1])))
    if default_left:
        miss = (n_all - int(np.sum(C[lo:hi])), g_all - float(np.sum(G[lo:hi])), h_all - float(np.sum(H[lo:hi])))
        left = (left[0] + miss[0], left[1] + miss[1], left[2] + miss[2])
    right = (n_all - left[0], g_all - left[1], h_all - left[2])
    return Split(f, b, default_left, float(loss), left, right)


def expands(split: Split | None, depth: int, max_depth: int, r: Regularization) -> bool:
    """XGBoost's ExpandEntry::IsValid: a gain above kRtEps and not below gamma, both sides with some hessian, and
    the node above the depth limit."""
    if split is None or depth >= max_depth:
        return False
    loss = F32(split.loss_chg)
    return bool(loss > RT_EPS and split.left[2] != 0 and split.right[2] != 0 and not loss < F32(r.gamma))


def leaf_value(G, H, r: Regularization) -> float:
    """A leaf's value in the model: float32 weight times float32 eta."""
    return float(calc_weight(G, H, r) * F32(r.eta))
