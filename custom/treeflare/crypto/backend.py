"""Small homomorphic-encryption backend interface used by the vertical protocol.

Two objects per scheme:

* a **key holder** (active party): ``encrypt_many`` / ``encrypt_bytes``, ``decrypt_many`` /
  ``decrypt_bytes``, ``public``; with ``workers > 1`` the work is spread over a persistent pool of
  worker processes (:mod:`.workers`) that hold their own copy of the key, started at the first
  call and kept until :meth:`KeyHolder.close`;
* a **public context** (other parties, rebuilt from ``public.to_message()``):
  ``add``, ``shift`` (multiply the plaintext by 2^w), ``one`` (neutral element),
  ``serialize`` / ``deserialize`` (fixed-width big-endian bytes in one uint8
  array; every received ciphertext is range-checked).

Backends: ``paillier`` (gmpy2, see :mod:`.paillier`), ``ou`` (Okamoto-Uchiyama, see :mod:`.ou`: ciphertexts
mod n = p^2 q, plaintexts in Z_p, so ``usable_bits`` is about a third of the key size) and ``mock`` (identity
"encryption" on Python ints, the plaintext oracle, with Paillier's capacity).  Slot layouts and packing plans
take each context's ``usable_bits``; sums are exact whatever the capacity, so the models are identical.
"""
from __future__ import annotations

import secrets
from collections import Counter

import numpy as np
from gmpy2 import mpz

from .ou import OuPrivateKey, OuPublicKey
from .paillier import (MAX_KEY_BITS, MIN_TEST_BITS, CiphertextError, PaillierPrivateKey, PaillierPublicKey,
                       check_key_bits)
from .workers import is_cluster, make_pool, parse_workers

__all__ = [
    "CiphertextError", "KeyHolder", "PublicContext", "MockPublicKey", "MockKeyHolder",
    "PaillierKeyHolder", "PaillierPublic", "OuKeyHolder", "OuPublic", "make_key_holder", "public_from_message",
    "ints_to_bytes", "bytes_to_ints", "public_to_json", "public_from_json", "micro_rates",
]

# below this many values per worker the pool is not worth a round trip
_MIN_PER_WORKER = 48


def ints_to_bytes(values, width: int) -> bytes:
    """Signed integers as fixed-width big-endian two's complement."""
    return b"".join(int(v).to_bytes(width, "big", signed=True) for v in values)


def bytes_to_ints(raw: bytes, width: int) -> list:
    return [int.from_bytes(raw[i:i + width], "big", signed=True) for i in range(0, len(raw), width)]


# --------------------------------------------------------------------------------------
# public contexts
# --------------------------------------------------------------------------------------
class PublicContext:
    scheme = "abstract"
    usable_bits: int
    ct_bytes: int
    key_bits: int

    # the modulus ciphertexts are multiplied under (n^2 for Paillier); None where "ciphertexts" are plaintexts
    modulus = None

    def __init__(self):
        self.ops = Counter()

    # ops -------------------------------------------------------------------------
    def add(self, a, b):  # pragma: no cover - interface
        raise NotImplementedError

    def shift(self, a, w: int):  # pragma: no cover
        raise NotImplementedError

    def one(self):  # pragma: no cover
        raise NotImplementedError

    def check(self, c) -> None:  # pragma: no cover
        raise NotImplementedError

    def check_many(self, cts) -> None:
        for c in cts:
            self.check(c)

    def to_message(self) -> dict:  # pragma: no cover
        raise NotImplementedError

    # wire ---------------------------------------------------------------------------
    @property
    def signed_wire(self) -> bool:
        return self.scheme == "mock"

    def to_bytes(self, cts) -> bytes:
        w, s = self.ct_bytes, self.signed_wire
        return b"".join(mpz(c).to_bytes(w, "big", signed=s) for c in cts)

    def from_bytes(self, raw: bytes, check: bool = True) -> list:
        w = self.ct_bytes
        if len(raw) % w:
            raise CiphertextError(f"ciphertext array of {len(raw)} bytes is not a multiple of {w}")
        s = self.signed_wire
        out = [mpz.from_bytes(raw[i:i + w], "big", signed=s) for i in range(0, len(raw), w)]
        if check:
            self.check_many(out)
        return out

    def serialize(self, cts) -> np.ndarray:
        return np.frombuffer(self.to_bytes(cts), dtype=np.uint8).copy()

    def wire_bytes(self, arr, count: int | None = None) -> bytes:
        """The raw bytes of a received ciphertext array, after shape checks (no value checks)."""
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
            raise CiphertextError("ciphertexts must arrive as a 1-D uint8 array")
        w = self.ct_bytes
        if arr.size % w:
            raise CiphertextError(f"ciphertext array of {arr.size} bytes is not a multiple of {w}")
        if count is not None and arr.size // w != count:
            raise CiphertextError(f"expected {count} ciphertexts, got {arr.size // w}")
        return arr.tobytes()

    def deserialize(self, arr, count: int | None = None) -> list:
        return self.from_bytes(self.wire_bytes(arr, count))


