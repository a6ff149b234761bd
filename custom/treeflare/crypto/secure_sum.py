"""Summing sites' count vectors so that the aggregator learns only the sum (packed Paillier).

Roles (ICDTA4FL's refinement round):

* the **key holder** (one site) generates a Paillier key pair, publishes the modulus and later decrypts
  exactly one summed vector per round; it never receives another site's ciphertexts one by one;
* every **site** packs its non-negative integer counts into slots of ``slot_bits`` bits (many per
  plaintext) and encrypts them under the public key, with fresh randomness r^n for every ciphertext;
* the **server** multiplies the ciphertexts slot-wise (adding the plaintexts) and only ever holds
  ciphertexts and the decrypted sum.

Slots never overflow into each other as long as the sum of every slot stays below 2^slot_bits; the server
chooses ``slot_bits`` from the sites' row counts (``slot_bits_for``). Ciphertexts travel as one uint8
array of fixed-width big-endian integers, checked on arrival (range, invertibility, count).

Encryption at a site is the textbook form (1 + m n) r^n mod n^2: the sites hold no factorisation, so the
cost is one 2048-bit exponentiation per ciphertext (about 125/s per core here). ``RandomnessPool`` computes
the r^n in a background thread (gmpy2 releases the GIL for batched powmod) while the site does other work.
"""

from __future__ import annotations

import secrets
import threading

import gmpy2
import numpy as np
from gmpy2 import mpz

from .backend import PaillierPublic
from .paillier import (MAX_KEY_BITS, MIN_SECURE_BITS, CiphertextError, PaillierPrivateKey, PaillierPublicKey,
                       _random_prime)

__all__ = ["MIN_KEY_BITS", "MAX_KEY_BITS", "slot_bits_for", "values_per_ciphertext", "n_ciphertexts",
           "public_key_to_array", "public_key_from_array", "encrypt_counts", "read_ciphertexts", "sum_ciphertexts",
           "add_encrypted", "decrypt_sum", "RandomnessPool", "SumKeyHolder"]

MIN_KEY_BITS = MIN_SECURE_BITS   # 112-bit security (NIST SP 800-57)


def slot_bits_for(max_sum: int) -> int:
    """Bits per slot so that sums up to ``max_sum`` never carry into the next slot."""
    if max_sum < 0:
        raise ValueError("max_sum must be >= 0")
    return int(max_sum).bit_length() + 1


def values_per_ciphertext(key_bits: int, slot_bits: int) -> int:
    usable = key_bits - 2  # packed sums stay below n/2: decryption is unambiguous
    k = usable // slot_bits
    if k < 1:
        raise ValueError(f"a {slot_bits}-bit slot does not fit a {key_bits}-bit plaintext")
    return k


def n_ciphertexts(n_values: int, key_bits: int, slot_bits: int) -> int:
    k = values_per_ciphertext(key_bits, slot_bits)
    return (int(n_values) + k - 1) // k


def public_key_to_array(pk: PaillierPublicKey) -> np.ndarray:
    return np.frombuffer(pk.to_message()["n"], dtype=np.uint8).copy()


def public_key_from_array(arr) -> PaillierPublicKey:
    """A modulus received from the key holder, checked: size within bounds, odd, not a small-factor number."""
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
        raise CiphertextError("the public key must arrive as a 1-D uint8 array")
    n = mpz.from_bytes(arr.tobytes(), "big")
    bits = int(n.bit_length())
    if not MIN_KEY_BITS <= bits <= MAX_KEY_BITS:
        raise CiphertextError(f"public key of {bits} bits; accepted: {MIN_KEY_BITS}-{MAX_KEY_BITS}")
    if n % 2 == 0 or gmpy2.gcd(n, 2 * 3 * 5 * 7 * 11 * 13 * 17 * 19 * 23 * 29 * 31 * 37) != 1:
        raise CiphertextError("public key is not an RSA-type modulus")
    return PaillierPublicKey(n)


def _pack(values: np.ndarray, k: int, slot_bits: int) -> list:
    out = []
    for start in range(0, len(values), k):
        m = mpz(0)
        for v in values[start:start + k][::-1]:
            m = (m << slot_bits) | int(v)
        out.append(m)
    return out


class RandomnessPool:
    """Fresh r^n mod n^2 values, computed ahead in a daemon thread; each value is handed out once."""

    BATCH = 16

    def __init__(self, pk: PaillierPublicKey, target: int = 0):
        self.pk = pk
        self._ready: list = []
        self._lock = threading.Lock()
        self._target = int(target)
        self._stop = False
        self._thread = None
        if target > 0:
            self._thread = threading.Thread(target=self._fill, name="paillier-rn", daemon=True)
            self._thread.start()

    def _batch(self, count: int) -> list:
        n = int(self.pk.n)
        bases = [mpz(secrets.randbelow(n - 2) + 2) for _ in range(count)]
        return gmpy2.powmod_base_list(bases, self.pk.n, self.pk.nsq)  # releases the GIL

    def _fill(self):
        while not self._stop:
            with self._lock:
                if len(self._ready) >= self._target:
                    return
            values = self._batch(self.BATCH)
            with self._lock:
                self._ready.extend(values)

    def take(self, count: int) -> list:
        with self._lock:
            out, self._ready = self._ready[:count], self._ready[count:]
        if len(out) < count:
            out += self._batch(count - len(out))
        return out

    def close(self):
        self._stop = True


