"""Slot layouts: widths from the patent's control parameters, pack/sum/compress/decrypt/unpack
exactness on random and boundary inputs, and detection of undersized slots."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from treeflare.crypto import PaillierKeyHolder
from treeflare.crypto.packing import SlotLayout, SlotOverflowError

KH = PaillierKeyHolder.generate(1024, "djn")     # test-only key size


def test_widths_match_spec_gbdt():
    """n = 100k, p = 53: g slot 71 (signed), h slot 68 -> 139 bits, 14 pairs per 2048-bit ct."""
    p, n = 53, 100_000
    lay = SlotLayout.for_channels([-(1 << p), 0], [1 << p, 1 << (p - 2)], n)
    assert lay.widths == (71, 68) and lay.total_width == 139
    assert lay.values_per_ciphertext(2046) == 14
    p = 32
    lay = SlotLayout.for_channels([-(1 << p), 0], [1 << p, 1 << (p - 2)], n)
    assert lay.values_per_ciphertext(2046) == 21


@pytest.mark.parametrize("L,per_ct", [(2, 60), (5, 24)])
def test_widths_match_spec_classification(L, per_ct):
    """Claim 4: slot = bitlen(n) per label; total = bitlen(n) * L; per ct = 2046 // total."""
    lay = SlotLayout.for_channels([0] * L, [1] * L, 100_000)
    assert lay.widths == (17,) * L
    assert lay.values_per_ciphertext(2046) == per_ct


def test_undersized_slot_detected():
    with pytest.raises(SlotOverflowError):
        SlotLayout((0, 0), (1, 1), 1000, (9, 10))           # bitlen(1000) = 10 > 9
    with pytest.raises(SlotOverflowError):
        SlotLayout((-4,), (4,), 100, (9,))                  # signed needs 10
    lay = SlotLayout.for_channels([0, 0], [1, 1], 10)
    with pytest.raises(SlotOverflowError):
        lay.pack_rows(np.ones((11, 2), dtype=np.int64))      # more samples than n_max
    with pytest.raises(SlotOverflowError):
        lay.pack_rows(np.array([[2, 0]]))                   # value above its bound
    with pytest.raises(SlotOverflowError):
        lay.values_per_ciphertext(lay.total_width - 1)
    with pytest.raises(SlotOverflowError):                  # bits above the last slot
        lay.unpack(1 << (lay.total_width + 3), 1)


def _roundtrip(lay, rows, subsets, k, kh=KH):
    """pack -> encrypt -> homomorphic subset sums -> Horner compress -> decrypt -> unpack."""
    pub = kh.public
    cts = kh.encrypt_many(lay.pack_rows(rows))
    sums = []
    for sub in subsets:
        acc = pub.one()
        for i in sub:
            acc = pub.add(acc, cts[i])
        sums.append(acc)
    expect = [[int(sum(int(rows[i, c]) for i in sub)) for c in range(lay.n_channels)] for sub in subsets]
    got = []
    for s in range(0, len(sums), k):
        grp = sums[s:s + k]
        acc = grp[-1]
        for c in reversed(grp[:-1]):
            acc = pub.add(pub.shift(acc, lay.total_width), c)
        got.extend(lay.unpack(kh.decrypt_many([acc])[0], len(grp)))
    assert got == expect


channel = st.tuples(st.integers(-(2 ** 40), 0), st.integers(0, 2 ** 40)).filter(lambda t: t[0] < t[1] or t[1] > 0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(channel, min_size=1, max_size=4), st.integers(1, 12), st.randoms(use_true_random=False),
       st.sampled_from(["random", "lo", "hi", "mixed"]))
def test_property_pack_sum_compress_unpack(bounds, n, rnd, mode):
    lo = [b[0] for b in bounds]
    hi = [b[1] for b in bounds]
    lay = SlotLayout.for_channels(lo, hi, n)
    k = lay.values_per_ciphertext(KH.public.usable_bits)
    rows = np.empty((n, len(bounds)), dtype=object)
    for i in range(n):
        for c, (a, b) in enumerate(bounds):
            rows[i, c] = {"random": rnd.randint(a, b), "lo": a, "hi": b,
                          "mixed": a if (i + c) % 2 else b}[mode]
    subsets = [list(range(n))] + [[i for i in range(n) if rnd.random() < 0.5] for _ in range(min(k + 1, 6))]
    _roundtrip(lay, rows, subsets, min(k, 4))


