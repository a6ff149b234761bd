"""Okamoto-Uchiyama (treeflare.crypto.ou): exact arithmetic, key sizes, strict checks of everything a party
receives, and the vertical protocol with ``scheme="ou"`` identical to the plaintext oracle and to Paillier's."""
from __future__ import annotations

import importlib

import secrets
from dataclasses import replace

import gmpy2
import numpy as np
import pytest

from treeflare.crypto import (CiphertextError, SlotLayout, make_key_holder, pack_plan, public_from_message,
                              unpack_fields)
from treeflare.crypto.backend import OuKeyHolder, OuPublic, micro_rates, public_from_json, public_to_json
from treeflare.crypto.ou import OuPrivateKey, OuPublicKey, p_bits_for
from treeflare.vertical import (ProtocolError, VerticalParams, close_parties, compare_runs, crypto_report,
                                make_parties, run_oracle, run_vertical, synthetic)

KEY = OuPrivateKey.generate(768)          # test-only size (allowed only with allow_insecure)


def _python_only(key: OuPrivateKey) -> OuPrivateKey:
    """The same key with the C kernel kept out (every table lookup in Python)."""
    k = OuPrivateKey.from_worker_state(key.worker_state())
    k.use_native = False
    return k


# ---------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize("bits", [512, 768, 2048])
def test_roundtrip_signed_values_and_homomorphism(bits):
    key = KEY if bits == 768 else OuPrivateKey.generate(bits)
    pk = key.public
    assert pk.bits == bits and pk.p_bits == p_bits_for(bits) == key.p.bit_length()
    assert (1 << pk.usable_bits) < key.p // 2                    # every packed value decodes centred
    top = (1 << pk.usable_bits) - 1
    vals = [0, 1, -1, 7, -7, top, -top] + [secrets.randbits(140) - (1 << 139) for _ in range(40)]
    for k in (key, _python_only(key)):
        cts = k.encrypt_many(vals)
        assert k.decrypt_many(cts) == vals
        assert [key.decrypt(c) for c in cts] == vals           # the other path decrypts the same
        assert len(set(cts)) == len(cts)                        # fresh randomness every time
    a, b = key.encrypt(123456), key.encrypt(-123457)
    assert key.decrypt(pk.add(a, b)) == -1
    assert key.decrypt(pk.shift(key.encrypt(-5), 100)) == -5 << 100
    assert key.decrypt(pk.add(a, pk.one())) == 123456
    # a sum of many values at the per-row bound stays exact (no wrap mod p)
    row = (1 << (pk.usable_bits - 8)) - 1
    acc = pk.one()
    for c in key.encrypt_many([row] * 200):
        acc = pk.add(acc, c)
    assert key.decrypt(acc) == 200 * row
    # a party without the private key encrypts with the public key alone; its range is enforced
    assert key.decrypt(pk.encrypt(99)) == 99
    with pytest.raises(ValueError, match="outside"):
        pk.encrypt(-1)
    with pytest.raises(ValueError, match="outside"):
        pk.encrypt(1 << pk.usable_bits)


def test_values_are_taken_mod_p_like_paillier_takes_them_mod_n():
    p = int(KEY.p)
    c = KEY.encrypt_many([p + 5, -p - 5, 2 * p])
    assert KEY.decrypt_many(c) == [5, -5, 0]


def test_worker_state_rebuilds_the_same_key_and_json_public_round_trips():
    k2 = OuPrivateKey.from_worker_state(KEY.worker_state())
    assert (k2.p, k2.q, k2.public.n, k2.public.h) == (KEY.p, KEY.q, KEY.public.n, KEY.public.h)
    assert KEY.worker_state()["scheme"] == "ou"
    pub = OuPublic(KEY.public)
    back = public_from_json(public_to_json(pub))
    assert (back.scheme, back.modulus, back.usable_bits, back.ct_bytes) == ("ou", KEY.public.n, pub.usable_bits,
                                                                            pub.ct_bytes)
    assert pub.ct_bytes == (KEY.public.bits + 7) // 8                # half of Paillier's n^2 at the same n