def encrypt_counts(pk: PaillierPublicKey, values, slot_bits: int, pool: RandomnessPool | None = None) -> np.ndarray:
    """Pack non-negative integers (each < 2^slot_bits) and encrypt them; returns the wire array."""
    values = np.asarray(values)
    if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
        raise ValueError("counts must be a 1-D integer array")
    if values.size and (values.min() < 0 or int(values.max()) >= (1 << slot_bits)):
        raise ValueError(f"counts must lie in [0, 2^{slot_bits})")
    k = values_per_ciphertext(pk.bits, slot_bits)
    plain = _pack(values, k, slot_bits)
    rn = (pool or RandomnessPool(pk)).take(len(plain))
    n, nsq = pk.n, pk.nsq
    cts = [(1 + m * n) * r % nsq for m, r in zip(plain, rn)]
    return PaillierPublic(pk).serialize(cts)


def read_ciphertexts(pk: PaillierPublicKey, arr, count: int) -> list:
    """Exactly ``count`` ciphertexts from a wire array, each checked (range and invertibility)."""
    if isinstance(arr, np.ndarray) and arr.size != count * pk.ct_bytes:
        raise CiphertextError(f"expected {count} ciphertexts ({count * pk.ct_bytes} bytes), got {arr.size} bytes")
    return PaillierPublic(pk).deserialize(arr, count)


def sum_ciphertexts(pk: PaillierPublicKey, parts: list) -> np.ndarray:
    """Slot-wise sum of several sites' checked ciphertext lists (:func:`read_ciphertexts`), as one wire array."""
    if not parts:
        raise ValueError("nothing to add")
    total = parts[0]
    for cts in parts[1:]:
        total = [a * b % pk.nsq for a, b in zip(total, cts)]
    return PaillierPublic(pk).serialize(total)


def add_encrypted(pk: PaillierPublicKey, arrays, count: int) -> np.ndarray:
    """Slot-wise sum of several sites' encrypted vectors (each checked), as one wire array."""
    return sum_ciphertexts(pk, [read_ciphertexts(pk, arr, count) for arr in arrays])


def decrypt_sum(sk: PaillierPrivateKey, arr, n_values: int, slot_bits: int) -> np.ndarray:
    """The key holder's side: decrypt and unpack a summed vector into ``n_values`` integers."""
    pk = sk.public
    k = values_per_ciphertext(pk.bits, slot_bits)
    count = n_ciphertexts(n_values, pk.bits, slot_bits)
    mask = (1 << slot_bits) - 1
    out = np.empty(count * k, dtype=np.int64)
    for i, c in enumerate(read_ciphertexts(pk, arr, count)):
        m = sk.decrypt(c)
        if m < 0:
            raise CiphertextError("a summed plaintext is negative: some site encrypted a value outside its slots")
        for s in range(k):
            out[i * k + s] = m & mask
            m >>= slot_bits
    return out[:n_values]


def _generate(bits: int) -> PaillierPrivateKey:
    """A key pair from random primes: the key holder only decrypts here (sites encrypt with the public
    key), so it needs none of the safe-prime tables that fast CRT encryption uses (2 s instead of ~10 s)."""
    while True:
        p, q = _random_prime(bits // 2), _random_prime(bits // 2)
        if p != q and (p * q).bit_length() == bits and gmpy2.gcd(p * q, (p - 1) * (q - 1)) == 1:
            return PaillierPrivateKey(p, q)


class SumKeyHolder:
    """The key holder's state for one job: its key pair and the rounds it has already decrypted."""

    def __init__(self, key_bits: int = MIN_KEY_BITS):
        if not MIN_KEY_BITS <= key_bits <= MAX_KEY_BITS or key_bits % 2:
            raise ValueError(f"key bits must be even and in [{MIN_KEY_BITS}, {MAX_KEY_BITS}], got {key_bits}")
        self.key = _generate(key_bits)
        self.decrypted_rounds: set = set()

    def public_array(self) -> np.ndarray:
        return public_key_to_array(self.key.public)

    def decrypt_round(self, round_no: int, arr, n_values: int, slot_bits: int) -> np.ndarray:
        """Decrypt one summed vector per round, never a second one: a curious server cannot have the key
        holder decrypt a single site's vector in addition to the sum of that round."""
        if round_no in self.decrypted_rounds:
            raise CiphertextError(f"round {round_no} was already decrypted; the key holder decrypts one sum per round")
        out = decrypt_sum(self.key, arr, n_values, slot_bits)
        self.decrypted_rounds.add(round_no)
        return out
