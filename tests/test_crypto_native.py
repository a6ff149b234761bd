"""The optional C kernel (treeflare.crypto.native: fixed-base products, packing, segment products, secret
powers) gives exactly the integers of the gmpy2 arithmetic, and the package falls back to that arithmetic
whenever the kernel is not usable."""
import functools
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from gmpy2 import mpz

from treeflare.crypto import native
from treeflare.crypto.paillier import PaillierPrivateKey, _fixed_base_pow, _fixed_base_table

REPO = Path(__file__).resolve().parents[1]
ON_THIS_MACHINE = native.status().startswith("on")
needs_kernel = pytest.mark.skipif(not ON_THIS_MACHINE, reason=f"C kernel not usable here: {native.status()}")


def _table(bits: int, exp_bits: int):
    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)          # any odd modulus (Montgomery needs odd)
    base = mpz(secrets.randbelow(int(m) - 2) + 2)
    return _fixed_base_table(base, m, exp_bits), m


@needs_kernel
@pytest.mark.parametrize("bits,exp_bits", [(2048, 1024), (2047, 1024), (3072, 256), (4096, 2048), (4096, 256),
                                           (520, 256)])
def test_kernel_equals_python_product(bits, exp_bits):
    tabs, m = _table(bits, exp_bits)
    nat = native.fixed_base(tabs, m, lambda e: _fixed_base_pow(tabs, e, m))
    assert nat is not None
    top = (1 << (8 * len(tabs))) - 1
    # edge digits (all 0, all 255, one digit set) and random exponents, a count that is not a multiple of 8 lanes
    exps = [0, top, 1, 255, 1 << (8 * len(tabs) - 1)] + [secrets.randbits(8 * len(tabs)) for _ in range(38)]
    assert nat.pow_many(exps) == [_fixed_base_pow(tabs, e, m) for e in exps]
    assert nat.pow_many([]) == []


@needs_kernel
def test_kernel_that_disagrees_is_not_used(monkeypatch):
    tabs, m = _table(1024, 512)
    monkeypatch.setattr(native, "_STATUS", native._STATUS)
    assert native.fixed_base(tabs, m, lambda e: _fixed_base_pow(tabs, e, m) + 1) is None
    assert "disagreed" in native.status()


@pytest.mark.parametrize("obfuscation", ["full", "djn"])
def test_batch_encryption_decrypts_and_is_fresh(obfuscation):
    key = PaillierPrivateKey.generate(512, obfuscation)
    vals = [0, 1, -1, 2**100, -(2**200)] + list(range(60))
    cts = key.encrypt_many(vals)
    assert [key.decrypt(c) for c in cts] == vals
    assert len(set(cts)) == len(cts)
    assert len(set(key.encrypt_many([7] * 50))) == 50                 # fresh randomness for every ciphertext
    assert bool(key._native_tables()) == ON_THIS_MACHINE


def _status_in_subprocess(env_extra: dict) -> str:
    env = {**os.environ, **env_extra}
    code = ("from treeflare.crypto import native; from treeflare.crypto.paillier import PaillierPrivateKey as K; "
            "k = K.generate(256, 'full'); cs = k.encrypt_many(range(20)); "
            "assert [k.decrypt(c) for c in cs] == list(range(20)); print(native.status())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=REPO / "custom")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_switched_off_falls_back_to_python():
    assert _status_in_subprocess({"TREEFLARE_NATIVE": "0"}) == "off (TREEFLARE_NATIVE=0)"


def test_shared_cache_folder_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)                               # others could replace the library in it
    st = _status_in_subprocess({"TREEFLARE_NATIVE_CACHE": str(shared)})
    assert st.startswith("off") and "not private" in st
    assert not list(shared.iterdir())


def test_no_compiler_falls_back(tmp_path):
    st = _status_in_subprocess({"CC": str(tmp_path / "no-such-cc"), "TREEFLARE_NATIVE_CACHE": str(tmp_path / "c")})
    assert st.startswith("off")


def _python_horner(group, widths, m):
    acc = mpz(group[-1])
    for c, w in zip(reversed(group[:-1]), reversed(widths[:-1])):
        acc = pow(acc, 1 << w, m) * c % m                  # shift the packed fields up, add the next one
    return acc