def test_key_holder_pool_same_plaintexts_as_in_process():
    kh = OuKeyHolder(KEY)
    try:
        vals = [secrets.randbits(200) - (1 << 199) for _ in range(300)]
        raw = kh.encrypt_bytes(vals, workers=2)                       # in the key holder's worker processes
        assert kh.decrypt_bytes(raw, workers=1) == vals
        assert kh.decrypt_bytes(kh.encrypt_bytes(vals, workers=1), workers=2) == vals
        assert kh.ops["encryptions"] == 600 and kh.ops["decryptions"] == 600
    finally:
        kh.close()


# ---------------------------------------------------------------------------- key sizes
def test_key_sizes_refused_below_production_unless_insecure_allowed():
    for bits in (1024, 1536, 2047, 2050, 8192):
        with pytest.raises(ValueError, match="key bits"):
            OuPrivateKey.generate(bits, allow_insecure=False)
        with pytest.raises(ValueError, match="key bits"):
            make_key_holder("ou", bits, allow_insecure=False)
    with pytest.raises(ValueError, match="insecure"):
        VerticalParams(scheme="ou", key_bits=1024).validate()
    with pytest.raises(ValueError, match="djn"):
        VerticalParams(scheme="ou", obfuscation="djn").validate()
    kh = make_key_holder("ou", 2048, allow_insecure=False)
    assert kh.public.key_bits == 2048 and kh.public.usable_bits == 681 and kh.public.ct_bytes == 256
    assert kh.key.p.bit_length() == 683 and kh.key.q.bit_length() == 682


# ---------------------------------------------------------------------------- what a receiver checks
def _msg(**kw):
    m = KEY.public.to_message()
    m.update(kw)
    return m


def test_public_key_message_validated_field_by_field():
    pk = OuPublicKey.from_message(KEY.public.to_message())
    assert (pk.n, pk.g, pk.h) == (KEY.public.n, KEY.public.g, KEY.public.h)
    assert public_from_message(KEY.public.to_message()).scheme == "ou"
    n, w = int(KEY.public.n), KEY.public.ct_bytes
    p = int(KEY.p)
    root = gmpy2.isqrt(n)
    odd_root = root if root % 2 else root - 1
    be = lambda v, width=w: int(v).to_bytes(width, "big")          # noqa: E731
    bad = {
        "modulus malformed": [_msg(n="00"), _msg(n=b"\x01" * 8), _msg(n=b"\x01" * 600)],
        "invalid Okamoto-Uchiyama modulus": [_msg(n=be(n + 1))],
        "square or a prime": [_msg(n=be(gmpy2.next_prime(n))), _msg(n=be(odd_root ** 2))],
        "g outside": [_msg(g=be(0)), _msg(g=be(1)), _msg(g=be(n)), _msg(g=b"\xff" * w)],
        "h outside": [_msg(h=be(1)), _msg(h=be(n + 3))],
        "g not invertible": [_msg(g=be(p))],
        "h not invertible": [_msg(h=be(int(KEY.q) * 5))],
        "g == h": [_msg(h=_msg()["g"])],
        # units mod n, but not g^n: g^(n+1), and an n-th power of another base
        "h is not g": [_msg(h=be(gmpy2.powmod(KEY.public.g, n + 1, n))), _msg(h=be(gmpy2.powmod(3, n, n)))],
        "field g malformed": [_msg(g=b"\x02"), _msg(g=12345)],
        "field h malformed": [_msg(h=None)],
        "unexpected fields": [_msg(extra=1), {"scheme": "ou", "n": be(n), "g": be(3)}],
        "message malformed": [{"scheme": "paillier-ou"}, "ou"],
    }
    for match, msgs in bad.items():
        for m in msgs:
            with pytest.raises(CiphertextError, match=match):
                public_from_message(m) if isinstance(m, dict) and m.get("scheme") == "ou" else \
                    OuPublicKey.from_message(m)


