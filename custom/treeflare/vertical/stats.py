"""Exact plaintext statistics at the active party: per-key sums of integer channels, and the
admissible cumulative ("left") candidates of one feature."""
from __future__ import annotations

import math

import numpy as np

_LIMB = 31
MAX_SAMPLES = 1 << 22          # float64 limb sums stay exact below this


class PlainHist:
    """Exact per-key sums of integer channels, via 31-bit limbs and float64 bincount
    (every partial sum stays below 2^53, so the float additions are exact).  Channels of any
    size (regression residuals at 53-bit precision can be hundreds of bits wide)."""

    def __init__(self, chan: list, lo: list, hi: list):
        n = len(chan[0])
        if n >= MAX_SAMPLES:
            raise ValueError(f"at most {MAX_SAMPLES - 1} training rows")
        self.lo = [int(v) for v in lo]
        self.limbs = []
        mask = (1 << _LIMB) - 1
        for c, vals in enumerate(chan):
            span = int(hi[c]) - self.lo[c]
            nl = max(1, math.ceil(span.bit_length() / _LIMB))
            if span < (1 << 62):
                off = np.array([int(v) - self.lo[c] for v in vals], dtype=np.int64)
                self.limbs.append([((off >> (_LIMB * j)) & mask).astype(np.float64) for j in range(nl)])
            else:
                off = [int(v) - self.lo[c] for v in vals]
                self.limbs.append([np.array([(v >> (_LIMB * j)) & mask for v in off], dtype=np.float64)
                                   for j in range(nl)])

    def sums(self, idx: np.ndarray, keys: np.ndarray, nkeys: int):
        """-> (counts per key, [channel sums per key])"""
        cnt = np.bincount(keys, minlength=nkeys)
        cols = []
        for c, limbs in enumerate(self.limbs):
            tot = None
            for j, limb in enumerate(limbs):
                # a limb's sums are below 2^53: exact as float64, as int64, then Python integers (object arrays)
                s = np.bincount(keys, weights=limb[idx], minlength=nkeys).astype(np.int64).astype(object)
                tot = s if tot is None else tot + (s << (_LIMB * j))
            cols.append((tot + cnt.astype(object) * self.lo[c]).tolist())
        return cnt.tolist(), [list(v) for v in zip(*cols)]

    def total(self, idx):
        cnt, sums = self.sums(idx, np.zeros(len(idx), dtype=np.int64), 1)
        return cnt[0], sums[0]


def cum_candidates(cnt, vecs, min_side: int = 1):
    """Cumulative left sums over bins; admissible thresholds only (bin non-empty, each side at least
    ``min_side`` rows: the node minimum, so that no split creates a node below it).
    Yields (bin, left_count, left_vector)."""
    n = sum(cnt)
    left = [0] * len(vecs[0])
    nl = 0
    for b in range(len(cnt) - 1):
        nl += cnt[b]
        left = [a + v for a, v in zip(left, vecs[b])]
        if cnt[b] > 0 and min_side <= nl <= n - min_side and 0 < nl < n:
            yield b, nl, list(left)
