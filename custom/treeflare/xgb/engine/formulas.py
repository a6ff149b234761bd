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
    left: tuple  # (count, G, H): the pooled integers (G and H fixed point)
    right: tuple


def scan_order(ptr) -> np.ndarray:
    """XGBoost's order of the candidates, as indices into [forward candidates (one per bin) | backward ones]: feature
    after feature, its forward ones by bin, then its backward ones from the last bin down."""
    B = int(ptr[-1])
    parts = []
    for f in range(len(ptr) - 1):
        lo, hi = int(ptr[f]), int(ptr[f + 1])
        parts += [np.arange(lo, hi), B + np.arange(hi - 1, lo - 1, -1)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def best_split(C, G, H, total, ptr, r: Regularization, bits: int, order=None) -> Split | None:
    """The node's best split from its pooled histogram (integers: ``C`` counts, ``G`` and ``H`` fixed point at
    ``bits``, per bin, features' bins at ``ptr[f]:ptr[f+1]``) and its totals ``total = (count, G, H)``, or None when
    no candidate gains (XGBoost then keeps the node a leaf). Every feature at once: the sums are exact integers
    (prefix sums within each feature), then decoded, so the order of additions cannot change a gain. Validity of the
    expansion (gamma, depth) is :func:`expands`. ``order``: :func:`scan_order` of ``ptr`` (computed when not given)."""
    ptr = np.asarray(ptr, dtype=np.int64)
    B = int(ptr[-1])
    if B == 0:
        return None
    n_all, g_all, h_all = (int(v) for v in total)
    scale = float(2 ** bits)
    feature = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    start = ptr[:-1][feature]

    def within(x):  # prefix sums of each feature's bins (exact int64), and each feature's own total
        cs = np.cumsum(np.asarray(x, dtype=np.int64))
        before = np.concatenate([[0], cs])[start]
        return cs - before, (np.concatenate([[0], cs])[ptr[1:]] - np.concatenate([[0], cs])[ptr[:-1]])[feature]

    ec, fc = within(C)
    eg, fg = within(G)
    eh, fh = within(H)
    root_gain = calc_gain(g_all / scale, h_all / scale, r)
    mcw = r.min_child_weight
    # forward: left = the feature's bins up to this one, missing values right
    lg, lh = eg / scale, eh / scale
    rg, rh = (g_all - eg) / scale, (h_all - eh) / scale
    fwd = np.where((lh >= mcw) & (rh >= mcw), (calc_gain(lg, lh, r) + calc_gain(rg, rh, r)) - root_gain, -np.inf)
    # backward, where the node has rows without this feature: right = this bin and those above, missing left
    bg, bh = fg - eg + G, fh - eh + H  # suffix sums: the feature's total less the bins before this one
    lg2, lh2 = (g_all - bg) / scale, (h_all - bh) / scale
    rg2, rh2 = bg / scale, bh / scale
    has_missing = fc != n_all
    bwd = np.where(has_missing & (rh2 >= mcw) & (lh2 >= mcw),
                   (calc_gain(lg2, lh2, r) + calc_gain(rg2, rh2, r)) - root_gain, -np.inf)
    losses = np.concatenate([fwd.astype(F32), bwd.astype(F32)])[scan_order(ptr) if order is None else order]
    k = int(np.argmax(losses))  # the first of equal maxima: XGBoost's scan order and feature tie rule
    if not np.isfinite(losses[k]) or not losses[k] > F32(0.0):
        return None
    idx = int((scan_order(ptr) if order is None else order)[k])
    backward = idx >= B
    b = idx - B if backward else idx
    f = int(feature[b])
    lo = int(ptr[f])
    if backward:  # bins below b go left with the missing values
        left = (n_all - int(fc[b] - ec[b] + C[b]), g_all - int(bg[b]), h_all - int(bh[b]))
        split = Split(f, b - lo - 1, True, float(losses[k]), left, ())
    else:
        left = (int(ec[b]), int(eg[b]), int(eh[b]))
        split = Split(f, b - lo, False, float(losses[k]), left, ())
    right = tuple(t - v for t, v in zip((n_all, g_all, h_all), split.left))
    return Split(split.feature, split.bin, split.default_left, split.loss_chg, split.left, right)


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