class PaillierPublic(PublicContext):
    scheme = "paillier"

    def __init__(self, pk: PaillierPublicKey):
        super().__init__()
        self.pk = pk
        self.n, self.nsq = pk.n, pk.nsq
        self.modulus = pk.nsq
        self.usable_bits = pk.usable_bits
        self.ct_bytes = pk.ct_bytes
        self.key_bits = pk.bits

    def add(self, a, b):
        return a * b % self.nsq

    def shift(self, a, w: int):
        return self.pk.shift(a, w)

    def one(self):
        return mpz(1)

    def check(self, c) -> None:
        self.pk.check(c)

    def check_many(self, cts) -> None:
        self.pk.check_many(cts)

    def to_message(self) -> dict:
        return self.pk.to_message()


class OuPublic(PublicContext):
    """Okamoto-Uchiyama: ciphertexts mod n (half Paillier's size at the same n), plaintexts in Z_p."""

    scheme = "ou"

    def __init__(self, pk: OuPublicKey):
        super().__init__()
        self.pk = pk
        self.n = pk.n
        self.modulus = pk.n
        self.usable_bits = pk.usable_bits
        self.ct_bytes = pk.ct_bytes
        self.key_bits = pk.bits

    def add(self, a, b):
        return a * b % self.n

    def shift(self, a, w: int):
        return self.pk.shift(a, w)

    def one(self):
        return mpz(1)

    def check(self, c) -> None:
        self.pk.check(c)

    def check_many(self, cts) -> None:
        self.pk.check_many(cts)

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

    def shift(self, a, w: int):
        return a << w

    def one(self):
        return mpz(0)

    def check(self, c) -> None:
        if abs(c) >= (mpz(1) << (self.key_bits - 1)):
            raise CiphertextError("mock ciphertext out of range")

    def to_message(self) -> dict:
        return {"scheme": "mock", "bits": self.key_bits}


def public_to_json(pub: PublicContext) -> dict:
    """The public key as plain JSON (for the party's own worker processes)."""
    if pub.scheme == "paillier":
        return {"scheme": "paillier", "n": int(pub.n)}
    if pub.scheme == "ou":
        return {"scheme": "ou", "n": int(pub.n), "g": int(pub.pk.g), "h": int(pub.pk.h)}
    return pub.to_message()


def public_from_json(d: dict) -> PublicContext:
    if d.get("scheme") == "paillier":
        return PaillierPublic(PaillierPublicKey(int(d["n"])))
    if d.get("scheme") == "ou":
        return OuPublic(OuPublicKey(int(d["n"]), int(d["g"]), int(d["h"])))
    return public_from_message(d)