def test_boundary_capacity_full_ciphertext():
    """n at the layout's capacity, every value at its extreme, a ciphertext filled to k values."""
    n = 64
    lay = SlotLayout.for_channels([-(1 << 20), 0, 0], [1 << 20, 1 << 18, 1], n)
    k = lay.values_per_ciphertext(KH.public.usable_bits)
    assert k * lay.total_width <= KH.public.usable_bits < (k + 1) * lay.total_width
    rows_lo = np.array([[-(1 << 20), 0, 0]] * n, dtype=object)
    rows_hi = np.array([[1 << 20, 1 << 18, 1]] * n, dtype=object)
    for rows in (rows_lo, rows_hi):
        rnd = random.Random(0)
        subsets = [list(range(n))] * (k - 1) + [[i for i in range(n) if rnd.random() < 0.3]]
        _roundtrip(lay, rows, subsets, k)


def test_units_split_a_row_that_does_not_fit_one_plaintext():
    from treeflare.crypto.packing import pack_plan, unpack_fields

    lay = SlotLayout.for_channels([-(1 << 53), 0] * 5, [1 << 53, 1 << 51] * 5, 10_000)   # softmax, 5 classes
    assert lay.units(2046) == [(0, 10)]                          # 5 x 133 bits fit one 2048-bit plaintext
    u = lay.units(510)                                            # a 512-bit key: 3 channels per plaintext
    assert u == [(0, 7), (7, 10)] and all(sum(lay.widths[a:b]) <= 510 for a, b in u)   # 68 + 65 bits per class
    assert lay.units(2046, packing=False) == [(c, c + 1) for c in range(10)]
    with pytest.raises(SlotOverflowError):
        lay.units(60)                                             # one channel wider than the key
    widths = [sum(lay.widths[a:b]) for a, b in u]
    plan = pack_plan(7, widths, 510)
    assert [f for ct in plan for f in ct] == [(i, j) for i in range(7) for j in range(2)]   # every field once, in order
    assert all(sum(widths[j] for _i, j in ct) <= 510 for ct in plan)
    assert len(pack_plan(7, widths, 510, compress=False)) == 14
    lay = SlotLayout.for_channels([-(1 << 53), 0] * 10, [1 << 53, 1 << 51] * 10, 10_000)   # 10 classes: 2 plaintexts
    assert len(lay.units(KH.public.usable_bits)) == 2
    # pack -> encrypt -> sum -> compress by plan -> decrypt -> unpack_fields
    rng = np.random.default_rng(0)
    rows = np.array([[int(rng.integers(-(1 << 53), 1 << 53)) if c % 2 == 0 else int(rng.integers(0, 1 << 51))
                      for c in range(20)] for _ in range(6)], dtype=object)
    kh = KH
    pub = kh.public
    cts = [[kh.encrypt_many(lay.unit_layout(a, b).pack_rows(rows[:, a:b]))[i] for a, b in lay.units(pub.usable_bits)]
           for i in range(6)]
    total = [pub.one() for _ in cts[0]]
    for row in cts:
        total = [pub.add(t, c) for t, c in zip(total, row)]
    units = lay.units(pub.usable_bits)
    uw = [sum(lay.widths[a:b]) for a, b in units]
    got = [None] * len(units)
    for ct in pack_plan(1, uw, pub.usable_bits):
        acc = total[ct[-1][1]]
        for (_i, j) in reversed(ct[:-1]):
            acc = pub.add(pub.shift(acc, uw[j]), total[j])
        ws = [w for _i, j in ct for w in lay.widths[units[j][0]:units[j][1]]]
        ss = [s for _i, j in ct for s in lay.signed[units[j][0]:units[j][1]]]
        vals = unpack_fields(kh.decrypt_many([acc])[0], ws, ss)
        k = 0
        for _i, j in ct:
            a, b = units[j]
            got[j] = vals[k:k + b - a]
            k += b - a
    assert [v for g in got for v in g] == [sum(int(rows[i, c]) for i in range(6)) for c in range(20)]


