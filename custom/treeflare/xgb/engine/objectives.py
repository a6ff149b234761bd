"""The three objectives' gradients, as XGBoost computes them (float32, src/objective/regression_loss.h and
multiclass_obj.cu), their public bounds (what the server checks the pooled sums against) and the validation metric
sums for early stopping."""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
HESS_EPS = F32(1e-16)  # XGBoost's floor on a hessian
LOGLOSS_EPS = 1e-16  # XGBoost clips probabilities so: -log(1e-16) = 36.8 is the most one row adds
MAX_ROW_LOGLOSS = 37.0


def sigmoid(x):
    """XGBoost's common::Sigmoid in float32 (exp of -x capped at 88.7)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore"):
        return (F32(1.0) / (np.exp(np.minimum(-x, F32(88.7))) + F32(1.0))).astype(F32)


def softmax(margins):
    """Row-wise softmax as XGBoost's common::Softmax: float32 exps of the margins less their max, a double sum."""
    m = np.asarray(margins, dtype=F32)
    e = np.exp(m - m.max(axis=1, keepdims=True)).astype(F32)
    return (e / e.astype(np.float64).sum(axis=1, keepdims=True).astype(F32)).astype(F32)


def gradients(objective: str, margins, y, groups: int):
    """(g, h) per row and output group (arrays n x groups, float32) from the model's margins (n x groups)."""
    m = np.asarray(margins, dtype=F32).reshape(len(y), groups)
    if objective == "binary:logistic":
        p = sigmoid(m[:, 0])
        yy = np.asarray(y, dtype=F32)
        return (p - yy)[:, None], np.maximum(p * (F32(1.0) - p), HESS_EPS)[:, None]
    if objective == "multi:softprob":
        p = softmax(m)
        onehot = (np.asarray(y)[:, None] == np.arange(groups)[None, :]).astype(F32)
        return (p - onehot).astype(F32), np.maximum(F32(2.0) * p * (F32(1.0) - p), HESS_EPS).astype(F32)
    g = (m[:, 0] - np.asarray(y, dtype=F32)).astype(F32)
    return g[:, None], np.ones_like(g)[:, None]


def bounds(objective: str, label_bound: float = 0.0) -> tuple[float, float]:
    """(most |g|, most h) a single row can give: the server checks the pooled sums of every bin against them times
    the bin's pooled rows. Regression: |g| = |prediction - label| is bounded by 4 x the largest |label| the sketch
    saw, plus 1 (predictions stay among the labels; a site whose rows exceed it refuses, naming the bound)."""
    if objective == "binary:logistic":
        return 1.0, 0.25
    if objective == "multi:softprob":
        return 1.0, 0.5
    return 4.0 * float(label_bound) + 1.0, 1.0


def eval_sum(objective: str, margins, y, groups: int, row_max: float = np.inf) -> float:
    """This site's sum over its validation rows of XGBoost's default metric's per-row term (logloss, mlogloss, or
    the squared error: rmse = sqrt of the pooled mean), each term at most ``row_max``."""
    m = np.asarray(margins, dtype=np.float64).reshape(len(y), groups)
    if len(y) == 0:
        return 0.0
    if objective == "binary:logistic":
        p = 1.0 / (1.0 + np.exp(-m[:, 0]))
        p = np.clip(p, LOGLOSS_EPS, 1 - LOGLOSS_EPS)
        yy = np.asarray(y, dtype=np.float64)
        terms = -(yy * np.log(p) + (1 - yy) * np.log(1 - p))
    elif objective == "multi:softprob":
        e = np.exp(m - m.max(axis=1, keepdims=True))
        p = e[np.arange(len(y)), np.asarray(y, dtype=np.int64)] / e.sum(axis=1)
        terms = -np.log(np.clip(p, LOGLOSS_EPS, 1.0))
    else:
        terms = (m[:, 0] - np.asarray(y, dtype=np.float64)) ** 2
    return float(np.sum(np.minimum(terms, row_max)))


def metric(objective: str, total: float, n: int) -> float:
    """The pooled metric from the pooled sum of :func:`eval_sum` over ``n`` validation rows."""
    if n <= 0:
        return float("nan")
    return float(np.sqrt(max(total, 0.0) / n)) if objective == "reg:squarederror" else float(total / n)


def base_margin_of(objective: str, base_score: float) -> float:
    """The margin every row starts from (XGBoost's ProbToMargin): logit for binary:logistic, as is otherwise."""
    if objective == "binary:logistic":  # libm's logf, as XGBoost (numpy's float32 log can be 1 ulp off it)
        return float(F32(-math.log(float(F32(1.0) / F32(base_score) - F32(1.0)))))
    return float(base_score)
