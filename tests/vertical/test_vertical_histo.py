"""The passive party's histogram engine: its cumulative encrypted sums equal the plaintext sums of the rows in
bins 0..b, for every feature grouping it picks (binary columns in large groups, 32-bin pairs, single features in
small nodes), with one or two workers, in the C kernels' Montgomery form (the one this machine picks and the
portable one) and in gmpy2 alike."""
from __future__ import annotations

import numpy as np
import pytest

from treeflare.crypto import native
from treeflare.crypto.backend import OuKeyHolder
from treeflare.vertical import histo
from treeflare.vertical.histo import HistEngine

KH = OuKeyHolder.generate(768)          # test-only key size
NBINS = [2] * 9 + [5, 32, 32, 1, 3]     # one-hot-like columns, small and wide ones, a constant column


def test_groups_follow_the_cost_of_rows_and_cells():
    assert histo._groups([32] * 4, 50_000) == [(0, 1), (2, 3)]
    assert histo._groups([2] * 16, 13_000) == [tuple(range(8)), tuple(range(8, 16))]
    assert histo._groups([32] * 3, 10) == [(0,), (1,), (2,)]
    assert histo._groups([255, 255, 255], 10**6) == [(0, 1), (2,)]
    assert histo._groups([300, 300], 10**6) == [(0,), (1,)]      # 90,000 cells: above the cap
    groups = histo._groups(NBINS, 500)
    assert sorted(f for g in groups for f in g) == list(range(len(NBINS)))


@pytest.mark.parametrize("kernel", ["native", "portable", "gmpy2"])
def test_cumulative_sums_equal_the_plaintext_sums(kernel, monkeypatch):
    if kernel == "gmpy2":
        monkeypatch.setattr(native, "products", lambda mod: None)
    if kernel == "portable":                   # as TREEFLARE_NATIVE=portable selects it, here and in the workers
        monkeypatch.setenv("TREEFLARE_NATIVE", "portable")
        monkeypatch.setattr(native, "_LIB", None)
        monkeypatch.setattr(native, "_STATUS", "not loaded yet")
    if kernel != "gmpy2" and native.products(KH.public.modulus) is None:
        pytest.skip(f"C kernel not usable here: {native.status()}")
    rng = np.random.default_rng(3)
    n = 500
    bins = np.stack([rng.integers(0, nb, n) for nb in NBINS], 1).astype(np.uint8)
    vals = rng.integers(0, 1000, (n, 2))
    raw = KH.encrypt_bytes([int(v) for v in vals.ravel()], 1)
    nodes = {0: np.arange(n), 1: np.sort(rng.choice(n, 40, replace=False)), 2: np.array([7]),
             3: np.array([], dtype=np.int64)}
    ref = None
    for workers in (1, 2):
        eng = HistEngine(KH.public, bins, NBINS, workers=workers)
        try:
            assert eng.mont == (kernel != "gmpy2")
            eng.load(raw, 2)
            hist = {key: eng.sums(h) for key, h in eng.histograms(nodes).items()}
            # packed three fields to a ciphertext (the compression), from the node's own sums: bin 1 of each column
            h0 = eng.histograms({0: nodes[0]})[0]
            fields = eng.handles(h0, np.arange(len(NBINS)), np.ones(len(NBINS), dtype=np.int64))
            packed = eng.compress([[(u, 30) for f in fields[:3] for u in f], [(u, 30) for u in fields[3]]])
        finally:
            eng.close()
        plain = KH.decrypt_bytes(packed, 1)
        low = [vals[bins[:, f] <= 1].sum(0) for f in range(len(NBINS))]
        assert plain[0] == sum(int(low[f][u]) << (30 * (2 * f + u)) for f in range(3) for u in range(2))
        assert plain[1] == int(low[3][0]) + (int(low[3][1]) << 30)
        for key, rows in nodes.items():
            for f, nb in enumerate(NBINS):
                cts = [c for b in range(nb) for c in hist[key][f][b]]
                got = np.array(KH.decrypt_bytes(KH.public.to_bytes(cts), 1)).reshape(nb, 2)
                want = np.array([vals[rows][bins[rows, f] <= b].sum(0) for b in range(nb)])
                assert np.array_equal(got, want), (workers, key, f)
        ref = (hist, packed) if ref is None else ref
        assert (hist, packed) == ref          # the same ciphertexts with any number of workers


def test_bulk_cell_plans_equal_the_per_group_plans(monkeypatch):
    """_cell_plans (groups of one shape keyed and sorted together, features' plans shared where the same cells are
    present) gives every group the plan _cell_plan gives it, and counts the same multiplications."""
    rng = np.random.default_rng(7)
    nbins = [32] * 6 + [2] * 16 + [5, 300, 7]
    n = 4000
    cols = np.stack([rng.integers(0, nb, n) for nb in nbins]).astype(np.uint16)
    cols[1, :] = rng.integers(0, 3, n)           # a 32-bin column with few bins used: other cells present
    for rows in (np.arange(n), np.sort(rng.choice(n, 150, replace=False)), np.array([5]), np.zeros(0, np.int64),
                 np.arange(n - 1)):
        groups = histo._groups(nbins, max(1, rows.size))
        groups += [(0, 1), (2, 3), (22, 23)]       # extra pairs of the same and of other shapes
        st_a = {"cols": cols, "nbins": nbins, "C": [None, None], "mults": 0}
        monkeypatch.setattr(histo, "_BULK_ROWS", n - 1)     # the whole node one by one, the others together
        st_b = dict(st_a, mults=0)
        bulk = histo._cell_plans(st_a, rows, groups)
        one = [histo._cell_plan(st_b, rows, g) for g in groups]
        assert st_a["mults"] == st_b["mults"]
        for (ra, sa, pa), (rb, sb, pb) in zip(bulk, one):
            assert np.array_equal(ra, rb) and np.array_equal(sa, sb)
            assert len(pa) == len(pb)
            for (fa, ka, oa, ga), (fb, kb, ob, gb) in zip(pa, pb):
                assert fa == fb and np.array_equal(ka, kb)
                assert (oa is None) == (ob is None)
                if oa is not None:
                    assert np.array_equal(oa, ob) and np.array_equal(ga, gb)