def test_layout_message_roundtrip_with_bounds_beyond_64_bits():
    lay = SlotLayout.for_channels([-(1 << 120), 1 << 53], [1 << 119, 1 << 53], 1000)
    msg = lay.to_message()
    assert all(isinstance(v, str) for v in msg["lo"] + msg["hi"])
    assert SlotLayout.from_message(msg) == lay
    for bad in ({**msg, "lo": [1.5, 0]}, {**msg, "hi": [True, 1]}, {**msg, "widths": [1, 1]}):
        with pytest.raises((ValueError, SlotOverflowError)):
            SlotLayout.from_message(bad)


def test_node_widths_narrow_the_top_channel_of_each_unit_and_still_decode_extremes():
    """A node of r rows returns fields as wide as sums over r rows need: only each unit's last channel narrows
    (the others sit at the offsets the rows were encrypted with).  Sums of r extreme rows (every g at its lowest
    or highest, every h at its highest) still decode exactly after compression with the narrowed widths, and
    the FATE shape's deep nodes fit five fields per 2046-bit plaintext instead of four."""
    from treeflare.crypto.packing import pack_plan, unpack_fields

    p, n = 53, 100_000
    lay = SlotLayout.for_channels([-(1 << p), 0], [1 << p, 1 << (p - 2)], n)
    units = lay.units(2046)
    assert lay.node_widths(units, n) == lay.widths == (71, 68)
    assert lay.node_widths(units, 5000) == (71, 64)            # bitlen(5000 * 2^51) = 64
    assert lay.node_widths(units, 10 ** 9) == lay.widths        # never wider than the layout's
    assert len(pack_plan(100, [sum(lay.node_widths(units, 6000))], 681)) == 20       # 135-bit fields: 5 per OU ct
    assert len(pack_plan(100, [sum(lay.widths)], 681)) == 25                          # 139-bit: 4
    # packing off: every channel its own unit, every one narrows (the signed one keeps its sign bit)
    solo = lay.units(2046, packing=False)
    assert lay.node_widths(solo, 5000) == (67, 64)             # bitlen(5000 * 2^53) + 1
    # decode at the extremes: r rows, three subsets, compressed three per ciphertext with the node's widths
    small = SlotLayout.for_channels([-(1 << 20), 0, 0], [1 << 20, 1 << 18, 1], 4096)
    su = [(0, 2), (2, 3)]                          # two units: (g, h) and a count
    r = 37
    w = small.node_widths(su, r)
    assert w == (small.widths[0], (r << 18).bit_length(), r.bit_length())
    uw = [sum(w[a:b]) for a, b in su]
    pub = KH.public
    for g in (-(1 << 20), 1 << 20):
        rows = np.array([[g, 1 << 18, 1]] * r, dtype=object)
        cts = [[KH.encrypt_many(small.unit_layout(a, b).pack_rows(rows[:, a:b]))[i] for a, b in su] for i in range(r)]
        subsets = [list(range(r)), list(range(0, r, 2)), list(range(r - 1))]
        sums = []
        for sub in subsets:
            tot = [pub.one(), pub.one()]
            for i in sub:
                tot = [pub.add(t, c) for t, c in zip(tot, cts[i])]
            sums.append(tot)
        got = [[None, None, None] for _ in subsets]
        for ct in pack_plan(len(subsets), uw, pub.usable_bits):
            i0, u0 = ct[-1]
            acc = sums[i0][u0]
            for i, u in reversed(ct[:-1]):
                acc = pub.add(pub.shift(acc, uw[u]), sums[i][u])
            vals = unpack_fields(KH.decrypt_many([acc])[0], [x for _i, u in ct for x in w[su[u][0]:su[u][1]]],
                                 [x for _i, u in ct for x in small.signed[su[u][0]:su[u][1]]])
            k = 0
            for i, u in ct:
                a, b = su[u]
                got[i][a:b] = vals[k:k + b - a]
                k += b - a
        assert got == [[g * len(s), len(s) << 18, len(s)] for s in subsets]
