"""Small homomorphic-encryption backend interface used by the vertical protocol.

Two objects per scheme:

* a **key holder** (active party): ``encrypt_many``, ``decrypt_many``, ``public``;
* a **public context** (passive parties, rebuilt from ``public.to_message()``):
  ``add``, ``sub``, ``shift`` (multiply the plaintext by 2^w), ``one`` (neutral element),
  ``serialize`` / ``deserialize`` (fixed-width big-endian bytes in one uint8 array; every
  received ciphertext is range-checked).

Backends: ``paillier`` (gmpy2, see :mod:`.paillier`) and ``mock`` (identity "encryption" on
Python ints, the plaintext oracle).  Both expose the same plaintext capacity
(``usable_bits``) for a given key size, so slot layouts and packing are identical.
"""
from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from gmpy2 import mpz

from .paillier import CiphertextError, PaillierPrivateKey, PaillierPublicKey

__all__ = [
    "CiphertextError", "KeyHolder", "PublicContext", "MockPublicKey", "MockKeyHolder",
    "PaillierKeyHolder", "PaillierPublic", "make_key_holder", "public_from_message",
    "default_workers",
]

# serial below this many items per worker (process start-up is not free)
_MIN_PER_WORKER = 48


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------
# public contexts
# --------------------------------------------------------------------------------------
class PublicContext:
    scheme = "abstract"
    usable_bits: int
    ct_bytes: int
    key_bits: int

    def __init__(self):
        self.ops = Counter()

    # ops -------------------------------------------------------------------------
    def add(self, a, b):  # pragma: no cover - interface
        raise NotImplementedError

    def sub(self, a, b):  # pragma: no cover
        raise NotImplementedError

    def shift(self, a, w: int):  # pragma: no cover
        raise NotImplementedError

    def one(self):  # pragma: no cover
        raise NotImplementedError

    def check(self, c) -> None:  # pragma: no cover
        raise NotImplementedError

    def to_message(self) -> dict:  # pragma: no cover
        raise NotImplementedError

    # wire ---------------------------------------------------------------------------
    def serialize(self, cts) -> np.ndarray:
        w = self.ct_bytes
        signed = self.scheme == "mock"
        raw = b"".join(mpz(c).to_bytes(w, "big", signed=signed) for c in cts)
        return np.frombuffer(raw, dtype=np.uint8).copy()

    def deserialize(self, arr, count: int | None = None) -> list:
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
            raise CiphertextError("ciphertexts must arrive as a 1-D uint8 array")
        w = self.ct_bytes
        if arr.size % w:
            raise CiphertextError(f"ciphertext array of {arr.size} bytes is not a multiple of {w}")
        if count is not None and arr.size // w != count:
            raise CiphertextError(f"expected {count} ciphertexts, got {arr.size // w}")
        raw = arr.tobytes()
        signed = self.scheme == "mock"
        out = [mpz.from_bytes(raw[i:i + w], "big", signed=signed) for i in range(0, len(raw), w)]
        for c in out:
            self.check(c)
        return out


class PaillierPublic(PublicContext):
    scheme = "paillier"

    def __init__(self, pk: PaillierPublicKey):
        super().__init__()
        self.pk = pk
        self.n, self.nsq = pk.n, pk.nsq
        self.usable_bits = pk.usable_bits
        self.ct_bytes = pk.ct_bytes
        self.key_bits = pk.bits

    def add(self, a, b):
        return a * b % self.nsq

    def sub(self, a, b):
        return self.pk.sub(a, b)

    def shift(self, a, w: int):
        return self.pk.shift(a, w)

    def one(self):
        return mpz(1)

    def check(self, c) -> None:
        self.pk.check(c)

    def to_message(self) -> dict:
        return self.pk.to_message()


class MockPublicKey(PublicContext):
    """Identity 'encryption': ciphertext == plaintext integer.  Plaintext oracle only."""

    scheme = "mock"

    def __init__(self, key_bits: int):
        super().__init__()
        self.key_bits = int(key_bits)
        self.usable_bits = self.key_bits - 2
        self.ct_bytes = (2 * self.key_bits + 7) // 8

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def shift(self, a, w: int):
        return a << w

    def one(self):
        return mpz(0)

    def check(self, c) -> None:
        if abs(c) >= (mpz(1) << (self.key_bits - 1)):
            raise CiphertextError("mock ciphertext out of range")

    def to_message(self) -> dict:
        return {"scheme": "mock", "bits": self.key_bits}


