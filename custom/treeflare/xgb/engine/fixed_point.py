"""Fixed-point integers for the masked sums (pairwise masks cancel mod 2^64 only on integers).

A gradient or hessian ``v`` travels as ``round(v * 2^bits)``: each row errs by at most 2^-(bits+1), so a pooled sum
over n rows by at most n * 2^-(bits+1) (40 bits, 100,000 rows: 4.5e-8), far below the float32 resolution XGBoost's
gains are compared at. ``bits`` is public, the same at every site, and chosen so that no pooled sum can pass 2^61.
"""

from __future__ import annotations

import math

import numpy as np

MAX_GRAD_BITS = 40
MIN_GRAD_BITS = 8
EVAL_BITS = 24
MIN_EVAL_BITS = -64  # a validation loss of huge labels may be counted in units of 2^k
LABEL_BITS = 20
_SPLIT = 26  # bincount sums in float64: each int64 is added as two parts whose sums stay below 2^53


def bits_for(n_rows: int, most: float, cap: int = MAX_GRAD_BITS, floor: int = MIN_GRAD_BITS) -> int:
    """The most bits that keep ``n_rows * most * 2^bits`` below 2^61; ValueError below ``floor``."""
    bits = min(cap, 61 - math.ceil(math.log2(max(1.0, float(n_rows) * max(float(most), 1.0)))))
    if bits < floor:
        raise ValueError(f"{n_rows} rows with values up to {most:g} leave fewer than {MIN_GRAD_BITS} fixed-point bits")
    return bits


def encode(values, bits: int) -> np.ndarray:
    return np.rint(np.asarray(values, dtype=np.float64) * float(2 ** bits)).astype(np.int64)


def decode(values, bits: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / float(2 ** bits)


def bincount_int(index, weights, minlength: int) -> np.ndarray:
    """``np.bincount`` of int64 weights, exactly: high and low parts summed apart (each sum below 2^53 for up to
    2^26 rows a bin) and joined in int64."""
    w = np.asarray(weights, dtype=np.int64)
    lo = w & ((1 << _SPLIT) - 1)
    hi = w >> _SPLIT
    s_lo = np.bincount(index, weights=lo.astype(np.float64), minlength=minlength)
    s_hi = np.bincount(index, weights=hi.astype(np.float64), minlength=minlength)
    return (np.rint(s_hi).astype(np.int64) << _SPLIT) + np.rint(s_lo).astype(np.int64)