def public_from_message(msg: dict) -> PublicContext:
    if not isinstance(msg, dict) or "scheme" not in msg:
        raise CiphertextError("public key message malformed")
    if msg["scheme"] == "paillier":
        return PaillierPublic(PaillierPublicKey.from_message(msg))
    if msg["scheme"] == "ou":
        return OuPublic(OuPublicKey.from_message(msg))
    if msg["scheme"] == "mock":
        try:
            bits = check_key_bits(msg.get("bits"), minimum=MIN_TEST_BITS, maximum=MAX_KEY_BITS)
        except ValueError:
            raise CiphertextError("mock key size malformed") from None
        return MockPublicKey(bits)
    raise CiphertextError(f"unknown HE scheme {msg['scheme']!r}")


# --------------------------------------------------------------------------------------
# key holders
# --------------------------------------------------------------------------------------
class KeyHolder:
    public: PublicContext

    def __init__(self):
        self.ops = Counter()

    @property
    def plain_bytes(self) -> int:
        """Width of one signed plaintext on the key holder's own pipes."""
        return self.public.ct_bytes // 2 + 2

    def encrypt_many(self, values, workers: int = 1) -> list:
        return self.public.from_bytes(self.encrypt_bytes(values, workers), check=False)

    def decrypt_many(self, cts, workers: int = 1) -> list:
        return self.decrypt_bytes(self.public.to_bytes(cts), workers)

    def encrypt_bytes(self, values, workers: int = 1) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def decrypt_bytes(self, raw: bytes, workers: int = 1) -> list:  # pragma: no cover
        raise NotImplementedError

    def start(self, workers: int) -> None:
        """Start the worker processes now (otherwise at the first large batch)."""

    def close(self) -> None:
        pass


class MockKeyHolder(KeyHolder):
    def __init__(self, key_bits: int = 2048):
        super().__init__()
        self.public = MockPublicKey(key_bits)
        self.key_bits = key_bits

    def encrypt_bytes(self, values, workers: int = 1) -> bytes:
        out = [mpz(v) for v in values]
        self.public.check_many(out)
        self.ops["encryptions"] += len(out)
        return self.public.to_bytes(out)

    def decrypt_bytes(self, raw: bytes, workers: int = 1) -> list:
        cts = self.public.from_bytes(raw)
        self.ops["decryptions"] += len(cts)
        return [int(c) for c in cts]


