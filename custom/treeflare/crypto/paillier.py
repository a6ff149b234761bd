"""Paillier cryptosystem on gmpy2 (g = n + 1).

Public API (also used outside the vertical job)::

    key = PaillierPrivateKey.generate(2048)          # the key holder; 2048 (default), 3072 or 4096 bits
    pk = key.public                                  # PaillierPublicKey: what other parties hold
    c = key.encrypt(-5)                              # fresh randomness every call
    s = pk.add(c, key.encrypt(7))                    # E(a) * E(b) = E(a + b)
    key.decrypt(s) == 2                              # centred plaintext in (-n/2, n/2]
    pk2 = PaillierPublicKey.from_message(pk.to_message())   # wire form: {"scheme", "n": bytes}
    pk.check(c); pk.check_many([c, ...])             # what a receiver runs on every ciphertext

* Key generation draws primes from ``secrets`` randomness; key sizes are bounded
  (:data:`MIN_SECURE_BITS` .. :data:`MAX_KEY_BITS`; smaller sizes only for tests).
* Decryption uses the CRT (mod p^2 and q^2) and ``powmod_sec`` (constant-time exponentiation:
  the exponents p - 1 and q - 1 are secret).
* Encryption at the key holder uses the CRT as well, with **fresh randomness for every
  ciphertext** (never an obfuscator pool: reusing r leaks m1 - m2).  ``obfuscator()`` and
  ``encrypt_with()`` split an encryption in two so the expensive half (r^n) can be computed
  ahead of time; each obfuscator must be used exactly once.

Two obfuscation modes for the key holder:

``full`` (default)
    r^n mod n^2 for a uniformly random r, i.e. a uniform element of the n-th residues.  The
    key holder samples its two CRT components directly: mod p^2 the n-th residues are the
    cyclic subgroup of order p - 1.  Keys are generated with safe primes (p = 2p' + 1), so a
    generator g_p of that subgroup is easy to certify, and g_p^e with e uniform in [0, p - 1) has
    exactly the distribution of r^n mod p^2; a fixed-base window table makes that ~128 modular
    multiplications mod p^2 (~5x faster than r^n with CRT).  Keys built from other primes
    fall back to y^p mod p^2 with y uniform (same distribution, |p|-bit exponent).
``djn``
    Damgard-Jurik-Nielsen short exponent: hs^alpha with hs = (-x^2)^n mod n^2 fixed and a
    fresh random alpha of ``DJN_ALPHA_BITS`` bits per ciphertext.  About 4x faster, but it
    rests on an extra (short-exponent / subgroup) assumption, so it is an option, not the
    default.

Only the key holder can encrypt here: the other parties only add ciphertexts and shift them
(``c^(2^W)``, a multiplication of the plaintext by 2^W) for compression.
"""
from __future__ import annotations

import hashlib
import math
import secrets

import gmpy2
import numpy as np
from gmpy2 import mpz

DJN_ALPHA_BITS = 256
_WINDOW = 8
MIN_SECURE_BITS = 2048
MAX_KEY_BITS = 4096          # 4096-bit safe-prime key generation already takes 1-3 minutes (scripts/bench_paillier.py)
SECURE_KEY_SIZES = (2048, 3072, 4096)
MIN_TEST_BITS = 256


class CiphertextError(ValueError):
    """A received ciphertext is malformed (outside Z*_{n^2}, wrong size...)."""


def check_key_bits(bits: int, allow_insecure: bool = False, *, minimum: int | None = None,
                   maximum: int = MAX_KEY_BITS) -> int:
    """The one key-size check of the package (ValueError naming the size and the bound).

    For a key this party generates (no ``minimum``): 2048, 3072 or 4096 bits; with ``allow_insecure`` (tests
    and comparisons only) any even size from 256 to 4096.  For a key another party made (``minimum``, and
    ``maximum``: this site's own bounds): ``minimum <= bits <= maximum``."""
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise ValueError(f"key bits must be an integer, got {bits!r}")
    if minimum is not None:
        if bits < minimum:
            raise ValueError(f"key of {bits} bits is below this site's minimum {minimum}")
        if bits > maximum:
            raise ValueError(f"key of {bits} bits is above this site's maximum {maximum}")
        return bits
    if allow_insecure:
        if not (MIN_TEST_BITS <= bits <= MAX_KEY_BITS) or bits % 2:
            raise ValueError(f"key bits must be even and in [{MIN_TEST_BITS}, {MAX_KEY_BITS}], got {bits}")
        return bits
    if bits not in SECURE_KEY_SIZES:
        hint = (f"; keys under {MIN_SECURE_BITS} bits are insecure (only allowed for tests)"
                if bits < MIN_SECURE_BITS else
                "; larger keys are refused (key generation time grows steeply: 4096 bits already takes minutes)"
                if bits > MAX_KEY_BITS else "")
        raise ValueError(f"key bits must be one of {', '.join(map(str, SECURE_KEY_SIZES))}, got {bits}{hint}")
    return bits


