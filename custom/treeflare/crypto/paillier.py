"""Paillier cryptosystem on gmpy2 (g = n + 1).

* Key generation draws primes from ``secrets`` randomness.
* Decryption uses the CRT (mod p^2 and q^2).
* Encryption at the key holder uses the CRT as well, with **fresh randomness for every
  ciphertext** (never an obfuscator pool: reusing r leaks m1 - m2).

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

Only the key holder (the active party) can encrypt here: passive parties never encrypt,
they only add ciphertexts and shift them (``c^(2^W)``) for compression.
"""
from __future__ import annotations

import math
import secrets

import gmpy2
from gmpy2 import mpz

DJN_ALPHA_BITS = 256
_DJN_WINDOW = 8
MIN_SECURE_BITS = 2048


class CiphertextError(ValueError):
    """A received ciphertext is malformed (outside Z*_{n^2}, wrong size...)."""


def _random_prime(bits: int) -> mpz:
    while True:
        cand = secrets.randbits(bits) | (3 << (bits - 2)) | 1
        p = gmpy2.next_prime(mpz(cand))
        if p.bit_length() == bits and gmpy2.is_prime(p, 50):
            return p


_SIEVE = 1
for _sp in range(3, 2000, 2):
    if gmpy2.is_prime(_sp):
        _SIEVE *= _sp


def _safe_prime(bits: int) -> mpz:
    """p = 2p' + 1 with p' prime (so a generator of the order-(p-1) subgroup of Z*_{p^2} is easy
    to certify): about 1-6 s for 1024 bits."""
    while True:
        q = mpz(secrets.randbits(bits - 1) | (3 << (bits - 3)) | 1)
        for _ in range(4096):
            p = 2 * q + 1
            if gmpy2.gcd(q, _SIEVE) == 1 and gmpy2.gcd(p, _SIEVE) == 1 and gmpy2.is_prime(q, 2) \
                    and gmpy2.is_prime(p, 2) and gmpy2.is_prime(q, 50) and gmpy2.is_prime(p, 50):
                if p.bit_length() == bits:
                    return p
                break
            q += 2


