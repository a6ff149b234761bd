"""Bounded memory at the parties (issue 25 item 2), on small data: gradients packed and encrypted by row block give
the oracle's model bit for bit (one block, many blocks, a last partial block; worker processes or not), the
training floats are not kept after binning, codes are uint8 / uint16, and the active party's buffers while it
encrypts a tree stay near the one ciphertext array it sends (traced allocations, not time)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from treeflare.crypto import make_key_holder
from treeflare.vertical import VerticalParams, close_parties, compare_runs, make_parties, run_oracle, run_vertical
from treeflare.vertical import active as active_mod
from treeflare.vertical import synthetic


def _params(**kw):
    base = dict(model="gbdt", objective="binary", key_bits=512, allow_insecure_key=True, workers=1, max_depth=3,
                bins=8, min_rows_node=4, n_trees=2)
    base.update(kw)
    return VerticalParams(**base)


def _data(n=300, seed=3, **kw):
    d = synthetic(n=n, n_test=60, passive_features=(3, 2), seed=seed, extreme=True, **kw)
    rng = np.random.default_rng(seed)
    for X in [d.X_active] + d.X_passive:          # missing values in every party
        X[rng.random(X.shape) < 0.05] = np.nan
    return d


@pytest.mark.parametrize("rows,workers,objective", [(7, 1, "binary"), (64, 2, "binary"), (10_000, 1, "binary"),
                                                    (33, 2, "softmax")])
def test_row_blocks_identical_to_oracle(monkeypatch, rows, workers, objective):
    monkeypatch.setattr(active_mod, "_ENCRYPT_ROWS", rows)
    d = _data(n_classes=3 if objective == "softmax" else 2)
    P = _params(workers=workers, objective=objective)
    fed = run_vertical(d, P)
    assert compare_runs(fed, run_oracle(d, P))["identical"]
    a, ps = fed
    assert a.kh.ops["encryptions"] == P.n_trees * d.X_active.shape[0] * a.layout_info["units_per_row"]


def test_parties_keep_codes_not_floats():
    d = _data(n=200)
    for bins, dtype in ((8, np.uint8), (256, np.uint8), (300, np.uint16)):
        a, ps = run_vertical(d, _params(bins=bins, n_trees=1, max_depth=2))
        assert a.X_train is None and a.bins.dtype == dtype
        for p in ps.values():
            assert p.X_train is None and p.bins.dtype == dtype
        # the caller's arrays are untouched
        assert d.X_active.dtype == np.float64 and np.isnan(d.X_active).any()


def test_encryption_buffers_stay_near_the_ciphertexts(monkeypatch):
    """Peak traced allocations while the active party encrypts one tree: the ciphertext array it sends plus one
    row block's buffers (under 2x that array; packing every row first, then copying, took 2.7x)."""
    monkeypatch.setattr(active_mod, "_ENCRYPT_ROWS", 2000)
    d = synthetic(n=20_000, n_test=50, active_features=3, passive_features=(4,), seed=1)
    P = VerticalParams(model="gbdt", n_trees=1, max_depth=1, scheme="mock", key_bits=2048, workers=1)
    a, ps = make_parties(d, P)
    try:
        a.kh = make_key_holder("mock", 2048)
        F = np.tile(a.objective.base_score(a.y), (a.n, 1))
        tracemalloc.start()
        try:
            grad = a._encrypt_tree(F)[4]
            _cur, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert grad["cts"].nbytes == 20_000 * 512
        assert peak < 2 * grad["cts"].nbytes, peak
    finally:
        close_parties(a, ps)