def public_from_message(msg: dict) -> PublicContext:
    if not isinstance(msg, dict) or "scheme" not in msg:
        raise CiphertextError("public key message malformed")
    if msg["scheme"] == "paillier":
        nb = msg.get("n")
        if not isinstance(nb, (bytes, bytearray)) or len(nb) < 32:
            raise CiphertextError("public key modulus malformed")
        return PaillierPublic(PaillierPublicKey(int.from_bytes(nb, "big")))
    if msg["scheme"] == "mock":
        return MockPublicKey(int(msg["bits"]))
    raise CiphertextError(f"unknown HE scheme {msg['scheme']!r}")


# --------------------------------------------------------------------------------------
# key holders
# --------------------------------------------------------------------------------------
class KeyHolder:
    public: PublicContext

    def __init__(self):
        self.ops = Counter()

    def encrypt_many(self, values, workers: int = 1) -> list:  # pragma: no cover
        raise NotImplementedError

    def decrypt_many(self, cts, workers: int = 1) -> list:  # pragma: no cover
        raise NotImplementedError


class MockKeyHolder(KeyHolder):
    def __init__(self, key_bits: int = 2048):
        super().__init__()
        self.public = MockPublicKey(key_bits)
        self.key_bits = key_bits

    def encrypt_many(self, values, workers: int = 1) -> list:
        out = [mpz(v) for v in values]
        for c in out:
            self.public.check(c)
        self.ops["encryptions"] += len(out)
        return out

    def decrypt_many(self, cts, workers: int = 1) -> list:
        self.ops["decryptions"] += len(cts)
        return [int(c) for c in cts]


# worker-process state (fork start: inherited from the key holder's own process)
_WORKER_KEY: PaillierPrivateKey | None = None


def _enc_chunk(values):
    key = _WORKER_KEY
    w = key.public.ct_bytes
    return b"".join(int(key.encrypt(v)).to_bytes(w, "big") for v in values)


def _dec_chunk(raw_and_w):
    raw, w = raw_and_w
    key = _WORKER_KEY
    return [key.decrypt(mpz.from_bytes(raw[i:i + w], "big")) for i in range(0, len(raw), w)]


def _chunks(seq, k):
    step = (len(seq) + k - 1) // k
    return [seq[i:i + step] for i in range(0, len(seq), step)]


def _pool(workers):
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))


class PaillierKeyHolder(KeyHolder):
    def __init__(self, key: PaillierPrivateKey):
        super().__init__()
        self.key = key
        self.public = PaillierPublic(key.public)
        self.key_bits = key.public.bits

    @classmethod
    def generate(cls, key_bits: int = 2048, obfuscation: str = "full"):
        return cls(PaillierPrivateKey.generate(key_bits, obfuscation))

    def _workers(self, n_items, workers):
        workers = max(1, int(workers or 1))
        return min(workers, max(1, n_items // _MIN_PER_WORKER))

    def encrypt_many(self, values, workers: int = 1) -> list:
        values = [int(v) for v in values]
        k = self._workers(len(values), workers)
        self.ops["encryptions"] += len(values)
        if k == 1:
            return [self.key.encrypt(v) for v in values]
        global _WORKER_KEY
        _WORKER_KEY = self.key
        w = self.public.ct_bytes
        out = []
        try:
            with _pool(k) as ex:
                for raw in ex.map(_enc_chunk, _chunks(values, 4 * k)):
                    out.extend(mpz.from_bytes(raw[i:i + w], "big") for i in range(0, len(raw), w))
        finally:
            _WORKER_KEY = None
        return out

    def decrypt_many(self, cts, workers: int = 1) -> list:
        cts = list(cts)
        k = self._workers(len(cts), workers)
        self.ops["decryptions"] += len(cts)
        if k == 1:
            return [self.key.decrypt(c) for c in cts]
        global _WORKER_KEY
        _WORKER_KEY = self.key
        w = self.public.ct_bytes
        out = []
        try:
            with _pool(k) as ex:
                jobs = [(b"".join(int(c).to_bytes(w, "big") for c in ch), w) for ch in _chunks(cts, 4 * k)]
                for part in ex.map(_dec_chunk, jobs):
                    out.extend(part)
        finally:
            _WORKER_KEY = None
        return out


def make_key_holder(scheme: str, key_bits: int, obfuscation: str = "full") -> KeyHolder:
    if scheme == "mock":
        return MockKeyHolder(key_bits)
    if scheme == "paillier":
        return PaillierKeyHolder.generate(key_bits, obfuscation)
    raise ValueError(f"unknown HE scheme {scheme!r}")
