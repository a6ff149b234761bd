"""Paillier on gmpy2 (and the mock oracle backend): correctness, fresh randomness, validation."""
from __future__ import annotations

import gmpy2
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from treeflare.crypto import (CiphertextError, MockKeyHolder, PaillierKeyHolder, PaillierPrivateKey,
                              make_key_holder, public_from_message, security_bits)

BITS = 512  # test-only key size (insecure; the job refuses < 2048 unless told otherwise)


@pytest.fixture(scope="module", params=["full", "djn"])
def kh(request):
    return PaillierKeyHolder.generate(BITS, request.param)


def test_keygen_shape():
    k = PaillierPrivateKey.generate(BITS)
    assert k.public.n.bit_length() == BITS
    assert k.p.bit_length() == k.q.bit_length() == BITS // 2
    assert gmpy2.gcd(k.public.n, (k.p - 1) * (k.q - 1)) == 1
    assert k.public.usable_bits == BITS - 2 and k.public.ct_bytes == 2 * BITS // 8
    assert security_bits(2048) == 112 and security_bits(3072) == 128


@pytest.mark.parametrize("bits", [128, 1024])
def test_safe_prime_sieve_strikes_exactly_the_candidates_with_a_small_factor(bits):
    """Key generation's sieve: k is struck out iff q = q0 + 2k or 2q + 1 has an odd factor below 2^16 (checked
    with gcds against the product of those primes); the safe primes it yields are safe primes of the size asked."""
    import secrets

    from treeflare.crypto.paillier import _SIEVE_PRIMES, _safe_prime, _sieve_window

    small = 1
    for sp in _SIEVE_PRIMES.tolist():
        small *= sp
    q0 = gmpy2.mpz(secrets.randbits(bits - 1) | (3 << (bits - 3)) | 1)
    alive = _sieve_window(q0, 3000)
    want = [gmpy2.gcd(q0 + 2 * k, small) == 1 and gmpy2.gcd(2 * (q0 + 2 * k) + 1, small) == 1 for k in range(3000)]
    assert alive.tolist() == want and 0 < alive.sum() < 100
    p = _safe_prime(bits)
    assert p.bit_length() == bits and gmpy2.is_prime(p, 50) and gmpy2.is_prime((p - 1) // 2, 50)


def test_full_randomness_is_an_nth_residue_from_a_certified_generator():
    k = PaillierPrivateKey.generate(BITS, "full")
    assert k._gen_tabs is not None                       # safe primes -> generator tables
    for pr, sq in ((k.p, k.psq), (k.q, k.qsq)):
        assert gmpy2.is_prime((pr - 1) // 2)
        g = k._gen_tabs[0 if pr == k.p else 1][0][1]     # the generator itself
        assert gmpy2.powmod(g, pr - 1, sq) == 1          # in the order-(p-1) subgroup
        assert gmpy2.powmod(g, (pr - 1) // 2, sq) != 1 and gmpy2.powmod(g, 2, sq) != 1   # of order exactly p-1
    rp, rq = k.obfuscator()
    assert gmpy2.powmod(rp, k.p - 1, k.psq) == 1 and gmpy2.powmod(rq, k.q - 1, k.qsq) == 1
    # keys from ordinary (non-safe) primes still work, through the y^p fallback
    from treeflare.crypto.paillier import _random_prime
    while True:
        p, q = _random_prime(BITS // 2), _random_prime(BITS // 2)
        if p != q and gmpy2.gcd(p * q, (p - 1) * (q - 1)) == 1:
            break
    k2 = PaillierPrivateKey(p, q)
    assert k2.decrypt(k2.encrypt(-5)) == -5 and k2.decrypt(k2.encrypt(7)) == 7


def test_roundtrip_and_homomorphism(kh):
    vals = [0, 1, -1, 12345, -(2 ** 200), 2 ** (BITS - 3) - 1, -(2 ** (BITS - 3))]
    cts = kh.encrypt_many(vals)
    assert kh.decrypt_many(cts) == vals
    pub = public_from_message(kh.public.to_message())
    s = pub.one()
    for c in cts[:4]:
        s = pub.add(s, c)
    assert kh.decrypt_many([s]) == [sum(vals[:4])]
    assert kh.decrypt_many([pub.shift(cts[3], 77)]) == [vals[3] << 77]


def test_fresh_randomness(kh):
    """Same plaintext twice -> different ciphertexts, and c1/c2 does not reveal 1 + 0*n."""
    c1, c2 = kh.encrypt_many([42, 42])
    assert c1 != c2
    pub = kh.public
    q = c1 * gmpy2.invert(c2, pub.nsq) % pub.nsq
    assert q != 1


def test_parallel_encrypt_decrypt_matches_serial(kh):
    vals = list(range(-150, 150))
    cts = kh.encrypt_many(vals, workers=2)
    assert len(cts) == len(vals)
    assert kh.decrypt_many(cts, workers=2) == vals


def test_serialization_and_validation(kh):
    pub = public_from_message(kh.public.to_message())
    cts = kh.encrypt_many([5, -7, 9])
    arr = pub.serialize(cts)
    assert arr.dtype == np.uint8 and arr.size == 3 * pub.ct_bytes
    assert pub.deserialize(arr, 3) == cts
    w = pub.ct_bytes
    for bad in (0, int(pub.nsq), int(pub.nsq) + 5, int(kh.key.p) * 3):
        raw = np.frombuffer(int(bad % (1 << (8 * w))).to_bytes(w, "big"), dtype=np.uint8).copy()
        with pytest.raises(CiphertextError):
            pub.deserialize(raw, 1)
    with pytest.raises(CiphertextError):
        pub.deserialize(arr[:-1])                   # not a multiple of the width
    with pytest.raises(CiphertextError):
        pub.deserialize(arr, 4)                     # wrong count
    with pytest.raises(CiphertextError):
        pub.deserialize(arr.astype(np.int16))       # wrong dtype
    with pytest.raises(CiphertextError):
        public_from_message({"scheme": "paillier", "n": b"\x01"})


def test_mock_backend_same_capacity():
    m = MockKeyHolder(2048)
    assert m.public.usable_bits == 2046 and m.public.ct_bytes == 512
    cts = m.encrypt_many([3, -4])
    pub = public_from_message(m.public.to_message())
    assert pub.deserialize(pub.serialize(cts), 2) == cts
    assert m.decrypt_many([pub.add(pub.shift(cts[0], 10), cts[1])]) == [3 * 1024 - 4]
    with pytest.raises(ValueError):
        make_key_holder("rot13", 2048)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=-(2 ** 240), max_value=2 ** 240), min_size=1, max_size=6))
def test_property_sum_of_random_values(vals):
    kh = _KH
    pub = kh.public
    cts = kh.encrypt_many(vals)
    s = pub.one()
    for c in cts:
        s = pub.add(s, c)
    assert kh.decrypt_many([s]) == [sum(vals)]


_KH = PaillierKeyHolder.generate(BITS, "djn")


def test_batched_checks(kh):
    pub = kh.public.pk
    cts = kh.encrypt_many([3, -4, 5, 0])
    pub.check_many(cts)
    bad = cts[:2] + [int(kh.key.p) * 7] + cts[2:]
    with pytest.raises(CiphertextError, match="not invertible"):
        pub.check_many(bad)
    with pytest.raises(CiphertextError, match="outside"):
        pub.check_many(cts + [0])


def test_worker_pool_reports_errors_and_survives():
    from treeflare.crypto.workers import WorkerError, WorkerPool

    pool = WorkerPool(2, ["treeflare.crypto.backend"])
    try:
        with pytest.raises(WorkerError, match="KeyError"):
            pool.map("enc", [{}, {}], [[b""], [b""]])          # no key loaded yet
        k = PaillierPrivateKey.generate(BITS, "djn")
        pool.map("key", [{"state": k.worker_state()}] * 2)
        from treeflare.crypto.backend import bytes_to_ints, ints_to_bytes
        w = k.public.ct_bytes // 2 + 2
        (_r, (raw,)), _ = pool.map("enc", [{}, {}], [[ints_to_bytes([7, -9], w)], [ints_to_bytes([], w)]])
        (_r, (out,)), _ = pool.map("dec", [{}, {}], [[raw], [b""]])
        assert bytes_to_ints(out, w) == [7, -9]
    finally:
        pool.close()
    with pytest.raises(ValueError, match="treeflare"):
        WorkerPool(1, ["os"])
