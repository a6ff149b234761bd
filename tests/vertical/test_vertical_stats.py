"""The active party's exact plaintext statistics (PlainHist) and the binary GBDT's vectorised candidate scan
against direct Python arithmetic, with channels past 64 bits and negative values."""
from __future__ import annotations

import numpy as np

from treeflare.vertical.gains import GBDTCriterion, select
from treeflare.vertical.stats import PlainHist


def test_sums_are_exact_for_wide_and_signed_channels():
    rng = np.random.default_rng(5)
    n, nkeys = 3000, 7
    lo, hi = [-(1 << 53), 0, -(1 << 90)], [1 << 53, 1 << 51, 1 << 90]     # g, h, a regression residual
    chan = [[int(x) for x in rng.integers(-(1 << 53), 1 << 53, n)],
            [int(x) for x in rng.integers(0, 1 << 51, n)],
            [int(a) * (1 << 40) + int(b) for a, b in zip(rng.integers(-(1 << 49), 1 << 49, n),
                                                         rng.integers(0, 1 << 40, n))]]
    chan[0][:5] = [lo[0]] * 5                # the bounds themselves
    chan[1][5:10] = [hi[1]] * 5
    ph = PlainHist(chan, lo, hi)
    idx = np.sort(rng.choice(n, 1700, replace=False))
    keys = rng.integers(0, nkeys, idx.size)
    cnt, sums = ph.sums(idx, keys, nkeys)
    assert cnt == [int((keys == k).sum()) for k in range(nkeys)]
    for k in range(nkeys):
        rows = idx[keys == k].tolist()
        assert sums[k] == [sum(chan[c][i] for i in rows) for c in range(3)]
        assert all(type(v) is int for v in sums[k])
    assert ph.total(idx) == (idx.size, [sum(chan[c][i] for i in idx.tolist()) for c in range(3)])


def test_vectorised_gbdt_scan_keeps_the_exact_admissibility_and_best_gain():
    """Hessian sums at exactly min_child_weight on either side are admissible, one below is not; the winner is
    the exact best (Fraction gains) over every admissible candidate."""
    crit = GBDTCriterion(reg_lambda=1.0, min_child_weight=1.0, precision=53, learning_rate=0.3)
    mcw = crit.mcw_int
    G, H = 5 << 60, 40 * mcw
    rng = np.random.default_rng(2)
    lefts = [[int(g), int(h)] for g, h in zip(rng.integers(-(1 << 62), 1 << 62, 400),
                                              rng.integers(0, H + 1, 400))]
    lefts += [[1 << 61, mcw], [1 << 61, mcw - 1], [G - (1 << 50), H - mcw], [G, H - mcw + 1]]
    best, winners = select(lefts, [G, H], crit)
    exact = [(crit.gain(x, [G, H]), i) for i, x in enumerate(lefts)]
    ok = [(g, i) for g, i in exact if g is not None]
    assert {i for _g, i in ok} >= {400, 402} and not {401, 403} & {i for _g, i in ok}
    top = max(g for g, _i in ok)
    assert best == top and winners == [i for g, i in ok if g == top]
    idx, _tot, _mag = crit.float_gains(lefts, [G, H])
    assert idx.tolist() == [i for _g, i in ok]