@needs_kernel
@pytest.mark.parametrize("bits", [1024, 4095, 4096, 6144, 8192])
def test_kernel_packing_equals_python(bits):
    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    nat = native.products(m)
    assert nat is not None
    for widths in ([135] * 15, [17] * 24, [1, 2, 300], [64]):
        groups = [[secrets.randbelow(int(m)) for _ in widths] for _ in range(13)]      # 13: one full set of lanes + 5
        assert nat.horner_many(groups, widths) == [_python_horner(g, widths, m) for g in groups]
    with pytest.raises(ValueError, match="one value per width"):
        nat.horner_many([[1, 2]], [3, 4, 5])


@needs_kernel
def test_kernel_refuses_moduli_beyond_its_size():
    m = mpz((1 << 8400) + 1)
    assert native.products(m) is None


@needs_kernel
@pytest.mark.parametrize("bits", [1024, 4096, 8192])
def test_kernel_segment_products_equal_gmpy2(bits):
    import numpy as np

    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    nat = native.products(m)
    assert nat is not None
    rng = np.random.default_rng(bits)
    vals = [mpz(secrets.randbelow(int(m))) for _ in range(300)]
    table = nat.load(vals)
    lens = rng.integers(1, 40, size=37)                  # many lengths, so lanes finish at different times
    idx = rng.integers(0, len(vals), size=int(lens.sum())).astype(np.int32)
    starts = np.r_[0, np.cumsum(lens)].astype(np.int64)
    want = []
    for a, b in zip(starts[:-1], starts[1:]):
        acc = mpz(1)
        for i in idx[a:b]:
            acc = acc * vals[int(i)] % m
        want.append(acc)
    cells = nat.segment_products(table, idx, starts)
    assert nat.values(cells) == want
    # products of products stay in the kernel's form (cells -> bins)
    assert nat.values(nat.segment_products(cells, np.arange(len(want)), [0, len(want)])) == [
        functools.reduce(lambda x, y: x * y % m, want)]
    for bad_idx, bad_starts in (([len(vals)], [0, 1]), ([0, 1], [0, 0, 2]), ([-1], [0, 1])):
        with pytest.raises(ValueError, match="refused"):
            nat.segment_products(table, bad_idx, bad_starts)
    # segment bounds outside the index list are refused before the C code reads anything
    for bad_starts in ([-50_000_000, 2], [0, 50_000_000], [1, 2], [[0, 2]]):
        with pytest.raises(ValueError, match="segment starts"):
            nat.segment_products(table, [0, 1], bad_starts)


@needs_kernel
def test_kernel_refuses_values_and_widths_it_cannot_take():
    m = mpz(secrets.randbits(1024) | (1 << 1023) | 1)
    nat = native.products(m)
    for bad in ([2 * m, 1], [-1, 1], [1 << 2000, 1]):
        with pytest.raises(ValueError, match="outside"):
            nat.horner_many([bad], [64, 64])
    for widths in ([-1, 64], [2**64, 64]):
        with pytest.raises(ValueError, match="widths"):
            nat.horner_many([[1, 2]], widths)


@pytest.mark.parametrize("obfuscation", ["full", "djn"])
def test_batch_decryption_equals_one_by_one(obfuscation):
    key = PaillierPrivateKey.generate(512, obfuscation)
    vals = [0, 1, -1, 2**200, -(2**250)] + [secrets.randbits(300) - 2**299 for _ in range(30)]
    cts = key.encrypt_many(vals)
    assert key.decrypt_many(cts) == [key.decrypt(c) for c in cts] == vals
    assert bool(key._native_pow()) == ON_THIS_MACHINE
    with pytest.raises(ValueError):
        key.decrypt_many(cts[:3] + [key.public.nsq + 5])


@needs_kernel
@pytest.mark.parametrize("bits", [1024, 2048, 4096])
def test_kernel_secret_powers_equal_powmod_sec(bits):
    import gmpy2

    m = mpz(secrets.randbits(bits) | (1 << (bits - 1)) | 1)
    for e in (mpz(1), mpz(16), mpz(secrets.randbits(bits // 2) | 1), m - 1):
        nat = native.pow_sec(m, e)
        assert nat is not None
        xs = [mpz(secrets.randbelow(int(m))) for _ in range(11)] + [mpz(0), mpz(1)]
        assert nat.pow_many(xs) == [gmpy2.powmod_sec(x, e, m) for x in xs]
