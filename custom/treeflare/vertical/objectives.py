"""What the active party encrypts per row (the patent's "reference data"), and how scores become
predictions.

* ``tree`` (classification tree): one-hot label indicators, one channel per class (claim 4);
* GBDT (claim 3), one multi-output tree per boosting round, channels g_0, h_0, g_1, h_1, ...
  in fixed point 2^precision, all of a row's channels packed together (SecureBoost+ style):

  - ``binary``: logistic loss, 1 output;
  - ``softmax``: multinomial logistic loss, K outputs (g = p - y, h = p (1 - p));
  - ``squared_error``: regression, 1 output (g = F - y, h = 1).  The slot of g is sized from
    this tree's residuals (the bounds travel in the slot layout), so large targets widen the slot
    instead of overflowing it; a target too large for fixed point is refused with a clear error.
"""
from __future__ import annotations

import numpy as np

from .quantize import to_fixed

OBJECTIVES = ("binary", "softmax", "squared_error")


def _sigmoid(F):
    return 1.0 / (1.0 + np.exp(-F))


def _softmax(F):
    z = F - F.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class Objective:
    name = "abstract"
    n_outputs = 1

    def base_score(self, y) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def grad_hess(self, F: np.ndarray, y) -> tuple:  # pragma: no cover
        raise NotImplementedError

    def channels(self, F: np.ndarray, y, precision: int) -> tuple:
        """(channel value lists, per-row lower bounds, upper bounds) in fixed point; channel order
        g_0, h_0, g_1, h_1, ..."""
        g, h = self.grad_hess(F, y)
        one = 1 << precision
        chan, lo, hi = [], [], []
        for k in range(self.n_outputs):
            gi, hi_ = to_fixed(g[:, k], precision), to_fixed(h[:, k], precision)
            glo, ghi, hlo, hhi = self.bounds(gi, hi_, one)
            chan += [gi, hi_]
            lo += [glo, hlo]
            hi += [ghi, hhi]
        return chan, lo, hi

    def bounds(self, gi, hi_, one) -> tuple:
        # logistic losses: |g| <= 1 and 0 <= h <= 1/4 for every row, whatever the scores
        return -one, one, 0, one >> 2

    def transform(self, F: np.ndarray) -> tuple:  # pragma: no cover
        """(predictions, scores) from raw scores F (n, n_outputs)."""
        raise NotImplementedError


class Binary(Objective):
    name = "binary"

    def base_score(self, y):
        prior = float(np.clip(np.mean(y), 1e-6, 1 - 1e-6))
        return np.array([np.log(prior / (1 - prior))])

    def grad_hess(self, F, y):
        p = _sigmoid(F[:, 0])
        return (p - y)[:, None], (p * (1.0 - p))[:, None]

    def transform(self, F):
        return (F[:, 0] > 0).astype(np.int64), _sigmoid(F[:, 0])


class Softmax(Objective):
    name = "softmax"

    def __init__(self, n_classes: int):
        if n_classes < 2:
            raise ValueError("softmax needs at least 2 classes")
        self.n_outputs = int(n_classes)

    def base_score(self, y):
        prior = np.bincount(np.asarray(y, dtype=np.int64), minlength=self.n_outputs) / max(1, len(y))
        return np.log(np.clip(prior, 1e-6, 1.0))

    def grad_hess(self, F, y):
        p = _softmax(F)
        onehot = np.zeros_like(p)
        onehot[np.arange(len(y)), np.asarray(y, dtype=np.int64)] = 1.0
        return p - onehot, p * (1.0 - p)

    def transform(self, F):
        p = _softmax(F)
        return np.argmax(F, axis=1).astype(np.int64), p


class SquaredError(Objective):
    name = "squared_error"

    def base_score(self, y):
        return np.array([float(np.mean(y))])

    def grad_hess(self, F, y):
        return (F[:, 0] - y)[:, None], np.ones((len(y), 1))

    def bounds(self, gi, hi_, one):
        # residuals are unbounded: the slot comes from this tree's actual range (0 included)
        return min(0, min(gi)), max(0, max(gi)), one, one

    def transform(self, F):
        return F[:, 0].copy(), F[:, 0].copy()


def make_objective(name: str, n_classes: int) -> Objective:
    if name == "binary":
        if n_classes != 2:
            raise ValueError(f"objective 'binary' needs 2 classes, the label has {n_classes}")
        return Binary()
    if name == "softmax":
        return Softmax(n_classes)
    if name == "squared_error":
        return SquaredError()
    raise ValueError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")


def tree_channels(y, n_classes: int) -> tuple:
    """Classification tree: one-hot label indicators (claim 4)."""
    y = np.asarray(y, dtype=np.int64)
    chan = [[int(v) for v in (y == c)] for c in range(n_classes)]
    return chan, [0] * n_classes, [1] * n_classes