def test_every_received_ciphertext_range_checked():
    pub = OuPublic(KEY.public)
    n, p = KEY.public.n, KEY.p
    good = KEY.encrypt_many([1, 2, 3])
    assert pub.deserialize(pub.serialize(good)) == good
    for bad, match in ((0, "outside"), (n, "outside"), (n + 5, "outside"), (p * 7, "not invertible"),
                       (KEY.q, "not invertible")):
        with pytest.raises(CiphertextError, match=match):
            pub.check(gmpy2.mpz(bad))
        with pytest.raises(CiphertextError, match=match):
            pub.check_many(good + [gmpy2.mpz(bad)])
        if bad < 256 ** pub.ct_bytes:
            with pytest.raises(CiphertextError, match=match):
                pub.deserialize(np.frombuffer(int(bad).to_bytes(pub.ct_bytes, "big"), dtype=np.uint8).copy())
    with pytest.raises(CiphertextError, match="multiple"):
        pub.deserialize(np.zeros(pub.ct_bytes + 1, dtype=np.uint8))


# ---------------------------------------------------------------------------- packing capacity
def test_slot_layouts_and_compression_use_ou_capacity():
    kh = OuKeyHolder(KEY)
    pub = kh.public
    # (g, h) channels of 5,000 rows at 20-bit fixed point
    lay = SlotLayout.for_channels(lo=[-(1 << 20), 0], hi=[1 << 20, 1 << 18], n_max=5000)
    units = lay.units(pub.usable_bits)
    assert units == [(0, 2)] and lay.total_width <= pub.usable_bits
    k = pub.usable_bits // lay.total_width
    assert k == (KEY.p.bit_length() - 2) // lay.total_width >= 2
    assert 3 * k <= (768 - 2) // lay.total_width                     # about a third of Paillier's capacity
    plan = pack_plan(10, [lay.total_width], pub.usable_bits)
    assert all(len(ct) <= k for ct in plan) and sum(map(len, plan)) == 10
    # the sums of 5,000 extreme rows, packed k per ciphertext by Horner shifts, decode exactly
    rows = np.array([[-(1 << 20), 1 << 18]] * 4 + [[1 << 20, 0]] * 3, dtype=np.int64)
    cts = kh.encrypt_many(lay.pack_rows(rows))
    totals = []
    for j in range(k):
        s = pub.one()
        for c in cts[: 1 + j % len(cts)]:
            for _ in range(5000 // len(cts)):
                s = pub.add(s, c)
        totals.append(s)
    acc = totals[-1]
    for c in reversed(totals[:-1]):
        acc = pub.add(pub.shift(acc, lay.total_width), c)
    got = lay.unpack(kh.decrypt_many([acc])[0], k)
    want = []
    for j in range(k):
        part = rows[: 1 + j % len(cts)]
        want.append([int(sum(part[:, c])) * (5000 // len(cts)) for c in range(2)])
    assert got == want


# ---------------------------------------------------------------------------- the vertical protocol
def _data_missing_rare(seed: int, n=200, n_test=60, L=2):
    d = synthetic(n=n, n_test=n_test, passive_features=(3, 2), n_classes=L, seed=seed)
    rng = np.random.default_rng(seed)
    for X in (d.X_active, d.X_passive[0], d.X_active_test, d.X_passive_test[0]):
        X[rng.random(len(X)) < 0.15, 0] = np.nan                    # missing values in a column of two parties
    for X, yy in ((d.X_passive[1], d.y), (d.X_passive_test[1], d.y_test)):
        cat = rng.integers(0, 3, size=len(X)).astype(float)         # a categorical column (codes)
        rare = rng.random(len(X)) < 0.03
        cat[rare] = 7.0                                              # a rare category
        X[:, 1] = cat
    return d


def _params(**kw):
    base = dict(key_bits=768, allow_insecure_key=True, workers=1, max_depth=3, bins=8, min_rows_node=4,
                scheme="ou")
    base.update(kw)
    return VerticalParams(**base)


@pytest.mark.parametrize("model,kw", [("gbdt", dict(objective="binary", n_trees=2)),
                                      ("tree", dict(criterion="gini")),
                                      ("gbdt", dict(objective="softmax", n_trees=1))])
def test_ou_model_identical_to_oracle_and_to_paillier(model, kw):
    L = 3 if kw.get("objective") == "softmax" else 2
    d = _data_missing_rare(seed=3 + L, L=L)
    P = _params(model=model, **kw)
    fed = run_vertical(d, P)
    assert crypto_report(fed[0])["scheme"] == "ou"
    assert compare_runs(fed, run_oracle(d, P))["identical"]
    pai = run_vertical(d, replace(P, scheme="paillier", key_bits=512))
    assert compare_runs(fed, pai)["identical"]
    assert fed[0].layout_info["usable_bits"] == p_bits_for(768) - 2
    assert fed[0].trees[0]["nodes"][0]["leaf"] is False


def test_ou_pool_workers_same_model():
    d = _data_missing_rare(seed=9)
    P = _params(model="gbdt", objective="binary", n_trees=1, max_depth=2)
    assert compare_runs(run_vertical(d, P), run_vertical(d, replace(P, workers=2)))["identical"]


def _first_layer(P):
    d = synthetic(n=80, n_test=20, passive_features=(2,), n_classes=2, seed=2)
    a, ps = make_parties(d, P)
    (name, p), = ps.items()
    out = a.step(None)
    return a, p, name, out


def test_passive_refuses_malformed_ou_key_and_out_of_range_ciphertexts():
    P = _params(model="tree", max_depth=2)
    a, p, name, out = _first_layer(P)
    setup = dict(out[name])
    pk = dict(setup["pk"])
    pk["g"] = (0).to_bytes(len(pk["n"]), "big")
    with pytest.raises(ProtocolError, match="bad public key: Okamoto-Uchiyama g outside"):
        p.handle({**setup, "pk": pk})
    pk = dict(setup["pk"])
    pk["n"] = pk["n"][:-1] + bytes([pk["n"][-1] & 0xFE])          # an even modulus
    with pytest.raises(ProtocolError, match="bad public key"):
        p.handle({**setup, "pk": pk})
    pk = dict(setup["pk"])                                          # h = g^n times g: a unit, not g^n
    opk = a.kh.public.pk
    pk["h"] = int(opk.h * opk.g % opk.n).to_bytes(len(pk["n"]), "big")
    with pytest.raises(ProtocolError, match="bad public key: Okamoto-Uchiyama h is not g"):
        p.handle({**setup, "pk": pk})
    # a test-size OU key is refused by a site with the production minimum
    a2, ps2 = make_parties(synthetic(n=50, n_test=10, passive_features=(2,), seed=1), P, min_key_bits=2048)
    (n2, p2), = ps2.items()
    with pytest.raises(ProtocolError, match="minimum"):
        p2.handle(a2.step(None)[n2])
    # the real setup, then gradients with a ciphertext >= n, and one equal to 0
    r = p.handle(out[name])
    out = a.step({name: r})
    msg = dict(out[name])
    g = dict(msg["gradients"])
    w = p.pub.ct_bytes
    assert p.pub.scheme == "ou" and w == (768 + 7) // 8
    cts = g["cts"].copy()
    cts[:w] = 0xFF
    g["cts"] = cts
    msg["gradients"] = g
    with pytest.raises(ProtocolError, match="outside the Okamoto-Uchiyama range"):
        p.handle(msg)
    cts[:w] = 0
    with pytest.raises(ProtocolError, match="outside the Okamoto-Uchiyama range"):
        p.handle(msg)
    # and the active party refuses such a ciphertext in a passive party's reply
    r = p.handle(out[name])
    node = dict(r["nodes"][0])
    bad = node["cts"].copy()
    bad[:w] = 0xFF
    node["cts"] = bad
    with pytest.raises(ProtocolError, match="outside the Okamoto-Uchiyama range"):
        a.step({name: {"type": "hist", "nodes": [node]}})


def test_micro_rates_measures_what_it_names():
    r = micro_rates("ou", 512, n_ops=40, repeats=1)
    assert r["scheme"] == "ou" and r["key_bits"] == 512 and r["bytes_per_ct"] == 64
    for k in ("enc_per_s", "enc_per_s_python", "dec_per_s", "dec_per_s_python", "mul_per_s", "mul_per_s_native"):
        assert k in r
    assert r["enc_per_s_python"] > 0 and r["dec_per_s_python"] > 0 and r["mul_per_s"] > 0


def test_active_refuses_a_reply_that_wraps_mod_p():
    """A passive party that multiplies a returned plaintext by 2^p_bits (one shift, no key needed) makes it wrap
    mod p: the decrypted value is v * (2^p_bits - p) mod p, which the slot decoding or the node's consistency check
    refuses, so the job stops (with a fresh key next time) instead of acting on a value that depends on p."""
    P = _params(model="tree", max_depth=2)
    a, p, name, out = _first_layer(P)
    out = a.step({name: p.handle(out[name])})
    r = p.handle(out[name])
    node = dict(r["nodes"][0])
    pub = p.pub
    cts = pub.deserialize(node["cts"])
    cts[0] = pub.shift(cts[0], pub.pk.p_bits)
    node["cts"] = pub.serialize(cts)
    with pytest.raises(ProtocolError, match="do not decode|inconsistent"):
        a.step({name: {"type": "hist", "nodes": [node]}})


def test_same_plaintext_encryptions_reveal_no_factor():
    """E(m) and E(m) again differ in both CRT components: their ratio minus one shares no factor with n (a
    randomness missing mod q or mod p^2 would hand out q or p^2 by a gcd)."""
    pk = KEY.public
    for k in (KEY, _python_only(KEY)):
        cts = k.encrypt_many([42] * 12 + [-42] * 12)
        for a, b in zip(cts[::2], cts[1::2]):
            ratio = a * gmpy2.invert(b, pk.n) % pk.n
            assert gmpy2.gcd(ratio - 1, pk.n) == 1
    c = pk.encrypt(42)
    assert gmpy2.gcd(c * gmpy2.invert(pk.encrypt(42), pk.n) % pk.n - 1, pk.n) == 1


def test_job_option_scheme_reaches_the_parameters(tmp_path):
    """``--scheme ou`` (default paillier) reaches VerticalParams through the job's own argument checks."""


    job = importlib.import_module("treeflare.jobs.vertical_tree")
    args = job.parse_args(["--scheme", "ou", "--workspace", str(tmp_path / "v")])
    assert job.vertical_params(args).scheme == "ou"
    assert job.vertical_params(job.parse_args(["--workspace", str(tmp_path / "w")])).scheme == "paillier"
    with pytest.raises(SystemExit):
        job.parse_args(["--scheme", "rsa", "--workspace", str(tmp_path / "x")])
    with pytest.raises(job.DataError, match="djn"):
        job.vertical_params(job.parse_args(["--scheme", "ou", "--obfuscation", "djn", "--workspace",
                                            str(tmp_path / "y")]))


def _gbdt_first_replies(seed: int):
    """A binary GBDT run (missing values, a rare category, two passive parties) up to the passives' first
    histogram replies: (active, passives, the replies)."""
    d = _data_missing_rare(seed=seed)
    a, ps = make_parties(d, _params(model="gbdt", objective="binary", n_trees=2, max_depth=2))
    out = a.step(None)
    out = a.step({nm: ps[nm].handle(out[nm]) for nm in out})
    return a, ps, {nm: ps[nm].handle(out[nm]) for nm in out}


def test_active_refuses_a_ciphertext_built_from_scratch_above_p_and_stops_with_a_fresh_key_next_run():
    """A hostile passive party builds g^V h^r from the public key alone, V >= p: the active party decrypts
    V mod p, which depends on p.  V is chosen (here with p known, the attacker's best case) so that every hessian
    field of the decoded vector is an honest one and only one gradient field is out of its node's range: the
    reply is refused, naming the site, nothing is decrypted after it, the run is over, and the next run has
    another key."""
    a, ps, replies = _gbdt_first_replies(seed=11)
    try:
        name = next(iter(replies))
        key, pk = a.kh.key, a.kh.key.public
        node = dict(replies[name]["nodes"][0])
        cts = ps[name].pub.deserialize(node["cts"])
        info = a.layout_info
        wg, wh = info["widths"]
        k = len(pack_plan(len(node["ids"]), info["unit_widths"], pk.usable_bits, True)[0])
        flat = unpack_fields(key.decrypt(cts[0]), [wg, wh] * k, [True, False] * k)
        flat[0] = (1 << (wg - 1)) - 1       # the slot's largest g: above the node's sum of positive gradients
        m = sum(v << (i // 2 * (wg + wh) + (i % 2) * wg) for i, v in enumerate(flat))
        v_big = int(key.p) + m
        assert v_big >= key.p and key.decrypt(gmpy2.powmod(pk.g, v_big, pk.n)) == m
        assert gmpy2.gcd(v_big - m, pk.n) == key.p          # why no decoded value may reach the sender unchecked
        assert unpack_fields(m, [wg, wh] * k, [True, False] * k)[1::2] == flat[1::2]    # the hessians: honest
        cts[0] = gmpy2.powmod(pk.g, v_big, pk.n) * gmpy2.powmod(pk.h, secrets.randbelow(int(pk.n)), pk.n) % pk.n
        node["cts"] = ps[name].pub.serialize(cts)
        hostile = dict(replies, **{name: {**replies[name], "nodes": [node] + replies[name]["nodes"][1:]}})
        before = a.kh.ops["decryptions"]
        with pytest.raises(ProtocolError, match=rf"^{name}: split statistics inconsistent with node 0 \(g_0 "):
            a.step(hostile)
        after = a.kh.ops["decryptions"]
        assert after > before                                # the reply was decrypted once, then refused
        assert a.step(replies) is None and a.step(hostile) is None      # the run is over: nothing more happens
        assert a.kh.ops["decryptions"] == after and not a.trees
        n_refused = pk.n
    finally:
        close_parties(a, ps)
    # the next run generates its own key (and an honest run completes with it)
    a2, ps2 = make_parties(_data_missing_rare(seed=11), _params(model="tree", max_depth=1))
    try:
        setup = a2.step(None)
        assert OuPublicKey.from_message(next(iter(setup.values()))["pk"]).n != n_refused
    finally:
        close_parties(a2, ps2)


def test_every_run_generates_its_own_key():
    d = synthetic(n=60, n_test=10, passive_features=(2,), seed=1)
    P = _params(model="tree", max_depth=1)
    fed1, fed2 = run_vertical(d, P), run_vertical(d, P)
    assert fed1[0].kh.public.modulus != fed2[0].kh.public.modulus
    assert compare_runs(fed1, fed2)["identical"]


def test_channel_ranges_are_the_exact_sums_of_a_nodes_negative_and_positive_values():
    """What the active party checks every decoded field against (any scheme): a gradient channel's left sum lies in
    [sum of the node's negative gradients, sum of its positive ones], a hessian's in [0, the node's]; the bounds
    themselves pass, one past them is refused (exact Python-integer comparisons)."""
    from treeflare.vertical.active import _first_out_of_range

    a, ps, _ = _gbdt_first_replies(seed=12)           # tree 0 encrypted: its channel ranges are set
    try:
        chan, _lo, _hi = a._channels(np.tile(a.objective.base_score(a.y), (a.n, 1)))
        idx = np.flatnonzero(np.arange(a.n) % 3 != 0)
        col = [[int(chan[c][i]) for i in idx] for c in range(len(chan))]
        lows, highs = a._channel_ranges(idx, [sum(v) for v in col])
        assert lows == [sum(min(0, v) for v in vs) for vs in col] and highs == [sum(max(0, v) for v in vs)
                                                                               for vs in col]
        assert lows[0] < 0 < highs[0] and lows[1] == 0 < highs[1]
        assert _first_out_of_range([lows, highs, [sum(v) for v in col]], (lows, highs)) is None
        assert _first_out_of_range([highs, [lows[0], highs[1] + 1]], (lows, highs)) == 1
        assert _first_out_of_range([[lows[0] - 1, 0]], (lows, highs)) == 0
        assert _first_out_of_range([[0, -1]], (lows, highs)) == 1
    finally:
        close_parties(a, ps)
