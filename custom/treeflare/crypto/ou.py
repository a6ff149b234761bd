"""Okamoto-Uchiyama cryptosystem on gmpy2 (Okamoto & Uchiyama, "A new public-key cryptosystem as secure as
factoring", EUROCRYPT 1998): additively homomorphic, ciphertexts mod n = p^2 q instead of Paillier's n^2.

Public API (same shape as :mod:`.paillier`)::

    key = OuPrivateKey.generate(2048)            # n = p^2 q of 2048 bits: p 683 bits, q 682 bits
    pk = key.public                              # OuPublicKey: n, g, h = g^n mod n
    c = key.encrypt(-5)                          # fresh randomness every call
    s = pk.add(c, key.encrypt(7))                # E(a) * E(b) = E(a + b)
    key.decrypt(s) == 2                          # centred plaintext in (-p/2, p/2]
    pk2 = OuPublicKey.from_message(pk.to_message())   # wire form {"scheme", "n", "g", "h"}: every field checked,
                                                      # h == g^n mod n included
    pk.check(c); pk.check_many([c, ...])         # what a receiver runs on every ciphertext

* Plaintexts live in Z_p (p is secret, ``p_bits = ceil(key_bits / 3)`` is public): ``usable_bits = p_bits - 2``,
  so every packed value M with |M| < 2^usable_bits is below p/2 and the centred decryption returns it exactly.
* Encryption E(m) = g^m h^r mod n with r uniform (the paper's definition; no short-randomness variant, which
  needs p - 1 with a chosen large factor and a further assumption: Coron, Naccache & Paillier, "Accelerating
  Okamoto-Uchiyama's public-key cryptosystem", Electronics Letters 35(4), 1999, as SecretFlow HEU uses).
  The key holder computes it with the CRT: mod p^2 from fixed-base tables of g (g^-1 for a negative m) and
  of h mod p^2 (order dividing p - 1, exponent r mod p - 1); mod q as one fixed-base power of g mod q (h = g^n,
  so g^m h^r = g^(m + n r) and the exponent reduces mod q - 1).  r is drawn uniform in [0, lcm(p-1, q-1)), a
  multiple of h's order, so h^r is exactly uniform over <h>, as r uniform in [0, n) is up to 2^-(p_bits).
* Decryption (mod p^2 only): m = L(c^(p-1) mod p^2) / L(g^(p-1) mod p^2) mod p, L(x) = (x - 1) / p, with
  ``powmod_sec`` (or the C kernel's constant-time power): the exponent p - 1 is secret.
* Security: SECURITY.md ("Okamoto-Uchiyama") gives the key-size reasoning (number field sieve on n, ECM on p)
  and why the same sizes as Paillier's (:data:`~.paillier.SECURE_KEY_SIZES`) are accepted.
"""
from __future__ import annotations

import hashlib
import secrets

import gmpy2
from gmpy2 import mpz

from .paillier import (MAX_KEY_BITS, MIN_TEST_BITS, CiphertextError, _fixed_base_pow, _fixed_base_table,
                       _random_prime, check_key_bits)

SCHEME = "ou"


def p_bits_for(key_bits: int) -> int:
    """The bit length of the secret prime p for an n of ``key_bits`` bits (n = p^2 q, q the remaining bits)."""
    return (int(key_bits) + 2) // 3