def _n_tasks(n_items: int, workers: int, min_size: int = 64) -> int:
    """Enough pieces for the pool to balance itself (8 per worker) but none smaller than min_size."""
    return max(1, min(8 * workers, n_items // min_size))


def even_ranges(n_items: int, k: int) -> list:
    """k contiguous (start, stop) ranges covering n_items as evenly as possible (how a batch is shared out
    over worker processes, here and in :mod:`treeflare.vertical.histo`)."""
    bounds = [n_items * i // k for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class PaillierKeyHolder(KeyHolder):
    def __init__(self, key: PaillierPrivateKey, workers: int = 1):
        super().__init__()
        self.key = key
        self.public = self._public_context(key.public)
        self.key_bits = key.public.bits
        self._pools: dict = {}

    @staticmethod
    def _public_context(pk):
        return PaillierPublic(pk)

    def _plain_modulus(self) -> int:
        """The plaintext space's modulus (n for Paillier, p for Okamoto-Uchiyama: the key holder knows it)."""
        return int(self.public.n)

    @classmethod
    def generate(cls, key_bits: int = 2048, obfuscation: str = "full", allow_insecure: bool = True):
        return cls(PaillierPrivateKey.generate(key_bits, obfuscation, allow_insecure))

    def _pool(self, n_items: int, workers):
        """The pool of ``workers`` processes (started once, kept until :meth:`close`), or None when the batch is
        too small to share out; a small batch on a big pool simply makes fewer tasks (``_n_tasks``)."""
        workers = parse_workers(workers or 1)   # a Dask cluster spec (.dask_pool) or a number of processes
        if n_items < _MIN_PER_WORKER or not is_cluster(workers) and min(workers, n_items // _MIN_PER_WORKER) <= 1:
            return None
        pool = self._pools.get(workers)
        if pool is None:
            pool = make_pool(workers, ["treeflare.crypto.backend"])
            pool.map("key", [{"state": self.key.worker_state()}] * pool.n)
            self._pools[workers] = pool
        return pool

    def start(self, workers: int) -> None:
        self._pool(1 << 30, workers)

    def encrypt_bytes(self, values, workers: int = 1) -> bytes:
        n = self._plain_modulus()
        values = [int(v) % n for v in values]
        values = [v - n if v > n // 2 else v for v in values]     # same plaintext, fits the pipe width
        self.ops["encryptions"] += len(values)
        pool = self._pool(len(values), workers)
        if pool is None:
            return self.public.to_bytes(self.key.encrypt_many(values))
        w = self.plain_bytes
        pieces = even_ranges(len(values), _n_tasks(len(values), pool.n))
        tasks = [({}, [ints_to_bytes(values[a:b], w)]) for a, b in pieces]
        return b"".join(blobs[0] for _res, blobs in pool.run_tasks("enc", tasks))

    def decrypt_bytes(self, raw: bytes, workers: int = 1) -> list:
        w = self.public.ct_bytes
        n = len(raw) // w
        self.ops["decryptions"] += n
        pool = self._pool(n, workers)
        if pool is None:
            return self.key.decrypt_many(self.public.from_bytes(raw, check=False))
        tasks = [({}, [raw[a * w:b * w]]) for a, b in even_ranges(n, _n_tasks(n, pool.n, 16))]
        out = []
        pw = self.plain_bytes
        for _res, blobs in pool.run_tasks("dec", tasks):
            out.extend(bytes_to_ints(blobs[0], pw))
        return out

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools = {}


class OuKeyHolder(PaillierKeyHolder):
    """The Okamoto-Uchiyama key holder: the same batches and worker pool as Paillier's (the workers rebuild the key
    from its ``worker_state``, which names the scheme)."""

    @staticmethod
    def _public_context(pk):
        return OuPublic(pk)

    def _plain_modulus(self) -> int:
        return int(self.key.p)

    @classmethod
    def generate(cls, key_bits: int = 2048, obfuscation: str = "full", allow_insecure: bool = True):
        if obfuscation != "full":
            raise ValueError("Okamoto-Uchiyama has one randomness mode ('full'); 'djn' is Paillier's")
        return cls(OuPrivateKey.generate(key_bits, allow_insecure))


def make_key_holder(scheme: str, key_bits: int, obfuscation: str = "full",
                    allow_insecure: bool = True) -> KeyHolder:
    if scheme == "mock":
        return MockKeyHolder(key_bits)
    if scheme == "paillier":
        return PaillierKeyHolder.generate(key_bits, obfuscation, allow_insecure)
    if scheme == "ou":
        return OuKeyHolder.generate(key_bits, obfuscation, allow_insecure)
    raise ValueError(f"unknown HE scheme {scheme!r}")


# --------------------------------------------------------------------------------------
# single-core rates (scripts/bench_vertical.py's micro section calls this for each scheme)
# --------------------------------------------------------------------------------------
def micro_rates(scheme: str, key_bits: int, n_ops: int = 600, repeats: int = 3, obfuscation: str = "full") -> dict:
    """Operation rates of one scheme in this process, one core: the median of ``repeats`` bursts each.

    * ``enc_per_s`` / ``dec_per_s``: the key holder's batches (``encrypt_many`` / ``decrypt_many``: the C kernel
      where :func:`.native.status` says on, its tables built before timing), ``..._python``: the same batches
      with every product in Python;
    * ``mul_per_s``: ciphertext products (a homomorphic addition, the passive party's histogram step) in gmpy2,
      ``mul_per_s_native``: the same products in the C kernel (Montgomery form kept between products, as the
      histogram engine runs them), None without the kernel;
    * ``shift139_per_s``: c^(2^139) (one compression step of a 139-bit field).

    Plaintexts are random values of 140 bits (one packed (g, h) row at 53-bit precision is about that size)."""
    import statistics
    import time

    from . import native

    def rate(fn, n):
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            runs.append(n / (time.perf_counter() - t))
        return statistics.median(runs)

    kh = make_key_holder(scheme, key_bits, obfuscation, allow_insecure=True)
    key, pub = kh.key, kh.public
    if scheme == "ou":
        slow = OuPrivateKey.from_worker_state(key.worker_state())
        slow.use_native = False
    else:
        slow = PaillierPrivateKey.from_worker_state(key.worker_state())
        slow._native, slow._native_dec = [], []          # the Python products (the kernel's caches say "none")
    vals = [secrets.randbits(140) for _ in range(n_ops)]
    out = {"scheme": scheme, "key_bits": int(key_bits), "obfuscation": obfuscation, "repeats": repeats,
           "n_ops": n_ops, "bytes_per_ct": pub.ct_bytes, "usable_bits": pub.usable_bits,
           "native_kernel": native.status()}
    key.encrypt_many(vals[:8])                           # tables (and the kernel's) built before timing
    out["enc_per_s"] = rate(lambda: key.encrypt_many(vals), n_ops)
    few = vals[: max(8, n_ops // 4)]
    out["enc_per_s_python"] = rate(lambda: slow.encrypt_many(few), len(few))
    cts = key.encrypt_many(vals)
    key.decrypt_many(cts[:8])
    out["dec_per_s"] = rate(lambda: key.decrypt_many(cts), n_ops)
    out["dec_per_s_python"] = rate(lambda: slow.decrypt_many(cts[: len(few)]), len(few))
    mod = pub.modulus
    n_mul = 20 * n_ops

    def py_products():
        acc = mpz(1)
        for i in range(n_mul):
            acc = acc * cts[i % n_ops] % mod
    out["mul_per_s"] = rate(py_products, n_mul)
    nat = native.products(mod)
    out["mul_per_s_native"] = None
    if nat is not None:
        table = nat.load(cts)
        idx = np.arange(n_mul, dtype=np.int32) % n_ops
        starts = np.unique(np.r_[np.arange(0, n_mul, 320), n_mul]).astype(np.int64)   # 320 products a segment
        out["mul_per_s_native"] = rate(lambda: nat.values(nat.segment_products(table, idx, starts)), n_mul)
    out["shift139_per_s"] = rate(lambda: [pub.shift(c, 139) for c in cts[: len(few)]], len(few))
    kh.close()
    return out


# --------------------------------------------------------------------------------------
# worker-process operations (see .workers): the key holder's own processes
# --------------------------------------------------------------------------------------
def _op_key(state, args, blobs):
    st = args["state"]
    key = (OuPrivateKey if st.get("scheme") == "ou" else PaillierPrivateKey).from_worker_state(st)
    state["key"] = key
    return {}, []


def _op_enc(state, args, blobs):
    key = state["key"]
    pw = key.public.ct_bytes // 2 + 2
    w = key.public.ct_bytes
    vals = bytes_to_ints(blobs[0], pw)
    return {}, [b"".join(int(c).to_bytes(w, "big") for c in key.encrypt_many(vals))]


def _op_dec(state, args, blobs):
    key = state["key"]
    w = key.public.ct_bytes
    raw = blobs[0]
    out = key.decrypt_many(mpz.from_bytes(raw[i:i + w], "big") for i in range(0, len(raw), w))
    return {}, [ints_to_bytes(out, w // 2 + 2)]


OPS = {"key": _op_key, "enc": _op_enc, "dec": _op_dec}