def _random_prime(bits: int) -> mpz:
    while True:
        cand = secrets.randbits(bits) | (3 << (bits - 2)) | 1
        p = gmpy2.next_prime(mpz(cand))
        if p.bit_length() == bits and gmpy2.is_prime(p, 50):
            return p


def _odd_primes_below(limit: int) -> np.ndarray:
    sieve = np.ones(limit, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(limit ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = False
    return np.flatnonzero(sieve)[1:]


_SIEVE_PRIMES = _odd_primes_below(1 << 16)
_SIEVE_SPAN = 1 << 18          # candidates q = q0 + 2k, k < _SIEVE_SPAN, per random start (~3 safe primes expected)


def _sieve_window(q0, span: int) -> np.ndarray:
    """alive[k]: neither q = q0 + 2k nor 2q + 1 has an odd factor below 2^16 (q0 odd and larger than that)."""
    ps = _SIEVE_PRIMES
    inv2 = (ps + 1) // 2                               # 1/2 mod each prime
    r = np.array([int(q0 % int(sp)) for sp in ps], dtype=np.int64)
    k_q = (-r * inv2) % ps                             # q0 + 2k = 0 (mod sp)
    k_p = (-(2 * r + 1) * inv2 % ps * inv2) % ps       # 2(q0 + 2k) + 1 = 0 (mod sp)
    alive = np.ones(span, dtype=bool)
    for sp, a, b in zip(ps.tolist(), k_q.tolist(), k_p.tolist()):
        alive[a::sp] = False
        alive[b::sp] = False
    return alive


def _safe_prime(bits: int) -> mpz:
    """p = 2p' + 1 with p' prime (so a generator of the order-(p-1) subgroup of Z*_{p^2} is easy
    to certify).  From a random odd start q0, every k for which q = q0 + 2k or 2q + 1 has an odd factor
    below 2^16 is struck out at once (:func:`_sieve_window`), leaving about 1 candidate in 150; those get a
    Fermat test of q, then of p, then the 50-round tests (gmpy2.is_prime): the same primes are accepted, and
    about a hundred times fewer candidates cost a big-number operation than with a gcd per candidate."""
    while True:
        q0 = mpz(secrets.randbits(bits - 1) | (3 << (bits - 3)) | 1)
        for k in np.flatnonzero(_sieve_window(q0, _SIEVE_SPAN)).tolist():
            q = q0 + 2 * k
            p = 2 * q + 1
            if p.bit_length() != bits:
                break
            if gmpy2.powmod(2, q - 1, q) == 1 and gmpy2.powmod(2, p - 1, p) == 1 \
                    and gmpy2.is_prime(q, 50) and gmpy2.is_prime(p, 50):
                return p


def _is_safe(p) -> bool:
    return gmpy2.is_prime((p - 1) // 2, 30)


def _fixed_base_table(base, mod, exp_bits):
    """rows[i][d] = base^(d * 2^(w*i)) mod m, for exponents of ``exp_bits`` bits."""
    tables = []
    b = mpz(base)
    for _ in range((exp_bits + _WINDOW - 1) // _WINDOW):
        row = [mpz(1)]
        for _j in range(1, 1 << _WINDOW):
            row.append(row[-1] * b % mod)
        tables.append(row)
        b = row[-1] * b % mod          # b^(2^w)
    return tables


def _fixed_base_pow(tables, e: int, mod):
    # one table lookup per 8-bit digit (the window is 8 bits, so the digits are the bytes of e)
    acc = mpz(1)
    for row, d in zip(tables, int(e).to_bytes(len(tables), "little")):
        if d:
            acc = acc * row[d] % mod
    return acc


class PaillierPublicKey:
    """Public key: what a non-key-holder holds.  Homomorphic ops on ints (mpz)."""

    scheme = "paillier"

    def __init__(self, n: int):
        n = mpz(n)
        if n < 3 or n % 2 == 0:
            raise ValueError("invalid Paillier modulus")
        if n.bit_length() > MAX_KEY_BITS:
            raise ValueError(f"Paillier modulus of {n.bit_length()} bits exceeds {MAX_KEY_BITS}")
        self.n = n
        self.nsq = n * n
        self.bits = int(n.bit_length())
        self.ct_bytes = (int(self.nsq.bit_length()) + 7) // 8
        # usable plaintext bits: any packed value M with |M| < 2**usable_bits is decoded
        # unambiguously by the centred decryption (|M| < n/2)
        self.usable_bits = self.bits - 2

    # --- homomorphic operations -------------------------------------------------
    def add(self, a, b):
        """E(a), E(b) -> E(a + b)."""
        return a * b % self.nsq

    def shift(self, a, w: int):
        """E(m) -> E(m * 2^w)."""
        return gmpy2.powmod(a, mpz(1) << w, self.nsq)

    def one(self):
        """Neutral element for the homomorphic sum (a trivial encryption of 0)."""
        return mpz(1)

    # --- wire format ----------------------------------------------------------------
    def to_message(self) -> dict:
        return {"scheme": self.scheme, "n": int(self.n).to_bytes((self.bits + 7) // 8, "big")}

    @classmethod
    def from_message(cls, msg: dict) -> "PaillierPublicKey":
        if not isinstance(msg, dict) or msg.get("scheme") != cls.scheme:
            raise CiphertextError("public key message malformed")
        nb = msg.get("n")
        if not isinstance(nb, (bytes, bytearray)) or not 32 <= len(nb) <= MAX_KEY_BITS // 8:
            raise CiphertextError(f"public key modulus malformed (32 to {MAX_KEY_BITS // 8} bytes)")
        try:
            return cls(int.from_bytes(nb, "big"))
        except ValueError as e:
            raise CiphertextError(str(e)) from None

    def check(self, c) -> None:
        """Raise CiphertextError unless c is in Z*_{n^2}."""
        if not (0 < c < self.nsq):
            raise CiphertextError("ciphertext outside the Paillier range (0, n^2)")
        if gmpy2.gcd(c, self.n) != 1:
            raise CiphertextError("ciphertext not invertible mod n^2")

    def check_many(self, cts) -> None:
        """``check`` for many ciphertexts with one gcd: a product mod n is a unit iff every factor is."""
        n, nsq = self.n, self.nsq
        acc = mpz(1)
        for c in cts:
            if not (0 < c < nsq):
                raise CiphertextError("ciphertext outside the Paillier range (0, n^2)")
            acc = acc * c % n
        if gmpy2.gcd(acc, n) != 1:
            for c in cts:
                self.check(c)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_message()["n"]).hexdigest()[:16]


class PaillierPrivateKey:
    """Key pair held by the key holder: CRT encryption and decryption."""

    def __init__(self, p: int, q: int, obfuscation: str = "full", _gens=None):
        p, q = mpz(p), mpz(q)
        if p == q:
            raise ValueError("p == q")
        if obfuscation not in ("full", "djn"):
            raise ValueError("obfuscation must be 'full' or 'djn'")
        self.p, self.q = p, q
        self.public = PaillierPublicKey(p * q)
        n = self.public.n
        if gmpy2.gcd(n, (p - 1) * (q - 1)) != 1:
            raise ValueError("gcd(n, phi) != 1")
        self.obfuscation = obfuscation
        self.psq, self.qsq = p * p, q * q
        self.qsq_inv = gmpy2.invert(self.qsq, self.psq)   # CRT mod n^2
        self.q_inv = gmpy2.invert(q, p)                   # CRT mod n
        # decryption constants (g = n + 1)
        self.hp = gmpy2.invert(self._L(gmpy2.powmod_sec(n + 1, p - 1, self.psq), p), p)
        self.hq = gmpy2.invert(self._L(gmpy2.powmod_sec(n + 1, q - 1, self.qsq), q), q)
        self._gen_tabs = None
        self._gens = None
        self._native = None        # the C kernel's tables (built on first batch use), or [] without it
        self._native_dec = None    # the C kernel's decryption exponentiations, likewise
        if obfuscation == "full" and (_gens is not None or (_is_safe(p) and _is_safe(q))):
            # r^n mod p^2 is uniform over the order-(p-1) subgroup; with a certified generator g_p
            # of that subgroup, g_p^e (e uniform in [0, p-1)) has exactly that distribution and
            # admits a fixed-base table (same for q).
            gens = list(_gens) if _gens is not None else [self._subgroup_generator(pr, sq)
                                                          for pr, sq in ((p, self.psq), (q, self.qsq))]
            self._gens = tuple(mpz(g) for g in gens)
            self._gen_tabs = [_fixed_base_table(g, sq, int(pr.bit_length()))
                              for g, pr, sq in zip(self._gens, (p, q), (self.psq, self.qsq))]
        if obfuscation == "djn":
            if _gens is not None:
                self.hs_p, self.hs_q = (mpz(g) for g in _gens)
            else:
                while True:
                    x = mpz(secrets.randbelow(int(n) - 2) + 2)
                    if gmpy2.gcd(x, n) == 1:
                        break
                h = (-(x * x)) % n
                self.hs_p = gmpy2.powmod(h, n, self.psq)
                self.hs_q = gmpy2.powmod(h, n, self.qsq)
            self._gens = (self.hs_p, self.hs_q)
            # fixed-base window tables: hs^(j * 2^(w*i)) mod p^2 / q^2
            self._tab_p = _fixed_base_table(self.hs_p, self.psq, DJN_ALPHA_BITS)
            self._tab_q = _fixed_base_table(self.hs_q, self.qsq, DJN_ALPHA_BITS)

    @staticmethod
    def _subgroup_generator(pr, sq):
        half = (pr - 1) // 2
        while True:
            y = mpz(secrets.randbelow(int(pr) - 3) + 2)
            if gmpy2.powmod(y, 2, pr) != 1 and gmpy2.powmod(y, half, pr) != 1:
                break                      # y is a primitive root mod p (p safe)
        return gmpy2.powmod(y, pr, sq)     # order exactly p - 1 in Z*_{p^2}

    @staticmethod
    def _L(u, d):
        return (u - 1) // d

    @classmethod
    def generate(cls, bits: int = 2048, obfuscation: str = "full",
                 allow_insecure: bool = True) -> "PaillierPrivateKey":
        """A fresh key of ``bits`` bits.  Sizes are checked with :func:`check_key_bits`
        (``allow_insecure=True`` keeps small sizes possible for tests; callers that take a size
        from a user should pass False)."""
        check_key_bits(bits, allow_insecure)
        half = bits // 2
        prime = _safe_prime if obfuscation == "full" else _random_prime
        while True:
            p = prime(half)
            q = prime(half)
            if p == q:
                continue
            n = p * q
            if n.bit_length() == bits and gmpy2.gcd(n, (p - 1) * (q - 1)) == 1:
                return cls(p, q, obfuscation)

    # --- encryption (key holder, CRT) ------------------------------------------------
    def obfuscator(self) -> tuple:
        """A fresh r^n, as its residues mod p^2 and mod q^2.  Use each one for one encryption only."""
        if self.obfuscation == "djn":
            a = secrets.randbits(DJN_ALPHA_BITS)
            return (_fixed_base_pow(self._tab_p, a, self.psq), _fixed_base_pow(self._tab_q, a, self.qsq))
        p, q = self.p, self.q
        if self._gen_tabs is not None:
            ep = secrets.randbelow(int(p) - 1)
            eq = secrets.randbelow(int(q) - 1)
            return (_fixed_base_pow(self._gen_tabs[0], ep, self.psq),
                    _fixed_base_pow(self._gen_tabs[1], eq, self.qsq))
        yp = mpz(secrets.randbelow(int(p) - 1) + 1)
        yq = mpz(secrets.randbelow(int(q) - 1) + 1)
        return gmpy2.powmod_sec(yp, p, self.psq), gmpy2.powmod_sec(yq, q, self.qsq)

    def encrypt_with(self, m: int, rn: tuple):
        """E(m) with a given fresh obfuscator from :meth:`obfuscator`."""
        n = self.public.n
        m = mpz(m) % n
        rp, rq = rn
        gm = 1 + m * n                       # (n+1)^m mod n^2
        cp = gm % self.psq * rp % self.psq
        cq = gm % self.qsq * rq % self.qsq
        return cq + self.qsq * ((cp - cq) * self.qsq_inv % self.psq)

    def encrypt(self, m: int):
        """E(m) with fresh randomness; m is taken mod n (negative m encrypts n - |m|)."""
        return self.encrypt_with(m, self.obfuscator())

    def obfuscators(self, count: int) -> list:
        """``count`` fresh obfuscators, as from :meth:`obfuscator`, in one batch: the fixed-base products run
        in the C kernel of :mod:`.native` when it is available (same tables, same exponents, same integers)."""
        nat = self._native_tables()
        if not nat:
            return [self.obfuscator() for _ in range(count)]
        if self.obfuscation == "djn":
            ep = [secrets.randbits(DJN_ALPHA_BITS) for _ in range(count)]
            eq = ep
        else:
            ep = [secrets.randbelow(int(self.p) - 1) for _ in range(count)]
            eq = [secrets.randbelow(int(self.q) - 1) for _ in range(count)]
        return [(mpz(a), mpz(b)) for a, b in zip(nat[0].pow_many(ep), nat[1].pow_many(eq))]

    def encrypt_many(self, values) -> list:
        """[E(m) for m in values], each with its own fresh obfuscator."""
        values = list(values)
        return [self.encrypt_with(m, rn) for m, rn in zip(values, self.obfuscators(len(values)))]

    def _native_tables(self):
        if self._native is None:
            from .native import fixed_base

            tabs = (self._tab_p, self._tab_q) if self.obfuscation == "djn" else self._gen_tabs
            nat = []
            if tabs is not None:
                for tab, sq in zip(tabs, (self.psq, self.qsq)):
                    nat.append(fixed_base(tab, sq, lambda e, tab=tab, sq=sq: _fixed_base_pow(tab, e, sq)))
            self._native = nat if len(nat) == 2 and all(nat) else []
        return self._native

    # --- decryption ---------------------------------------------------------------------
    def decrypt_raw(self, c) -> int:
        """Plaintext in [0, n)."""
        p, q = self.p, self.q
        return self._from_powers(gmpy2.powmod_sec(c % self.psq, p - 1, self.psq),
                                 gmpy2.powmod_sec(c % self.qsq, q - 1, self.qsq))

    def _from_powers(self, up, uq) -> int:
        """The plaintext in [0, n) from c^(p-1) mod p^2 and c^(q-1) mod q^2 (L function, then the CRT)."""
        p, q = self.p, self.q
        mp = self._L(up, p) * self.hp % p
        mq = self._L(uq, q) * self.hq % q
        return int(mq + q * ((mp - mq) * self.q_inv % p))

    def _centred(self, m: int) -> int:
        n = int(self.public.n)
        return m - n if m > n // 2 else m

    def decrypt(self, c) -> int:
        """Centred plaintext in (-n/2, n/2] (checks that c is a valid ciphertext first)."""
        self.public.check(c)
        return self._centred(self.decrypt_raw(c))

    def decrypt_many(self, cts) -> list:
        """[decrypt(c) for c in cts]; the exponentiations run in the C kernel of :mod:`.native` when it is
        usable (constant-time in the secret exponents, like ``powmod_sec``), else one by one."""
        cts = [mpz(c) for c in cts]
        nat = self._native_pow()
        if not nat or not cts:
            return [self.decrypt(c) for c in cts]
        self.public.check_many(cts)
        up = nat[0].pow_many([c % self.psq for c in cts])
        uq = nat[1].pow_many([c % self.qsq for c in cts])
        return [self._centred(self._from_powers(a, b)) for a, b in zip(up, uq)]

    def _native_pow(self):
        if self._native_dec is None:
            from .native import pow_sec

            nat = [pow_sec(self.psq, self.p - 1), pow_sec(self.qsq, self.q - 1)]
            self._native_dec = nat if all(nat) else []
        return self._native_dec

    # --- the key holder's own worker processes -------------------------------------------
    def worker_state(self) -> dict:
        """What the key holder's own worker processes need to rebuild this key (never sent to
        another party): primes, obfuscation mode and the certified generators."""
        return {"p": int(self.p), "q": int(self.q), "obfuscation": self.obfuscation,
                "gens": None if self._gens is None else [int(g) for g in self._gens]}

    @classmethod
    def from_worker_state(cls, st: dict) -> "PaillierPrivateKey":
        return cls(st["p"], st["q"], st["obfuscation"], _gens=st.get("gens"))


def security_bits(key_bits: int) -> int:
    """NIST SP 800-57 comparable strength of an RSA/Paillier modulus."""
    if key_bits >= 15360:
        return 256
    if key_bits >= 7680:
        return 192
    if key_bits >= 3072:
        return 128
    if key_bits >= 2048:
        return 112
    return 80 if key_bits >= 1024 else int(math.log2(max(key_bits, 2)))