def _to_bytes(v, bits: int) -> bytes:
    return int(v).to_bytes((bits + 7) // 8, "big")


class OuPublicKey:
    """What a non-key-holder holds: n = p^2 q, g, h = g^n mod n.  Homomorphic ops on mpz."""

    scheme = SCHEME

    def __init__(self, n, g, h):
        n, g, h = mpz(n), mpz(g), mpz(h)
        bits = int(n.bit_length())
        if n < 3 or n % 2 == 0:
            raise ValueError("invalid Okamoto-Uchiyama modulus")
        if not MIN_TEST_BITS <= bits <= MAX_KEY_BITS:
            raise ValueError(f"Okamoto-Uchiyama modulus of {bits} bits outside [{MIN_TEST_BITS}, {MAX_KEY_BITS}]")
        if gmpy2.is_square(n) or gmpy2.is_prime(n, 25):
            raise ValueError("Okamoto-Uchiyama modulus is a square or a prime")
        for name, v in (("g", g), ("h", h)):
            if not 1 < v < n:
                raise ValueError(f"Okamoto-Uchiyama {name} outside (1, n)")
            if gmpy2.gcd(v, n) != 1:
                raise ValueError(f"Okamoto-Uchiyama {name} not invertible mod n")
        if g == h:
            raise ValueError("Okamoto-Uchiyama g == h")
        # h must be g^n (one public power checks it): an h that is not an n-th power can carry a plaintext mod p,
        # and h^r would then add r times it to what a party without the key encrypts
        if gmpy2.powmod(g, n, n) != h:
            raise ValueError("Okamoto-Uchiyama h is not g^n mod n")
        self.n, self.g, self.h = n, g, h
        self.bits = bits
        self.p_bits = p_bits_for(bits)
        self.ct_bytes = (bits + 7) // 8
        # any packed value M with |M| < 2^usable_bits is below p/2 (p >= 2^(p_bits - 1)): the centred decryption
        # returns it, and no sum the slot layouts allow can wrap mod p
        self.usable_bits = self.p_bits - 2

    # --- homomorphic operations -------------------------------------------------
    def add(self, a, b):
        """E(a), E(b) -> E(a + b)."""
        return a * b % self.n

    def shift(self, a, w: int):
        """E(m) -> E(m * 2^w)."""
        return gmpy2.powmod(a, mpz(1) << w, self.n)

    def one(self):
        """Neutral element for the homomorphic sum (a trivial encryption of 0)."""
        return mpz(1)

    def encrypt(self, m: int):
        """E(m) with the public key alone (r uniform in [0, n)): for a party that is not the key holder.
        m must satisfy 0 <= m < 2^usable_bits (the sender does not know p)."""
        m = int(m)
        if not 0 <= m < (1 << self.usable_bits):
            raise ValueError("plaintext outside [0, 2^usable_bits)")
        r = mpz(secrets.randbelow(int(self.n)))
        return gmpy2.powmod(self.g, m, self.n) * gmpy2.powmod(self.h, r, self.n) % self.n

    # --- wire format ----------------------------------------------------------------
    def to_message(self) -> dict:
        return {"scheme": self.scheme, "n": _to_bytes(self.n, self.bits), "g": _to_bytes(self.g, self.bits),
                "h": _to_bytes(self.h, self.bits)}

    @classmethod
    def from_message(cls, msg: dict) -> "OuPublicKey":
        """The public key of a received message; every field is checked (types, sizes, ranges: CiphertextError)."""
        if not isinstance(msg, dict) or msg.get("scheme") != cls.scheme:
            raise CiphertextError("public key message malformed")
        if set(msg) != {"scheme", "n", "g", "h"}:
            raise CiphertextError("Okamoto-Uchiyama public key message has unexpected fields")
        nb = msg.get("n")
        if not isinstance(nb, (bytes, bytearray)) or not MIN_TEST_BITS // 8 <= len(nb) <= MAX_KEY_BITS // 8:
            raise CiphertextError(f"public key modulus malformed ({MIN_TEST_BITS // 8} to {MAX_KEY_BITS // 8} bytes)")
        vals = []
        for name in ("g", "h"):
            v = msg.get(name)
            if not isinstance(v, (bytes, bytearray)) or len(v) != len(nb):
                raise CiphertextError(f"public key field {name} malformed (must have the modulus' {len(nb)} bytes)")
            vals.append(int.from_bytes(v, "big"))
        try:
            return cls(int.from_bytes(nb, "big"), *vals)
        except ValueError as e:
            raise CiphertextError(str(e)) from None

    def check(self, c) -> None:
        """Raise CiphertextError unless c is in Z*_n."""
        if not (0 < c < self.n):
            raise CiphertextError("ciphertext outside the Okamoto-Uchiyama range (0, n)")
        if gmpy2.gcd(c, self.n) != 1:
            raise CiphertextError("ciphertext not invertible mod n")

    def check_many(self, cts) -> None:
        """``check`` for many ciphertexts with one gcd: a product mod n is a unit iff every factor is."""
        n = self.n
        acc = mpz(1)
        for c in cts:
            if not (0 < c < n):
                raise CiphertextError("ciphertext outside the Okamoto-Uchiyama range (0, n)")
            acc = acc * c % n
        if gmpy2.gcd(acc, n) != 1:
            for c in cts:
                self.check(c)

    def fingerprint(self) -> str:
        return hashlib.sha256(b"".join(self.to_message()[k] for k in ("n", "g", "h"))).hexdigest()[:16]


class OuPrivateKey:
    """The key holder's key: CRT encryption (fixed-base tables) and decryption mod p^2."""

    def __init__(self, p, q, g):
        p, q, g = mpz(p), mpz(q), mpz(g)
        if p == q:
            raise ValueError("p == q")
        self.p, self.q = p, q
        self.psq = p * p
        n = self.psq * q
        h = gmpy2.powmod(g, n, n)
        self.public = OuPublicKey(n, g, h)
        gp = gmpy2.powmod_sec(g % self.psq, p - 1, self.psq)
        if gp == 1:
            raise ValueError("g^(p-1) = 1 mod p^2: g does not encode plaintexts")
        self.gp_inv = gmpy2.invert((gp - 1) // p, p)        # 1 / L(g^(p-1) mod p^2) mod p
        self.q_inv = gmpy2.invert(q, self.psq)               # CRT: mod p^2 and mod q -> mod n
        self.lam = (p - 1) * (q - 1) // gmpy2.gcd(p - 1, q - 1)
        self.p_bits = int(p.bit_length())
        mb = self.public.usable_bits + 1                       # |m| < 2^(usable_bits + 1) <= p
        g_p, h_p, g_q = g % self.psq, h % self.psq, g % q
        self._tab_g = _fixed_base_table(g_p, self.psq, mb)
        self._tab_ginv = _fixed_base_table(gmpy2.invert(g_p, self.psq), self.psq, mb)
        self._tab_h = _fixed_base_table(h_p, self.psq, self.p_bits)          # exponents r mod (p - 1)
        self._tab_q = _fixed_base_table(g_q, q, int(q.bit_length()))         # exponents mod (q - 1)
        self._nq = n % (q - 1)
        self.use_native = True      # False: every product in Python (measurements; the same integers either way)
        self._native = {}           # (sign, rows of g) -> the C kernel's table mod p^2, or None
        self._native_q = None       # the C kernel's table mod q ([] without it)
        self._native_dec = None

    @classmethod
    def generate(cls, bits: int = 2048, allow_insecure: bool = True) -> "OuPrivateKey":
        """A fresh key with an n of exactly ``bits`` bits (sizes checked by :func:`~.paillier.check_key_bits`;
        ``allow_insecure=False`` for a size a user chose)."""
        check_key_bits(bits, allow_insecure)
        pb = p_bits_for(bits)
        qb = bits - 2 * pb
        while True:
            p, q = _random_prime(pb), _random_prime(qb)
            n = p * p * q
            if p == q or n.bit_length() != bits or gmpy2.gcd(p, q - 1) != 1:
                continue
            while True:
                g = mpz(secrets.randbelow(int(n) - 2) + 2)
                if gmpy2.gcd(g, n) == 1 and gmpy2.powmod_sec(g, p - 1, p * p) != 1:   # p - 1 is secret
                    break
            if gmpy2.powmod(g, n, n) != g:
                return cls(p, q, g)

    # --- encryption (key holder, CRT) ------------------------------------------------
    def _centred_plain(self, m) -> int:
        p = int(self.p)
        m = int(m) % p
        return m - p if m > p // 2 else m

    def _exponents(self, ms) -> tuple:
        """For each plaintext a fresh r uniform in [0, lcm(p - 1, q - 1)) (``secrets.randbelow``, one call each), as
        the two exponents the CRT halves need: r mod (p - 1) for h mod p^2, and m + n r mod (q - 1) for g mod q
        (g^m h^r = g^(m + n r), and g mod q is a unit)."""
        lam, pm1, qm1, nq = int(self.lam), self.p - 1, self.q - 1, self._nq
        eps, eqs = [], []
        for m in ms:
            r = mpz(secrets.randbelow(lam))
            eps.append(r % pm1)
            eqs.append((m + nq * r) % qm1)
        return eps, eqs

    def _combine(self, cp, cq):
        return cq + self.q * ((cp - cq) * self.q_inv % self.psq)

    def encrypt(self, m: int):
        """E(m) with fresh randomness; m is taken mod p (a negative m encrypts p - |m|)."""
        return self.encrypt_many([m])[0]

    def encrypt_many(self, values) -> list:
        """[E(m) for m in values], each with its own fresh randomness; the fixed-base products run in the C kernel
        of :mod:`.native` when it is usable (same tables, same exponents, same integers), else in Python."""
        ms = [self._centred_plain(v) for v in values]
        eps, eqs = self._exponents(ms)
        cps = self._powers_p(ms, eps)
        nq = self._native_q_table()
        cqs = nq.pow_many(eqs) if nq else [_fixed_base_pow(self._tab_q, e, self.q) for e in eqs]
        return [self._combine(mpz(a), mpz(b)) for a, b in zip(cps, cqs)]

    def _powers_p(self, ms, eps) -> list:
        """g^m h^ep mod p^2 for every pair (g^-1 and |m| for a negative m)."""
        out = [None] * len(ms)
        for sign in (1, -1):
            idx = [i for i, m in enumerate(ms) if (m >= 0) == (sign > 0)]
            if not idx:
                continue
            mags = [abs(ms[i]) for i in idx]
            rows = max(1, max((v.bit_length() + 7) // 8 for v in mags))
            tab_g = self._tab_g if sign > 0 else self._tab_ginv
            nat = self._native_p(sign, rows, tab_g)
            if nat:
                shift = 8 * rows
                res = nat.pow_many([v | (int(eps[i]) << shift) for v, i in zip(mags, idx)])
            else:
                res = [_fixed_base_pow(tab_g, v, self.psq) * _fixed_base_pow(self._tab_h, eps[i], self.psq)
                       % self.psq for v, i in zip(mags, idx)]
            for i, c in zip(idx, res):
                out[i] = c
        return out

    def _native_p(self, sign, rows, tab_g):
        """The C kernel's table for g^(|m|, ``rows`` bytes) h^ep mod p^2 in one product (rows of g, then of h)."""
        key = (sign, rows)
        if not self.use_native:
            return None
        if key not in self._native:
            from .native import fixed_base

            if len(self._native) >= 8:          # a few widths per run; never grow without bound
                self._native.clear()
            tables = tab_g[:rows] + self._tab_h
            self._native[key] = fixed_base(tables, self.psq, lambda e: _fixed_base_pow(tables, e, self.psq))
        return self._native[key]

    def _native_q_table(self):
        if not self.use_native:
            return []
        if self._native_q is None:
            from .native import fixed_base

            nat = fixed_base(self._tab_q, self.q, lambda e: _fixed_base_pow(self._tab_q, e, self.q))
            self._native_q = nat if nat else []
        return self._native_q

    # --- decryption ---------------------------------------------------------------------
    def _from_power(self, a) -> int:
        """The plaintext in [0, p) from c^(p-1) mod p^2."""
        return int((a - 1) // self.p * self.gp_inv % self.p)

    def _centred(self, m: int) -> int:
        p = int(self.p)
        return m - p if m > p // 2 else m

    def decrypt_raw(self, c) -> int:
        """Plaintext in [0, p)."""
        return self._from_power(gmpy2.powmod_sec(mpz(c) % self.psq, self.p - 1, self.psq))

    def decrypt(self, c) -> int:
        """Centred plaintext in (-p/2, p/2] (checks that c is a valid ciphertext first)."""
        self.public.check(c)
        return self._centred(self.decrypt_raw(c))

    def decrypt_many(self, cts) -> list:
        """[decrypt(c) for c in cts]; the exponentiations run in the C kernel when usable (constant-time in the
        secret exponent, like ``powmod_sec``)."""
        cts = [mpz(c) for c in cts]
        if not cts:
            return []
        nat = self._native_pow()
        if not nat:
            return [self.decrypt(c) for c in cts]
        self.public.check_many(cts)
        return [self._centred(self._from_power(a)) for a in nat.pow_many([c % self.psq for c in cts])]

    def _native_pow(self):
        if not self.use_native:
            return []
        if self._native_dec is None:
            from .native import pow_sec

            nat = pow_sec(self.psq, self.p - 1)
            self._native_dec = nat if nat else []
        return self._native_dec

    # --- the key holder's own worker processes -------------------------------------------
    def worker_state(self) -> dict:
        """What the key holder's own worker processes need to rebuild this key (never sent to another party)."""
        return {"scheme": SCHEME, "p": int(self.p), "q": int(self.q), "g": int(self.public.g)}

    @classmethod
    def from_worker_state(cls, st: dict) -> "OuPrivateKey":
        return cls(st["p"], st["q"], st["g"])
