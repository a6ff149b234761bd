"""Encrypted per-feature, per-bin sums at a passive party (the hot loop), optionally spread
over worker processes (fork start: the ciphertexts are inherited, not copied per task)."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from gmpy2 import mpz

from ..crypto import PaillierPublic

_MIN_ROWS_PARALLEL = 2000
_STATE: dict = {}


def _sum_paillier(cts, rows, nsq):
    acc = mpz(1)
    for i in rows:
        acc = acc * cts[i] % nsq
    return acc


def _feature_hist(pub, C, col_bins, ii, nb):
    """hist[b] = [unit sums] for one feature; col_bins = bins of rows ii."""
    order = np.argsort(col_bins, kind="stable")
    sorted_bins = col_bins[order]
    rows_sorted = ii[order]
    bounds = np.searchsorted(sorted_bins, np.arange(nb + 1), side="left")
    out = []
    paillier = isinstance(pub, PaillierPublic)
    for b in range(nb):
        rows = rows_sorted[bounds[b]:bounds[b + 1]].tolist()
        if paillier:
            out.append([_sum_paillier(Cu, rows, pub.nsq) for Cu in C])
        else:
            out.append([mpz(sum(Cu[i] for i in rows)) for Cu in C])
    return out


def _worker(f):
    pub, C, bins, ii, nbins = (_STATE[k] for k in ("pub", "C", "bins", "ii", "nbins"))
    hist = _feature_hist(pub, C, bins[ii, f], ii, nbins[f])
    w = pub.ct_bytes
    return b"".join(int(c).to_bytes(w, "big") for b in hist for c in b)


def node_histograms(pub, C, bins, ii, nbins, workers=1):
    """-> (hist[f][b][u], number of homomorphic additions)."""
    n_feat = bins.shape[1]
    units = len(C)
    n_add = int(ii.size) * n_feat * units
    if workers <= 1 or ii.size < _MIN_ROWS_PARALLEL or not isinstance(pub, PaillierPublic) or n_feat < 2:
        return [_feature_hist(pub, C, bins[ii, f], ii, nbins[f]) for f in range(n_feat)], n_add
    _STATE.update(pub=pub, C=C, bins=bins, ii=ii, nbins=nbins)
    w = pub.ct_bytes
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=min(workers, n_feat), mp_context=ctx) as ex:
            raws = list(ex.map(_worker, range(n_feat)))
    finally:
        _STATE.clear()
    out = []
    for f, raw in enumerate(raws):
        cts = [mpz.from_bytes(raw[i:i + w], "big") for i in range(0, len(raw), w)]
        out.append([cts[b * units:(b + 1) * units] for b in range(nbins[f])])
    return out, n_add