def _is_safe(p) -> bool:
    return gmpy2.is_prime((p - 1) // 2, 30)


class PaillierPublicKey:
    """Public key: what a passive party holds.  Homomorphic ops on ints (mpz)."""

    scheme = "paillier"

    def __init__(self, n: int):
        n = mpz(n)
        if n < 3 or n % 2 == 0:
            raise ValueError("invalid Paillier modulus")
        self.n = n
        self.nsq = n * n
        self.bits = int(n.bit_length())
        self.ct_bytes = (int(self.nsq.bit_length()) + 7) // 8
        # usable plaintext bits: any packed value M with |M| < 2**usable_bits is decoded
        # unambiguously by the centred decryption (|M| < n/2)
        self.usable_bits = self.bits - 2

    # --- homomorphic operations -------------------------------------------------
    def add(self, a, b):
        return a * b % self.nsq

    def sub(self, a, b):
        return a * gmpy2.invert(b, self.nsq) % self.nsq

    def shift(self, a, w: int):
        """E(m) -> E(m * 2^w)."""
        return gmpy2.powmod(a, mpz(1) << w, self.nsq)

    def one(self):
        """Neutral element for the homomorphic sum (a trivial encryption of 0)."""
        return mpz(1)

    # --- wire format ----------------------------------------------------------------
    def to_message(self) -> dict:
        return {"scheme": self.scheme, "n": int(self.n).to_bytes((self.bits + 7) // 8, "big")}

    def check(self, c) -> None:
        if not (0 < c < self.nsq):
            raise CiphertextError("ciphertext outside the Paillier range (0, n^2)")
        if gmpy2.gcd(c, self.n) != 1:
            raise CiphertextError("ciphertext not invertible mod n^2")

    def fingerprint(self) -> str:
        import hashlib
        return hashlib.sha256(self.to_message()["n"]).hexdigest()[:16]


class PaillierPrivateKey:
    """Key pair held by the active party: CRT encryption and decryption."""

    def __init__(self, p: int, q: int, obfuscation: str = "full"):
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
        self.hp = gmpy2.invert(self._L(gmpy2.powmod(n + 1, p - 1, self.psq), p), p)
        self.hq = gmpy2.invert(self._L(gmpy2.powmod(n + 1, q - 1, self.qsq), q), q)
        self._gen_tabs = None
        if obfuscation == "full" and _is_safe(p) and _is_safe(q):
            # r^n mod p^2 is uniform over the order-(p-1) subgroup; with a certified generator g_p
            # of that subgroup, g_p^e (e uniform in [0, p-1)) has exactly that distribution and
            # admits a fixed-base table (same for q).
            self._gen_tabs = []
            for pr, sq in ((p, self.psq), (q, self.qsq)):
                half = (pr - 1) // 2
                while True:
                    y = mpz(secrets.randbelow(int(pr) - 3) + 2)
                    if gmpy2.powmod(y, 2, pr) != 1 and gmpy2.powmod(y, half, pr) != 1:
                        break                      # y is a primitive root mod p
                g = gmpy2.powmod(y, pr, sq)        # order exactly p - 1 in Z*_{p^2}
                self._gen_tabs.append(self._fixed_base_table(g, sq, int(pr.bit_length())))
        if obfuscation == "djn":
            while True:
                x = mpz(secrets.randbelow(int(n) - 2) + 2)
                if gmpy2.gcd(x, n) == 1:
                    break
            h = (-(x * x)) % n
            self.hs_p = gmpy2.powmod(h, n, self.psq)
            self.hs_q = gmpy2.powmod(h, n, self.qsq)
            # fixed-base window tables: hs^(j * 2^(w*i)) mod p^2 / q^2
            self._tab_p = self._fixed_base_table(self.hs_p, self.psq, DJN_ALPHA_BITS)
            self._tab_q = self._fixed_base_table(self.hs_q, self.qsq, DJN_ALPHA_BITS)

    @staticmethod
    def _fixed_base_table(base, mod, exp_bits):
        w = _DJN_WINDOW
        tables = []
        b = mpz(base)
        for _ in range((exp_bits + w - 1) // w):
            row = [mpz(1)]
            for _j in range(1, 1 << w):
                row.append(row[-1] * b % mod)
            tables.append(row)
            b = row[-1] * b % mod          # b^(2^w)
        return tables

    @staticmethod
    def _fixed_base_pow(tables, alpha: int, mod):
        w = _DJN_WINDOW
        mask = (1 << w) - 1
        acc = mpz(1)
        for row in tables:
            d = alpha & mask
            if d:
                acc = acc * row[d] % mod
            alpha >>= w
        return acc

    @staticmethod
    def _L(u, d):
        return (u - 1) // d

    @classmethod
    def generate(cls, bits: int = 2048, obfuscation: str = "full") -> "PaillierPrivateKey":
        if bits < 256 or bits % 2:
            raise ValueError("key bits must be even and >= 256")
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
    def _rn(self):
        """Fresh r^n, as its residues mod p^2 and mod q^2."""
        if self.obfuscation == "djn":
            a = secrets.randbits(DJN_ALPHA_BITS)
            return (self._fixed_base_pow(self._tab_p, a, self.psq),
                    self._fixed_base_pow(self._tab_q, a, self.qsq))
        p, q = self.p, self.q
        if self._gen_tabs is not None:
            ep = secrets.randbelow(int(p) - 1)
            eq = secrets.randbelow(int(q) - 1)
            return (self._fixed_base_pow(self._gen_tabs[0], ep, self.psq),
                    self._fixed_base_pow(self._gen_tabs[1], eq, self.qsq))
        yp = mpz(secrets.randbelow(int(p) - 1) + 1)
        yq = mpz(secrets.randbelow(int(q) - 1) + 1)
        return gmpy2.powmod(yp, p, self.psq), gmpy2.powmod(yq, q, self.qsq)

    def encrypt(self, m: int):
        n = self.public.n
        m = mpz(m) % n
        rp, rq = self._rn()
        gm = 1 + m * n                       # (n+1)^m mod n^2
        cp = gm % self.psq * rp % self.psq
        cq = gm % self.qsq * rq % self.qsq
        return cq + self.qsq * ((cp - cq) * self.qsq_inv % self.psq)

    def decrypt_raw(self, c) -> int:
        """Plaintext in [0, n)."""
        p, q = self.p, self.q
        mp = self._L(gmpy2.powmod(c, p - 1, self.psq), p) * self.hp % p
        mq = self._L(gmpy2.powmod(c, q - 1, self.qsq), q) * self.hq % q
        return int(mq + q * ((mp - mq) * self.q_inv % p))

    def decrypt(self, c) -> int:
        """Centred plaintext in (-n/2, n/2]."""
        self.public.check(c)
        m = self.decrypt_raw(c)
        n = int(self.public.n)
        return m - n if m > n // 2 else m

    def secret_state(self) -> tuple:
        """(p, q, obfuscation) -- only for the key holder's own worker processes."""
        return int(self.p), int(self.q), self.obfuscation


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
