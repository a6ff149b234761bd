"""Optional C kernels for the hottest modular products of the vertical job.

* The key holder's fixed-base products (the r^n of every encryption) and its decryptions' secret powers.
* A passive party's histogram sums (segment products, in Montgomery form between steps) and compression
  (Horner packing): ``acc = acc^(2^w) * c mod n^2``, w squarings per field.

In Python each step is a gmpy2 multiplication and division.  Two kernels export the same C functions:

* ``fixed_base.c``: on CPUs with AVX-512 IFMA (52-bit multiply-add, e.g. AMD Zen 4/5, Intel Ice Lake and later),
  eight independent Montgomery products at once, one per vector lane, on 52-bit digits (about 7-10x per
  product on this project's machine);
* ``portable.c``: everywhere else (x86-64 without IFMA, aarch64), one Montgomery product at a time on 64-bit
  limbs with 128-bit products, no intrinsics: no division, no Python call per product.

Same inputs, the same integers out (checked against the Python arithmetic before a kernel is trusted for a
modulus).  ``TREEFLARE_NATIVE``: unset or 1, IFMA where the CPU has it, else portable; ``portable`` or ``ifma``,
that kernel only; ``0``, Python only.  :func:`status` (the report's ``native_kernel``) says which ran.

A kernel's source is package data (read with :mod:`importlib.resources`), compiled on first use with the system
C compiler into a private per-user cache folder (``$TREEFLARE_NATIVE_CACHE``, else ``~/.cache/treeflare``) and
loaded only after the checks of :mod:`.loader`: it runs inside the key holder, so no other user may be able to
replace it.  Without a compiler, with ``TREEFLARE_NATIVE=0`` or with a cache that fails these checks, the Python
product is used (slower, same results).  This module holds the checked Python classes around the kernels.

Decryption's exponentiations are constant-time in the secret exponent (fixed windows, every table entry
read); encryption's fixed-base table reads depend on the random exponent, as in Python (SECURITY.md).
"""
from __future__ import annotations

import ctypes
import os
import platform
import secrets
import shutil
import subprocess
import threading

import gmpy2
import numpy as np
from gmpy2 import mpz

from . import loader

_LIB = None                 # the kernel in use (a _Kernel), None before loading or when off
_STATUS = "not loaded yet"
_LOCK = threading.Lock()
_MAX_DIGITS = {52: 160, 64: 130}    # MAXL of each C source: moduli up to 8192 bits (n^2 of a 4096-bit key)
_WIRE_BLOCK = 1 << 16       # values per block of load_wire
_PORTABLE = "on (portable 64-bit C"


class _Kernel:
    """A loaded kernel: its library, its name ("ifma" or "portable"), its digit width in bits, and whether its
    values may take every digit (``full_width``: m < 2^(D L), values below 2^(D L), the portable kernel's
    "almost Montgomery" products) or leave room for the lazy bound (4m < 2^(D L), values below 2m: IFMA's)."""

    def __init__(self, lib, name: str, digit_bits: int, full_width: bool = False):
        self.lib, self.name, self.digit_bits, self.full_width = lib, name, digit_bits, full_width


def _mode() -> str:
    """``TREEFLARE_NATIVE``: "off" (0, false, no, off), "portable" or "ifma" (that kernel only), else "auto"."""
    v = os.environ.get("TREEFLARE_NATIVE", "1").strip().lower()
    return "off" if v in ("0", "false", "no", "off") else v if v in ("portable", "ifma") else "auto"


def _load():
    with _LOCK:
        return _load_locked()


def _open(cc: str, source_name: str):
    lib = loader.open_library(cc, source_name)
    loader.declare(lib)
    return lib


def _load_locked():
    """Pick the kernel once per process: IFMA where the CPU has it (x86-64 only: the file needs <immintrin.h>),
    else the portable one; an error that is not about the IFMA file itself (no compiler, an unsafe cache) turns
    both off."""
    global _LIB, _STATUS
    if _LIB is not None or _STATUS != "not loaded yet":
        return _LIB
    mode = _mode()
    if mode == "off":
        _STATUS = "off (TREEFLARE_NATIVE=0)"
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        _STATUS = "off: no C compiler found"
        return None
    why = "TREEFLARE_NATIVE=portable"
    if mode != "portable":
        if platform.machine().lower() not in ("x86_64", "amd64"):
            why = f"no AVX-512 IFMA kernel for {platform.machine() or 'this CPU'}"
        else:
            try:
                lib = _open(cc, loader.SOURCE_NAME)
            except (OSError, subprocess.SubprocessError, AttributeError) as e:
                if isinstance(e, OSError):         # the cache or the loading: the portable one would fail alike
                    _STATUS = f"off: {type(e).__name__}: {loader.reason(e)}"
                    return None
                lib, why = None, f"the AVX-512 IFMA kernel failed: {type(e).__name__}: {loader.reason(e)}"
            if lib is not None and hasattr(lib, "fb_digit_bits"):
                lib, why = None, "the AVX-512 IFMA kernel failed: another library was loaded in its place"
            if lib is not None and lib.fb_supported():
                _LIB, _STATUS = _Kernel(lib, "ifma", 52), "on (AVX-512 IFMA)"
                return _LIB
            if lib is not None:
                why = "this CPU has no AVX-512 IFMA"
        if mode == "ifma":
            _STATUS = f"off: {why} (TREEFLARE_NATIVE=ifma)"
            return None
    try:
        lib = _open(cc, loader.PORTABLE_SOURCE_NAME)
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        _STATUS = f"off: {type(e).__name__}: {loader.reason(e)}"
        return None
    lib.fb_digit_bits.restype = ctypes.c_int
    if lib.fb_digit_bits() != 64:
        _STATUS = "off: another library was loaded in place of the portable kernel"
        return None
    lib.fb_portable_adx.restype = ctypes.c_int
    how = " with mulx/adcx/adox" if lib.fb_portable_adx() else ""     # x86-64 with BMI2 and ADX, unless switched off
    _LIB, _STATUS = _Kernel(lib, "portable", 64, full_width=True), f"{_PORTABLE}{how}; {why})"
    return _LIB


def status() -> str:
    """'on (AVX-512 IFMA)', 'on (portable 64-bit C[ with mulx/adcx/adox]; <why not IFMA>)', or 'off...' with the
    reason (loads the kernel if that was not tried yet)."""
    _load()
    return _STATUS


def kernel() -> str | None:
    """Which kernel runs the products: "ifma", "portable", or None (Python's gmpy2 products)."""
    k = _load()
    return k.name if k is not None and _STATUS.startswith("on") else None


class _Modulus:
    """An odd modulus m in the kernel's form: L digits of D bits (52 for IFMA, 64 for the portable kernel), each in
    a 64-bit word: IFMA's with 4m < 2^(D L) (so Montgomery products of values below 2m stay below 2m), the
    portable kernel's with m < 2^(D L) and no spare digit (its products of values below 2^(D L) stay below it:
    one 64-bit limb fewer for the 2048- and 4096-bit moduli of a 2048-bit key, 3-6% fewer multiplications)."""

    def __init__(self, kern: _Kernel, mod):
        self._lib, d = kern.lib, kern.digit_bits
        self.mod = mpz(mod)
        bits = int(self.mod.bit_length())
        if self.mod % 2 == 0:
            raise ValueError("the C kernel needs an odd modulus")
        self.L = -(-bits // d) if kern.full_width else (bits + 2) // d + 1
        if self.L > _MAX_DIGITS[d]:
            raise ValueError(f"a {bits}-bit modulus is beyond the C kernel")
        self.n64 = (bits + 1 + 63) // 64          # results are < 2m before the last reduction
        self.shift = d * self.L
        self._minv = int((-pow(int(self.mod), -1, 1 << d)) % (1 << d))
        self._m = self._digits([self.mod])
        self._r2 = self._digits([(mpz(1) << (2 * self.shift)) % self.mod])     # R^2 mod m: into Montgomery form

    @staticmethod
    def _check(rc):
        if rc != 0:
            raise ValueError(f"the C kernel refused its arguments ({rc})")

    def _digits(self, values) -> bytes:
        # the kernel's bound on every input: below 2m, and (full-width digits) below 2^(D L)
        nb, top = 8 * self.n64, min(2 * self.mod, mpz(1) << self.shift)
        vals = [int(v) for v in values]
        if any(v < 0 or v >= top for v in vals):
            raise ValueError("a value outside [0, 2m) or beyond the C kernel's digits")
        raw = b"".join(v.to_bytes(nb, "little") for v in vals)
        count = len(raw) // nb
        out = ctypes.create_string_buffer(8 * self.L * count)
        self._lib.fb_to52_many(raw, count, self.n64, out, self.L)
        return out.raw

    def _results(self, out) -> list:
        nb, raw, m = 8 * self.n64, out.raw, self.mod
        return [mpz.from_bytes(raw[i:i + nb], "little") % m for i in range(0, len(raw), nb)]


class NativeProducts(_Modulus):
    """A passive party's ciphertext arithmetic mod n^2, eight results at once: its encrypted histograms
    (products kept in Montgomery form between steps: :meth:`load` once, :meth:`segment_products` as often as
    needed, :meth:`values` at the end) and the packing of its replies (:meth:`horner_many`)."""

    def horner_many(self, groups, widths) -> list:
        """For groups of values x_0..x_(g-1) (lowest field first) with field widths w_j, all groups the same
        shape: acc = x_(g-1); acc = acc^(2^w_j) * x_j mod m for j = g-2 .. 0."""
        groups = [list(gr) for gr in groups]
        g = len(widths)
        if not groups:
            return []
        if any(len(gr) != g for gr in groups) or g < 1:
            raise ValueError("every group needs one value per width")
        if any(not 0 <= int(w) < 2**31 for w in widths):
            raise ValueError("field widths must be in [0, 2^31)")
        return self._horner(self._digits(v for gr in groups for v in gr), len(groups), widths, self._r2)

    def horner_mont(self, table: bytes, widths) -> list:
        """:meth:`horner_many` of groups already in the kernel's Montgomery form (a :meth:`segment_products` table):
        ``table`` holds the groups one after another, ``len(widths)`` values each, lowest field first."""
        g = len(widths)
        if g < 1 or len(table) % (8 * self.L * g):
            raise ValueError("the table does not hold whole groups")
        if any(not 0 <= int(w) < 2**31 for w in widths):
            raise ValueError("field widths must be in [0, 2^31)")
        return self._horner(table, len(table) // (8 * self.L * g), widths, None)

    def _horner(self, vals: bytes, count: int, widths, r2) -> list:
        g = len(widths)
        shifts = (ctypes.c_long * max(1, g - 1))(*[int(w) for w in reversed(widths[:-1])])
        out = ctypes.create_string_buffer(8 * self.n64 * count)
        self._check(self._lib.fb_horner_many(vals, g, ctypes.cast(shifts, ctypes.c_char_p), self.L, self._m,
                                             self._minv, r2, count, out, self.n64))
        return self._results(out)

    def load(self, values) -> bytes:
        digits = self._digits(values)
        count = len(digits) // (8 * self.L)
        out = ctypes.create_string_buffer(len(digits))
        self._check(self._lib.fb_to_mont(digits, count, self.L, self._m, self._minv, self._r2, out))
        return out.raw

    def load_wire(self, raw, width: int) -> bytes:
        """:meth:`load` of values in their wire form (fixed-width ``width``-byte big-endian unsigned integers, as
        ciphertexts travel), each checked to lie in (0, m) without a Python integer per value: ValueError
        otherwise.  (Whether they are units is :meth:`product`'s to tell, with one gcd.)  Converted block by
        block, so the temporary arrays stay small beside the table."""
        width = int(width)
        if width < 1 or len(raw) % width or width > 8 * self.n64:
            raise ValueError("values of the wrong width for this modulus")
        k = len(raw) // width
        try:
            mrow = np.frombuffer(int(self.mod).to_bytes(width, "big"), dtype=np.uint8)
        except OverflowError:
            raise ValueError("values of the wrong width for this modulus") from None
        rows_all = np.frombuffer(raw, dtype=np.uint8).reshape(k, width)
        out = ctypes.create_string_buffer(8 * self.L * k)
        row = 8 * self.L
        for a in range(0, k, _WIRE_BLOCK):
            rows = rows_all[a:a + _WIRE_BLOCK]
            n = rows.shape[0]
            diff = rows != mrow
            first = diff.argmax(axis=1)                 # the first byte where a value and m differ
            below = diff.any(axis=1) & (rows[np.arange(n), first] < mrow[first])
            if not (below.all() and rows.any(axis=1).all()):
                raise ValueError("a value outside (0, m)")
            le = np.zeros((n, 8 * self.n64), dtype=np.uint8)
            le[:, :width] = rows[:, ::-1]
            digits = ctypes.create_string_buffer(row * n)
            self._lib.fb_to52_many(le.ctypes.data_as(ctypes.c_char_p), n, self.n64, digits, self.L)
            dest = ctypes.cast(ctypes.addressof(out) + a * row, ctypes.c_char_p)
            self._check(self._lib.fb_to_mont(digits, n, self.L, self._m, self._minv, self._r2, dest))
        return out.raw

    def product(self, table: bytes):
        """The product mod m of every value of a Montgomery-form table, as an integer (eight lanes' partial
        products, then their product)."""
        k = len(table) // (8 * self.L)
        if k == 0:
            return mpz(1)
        cuts = np.linspace(0, k, min(8, k) + 1).astype(np.int64)
        parts = self.values(self.segment_products(table, np.arange(k), cuts))
        acc = mpz(1)
        for v in parts:
            acc = acc * v % self.mod
        return acc

    def segment_products(self, table: bytes, idx, starts) -> bytes:
        """out[s] = prod of table[idx[i]] for i in [starts[s], starts[s+1]) (every segment non-empty)."""
        idx = np.ascontiguousarray(idx, dtype=np.int32)
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        if idx.ndim != 1 or starts.ndim != 1 or len(starts) < 1 or starts[0] != 0 or starts[-1] != len(idx):
            raise ValueError("segment starts must run from 0 to the number of indices")
        nseg = len(starts) - 1
        out = ctypes.create_string_buffer(8 * self.L * nseg)
        if nseg > 0:
            self._check(self._lib.fb_segprod(table, len(table) // (8 * self.L), idx.ctypes.data, len(idx),
                                             starts.ctypes.data, nseg, self.L, self._m, self._minv, out))
        return out.raw

    def values(self, table: bytes) -> list:
        count = len(table) // (8 * self.L)
        out = ctypes.create_string_buffer(8 * self.n64 * count)
        self._check(self._lib.fb_from_mont(table, count, self.L, self._m, self._minv, out, self.n64))
        return self._results(out)



class NativePowSec(_Modulus):
    """x^e mod m for many x and one secret exponent e (the key holder's decryption), constant-time in e."""

    def __init__(self, lib, mod, exponent):
        super().__init__(lib, mod)
        e = int(exponent)
        self._exp = e.to_bytes(max(1, (e.bit_length() + 7) // 8), "big")

    def pow_many(self, values) -> list:
        vals = self._digits(values)
        count = len(vals) // (8 * self.L)
        out = ctypes.create_string_buffer(8 * self.n64 * count)
        self._check(self._lib.fb_powm_sec_many(vals, count, self._exp, len(self._exp), self.L, self._m, self._minv,
                                               self._r2, out, self.n64))
        return self._results(out)


class NativeFixedBase(_Modulus):
    """One fixed-base table (rows of 256 entries: 8-bit digits) in Montgomery form (x 2^(52 L) mod m)."""

    def __init__(self, lib, tables, mod):
        if any(len(row) != 256 for row in tables):
            raise ValueError("the C kernel takes 8-bit windows (256 entries per row)")
        super().__init__(lib, mod)
        self.rows = len(tables)
        self._one = self._digits([(mpz(1) << self.shift) % self.mod])
        self._table = self._digits([(mpz(v) << self.shift) % self.mod for row in tables for v in row])

    def pow_many(self, exponents) -> list:
        """[prod_i table[i][byte i of e] mod m for e in exponents] (mpz)."""
        exps = list(exponents)
        digits = b"".join(int(e).to_bytes(self.rows, "little") for e in exps)
        nb = 8 * self.n64
        out = ctypes.create_string_buffer(nb * len(exps))
        self._check(self._lib.fb_pow_many(self._table, self.rows, self.L, self._m, self._minv, self._one, digits,
                                          len(exps), out, self.n64))
        return self._results(out)


def _checked(make, agrees, what: str):
    """``make(lib)``, trusted only if ``agrees(kernel)`` (its results equal ``what`` on test values); None when
    the kernel is not usable here, cannot take these arguments, or disagrees."""
    global _STATUS
    lib = _load()
    if lib is None:
        return None
    try:
        nat = make(lib)
    except ValueError:
        return None
    if not agrees(nat):
        _STATUS = f"off: the C kernel disagreed with {what}"
        return None
    return nat


def fixed_base(tables, mod, check) -> NativeFixedBase | None:
    """A :class:`NativeFixedBase` for ``tables`` mod ``mod``, checked against ``check(e)`` (the Python product)."""
    def agrees(nat):
        exps = [0, 1, (1 << (8 * nat.rows)) - 1] + [secrets.randbits(8 * nat.rows) for _ in range(13)]
        return nat.pow_many(exps) == [check(e) for e in exps]

    return _checked(lambda lib: NativeFixedBase(lib, tables, mod), agrees, "the Python product")


def products(mod) -> NativeProducts | None:
    """A :class:`NativeProducts` for values mod ``mod``, checked against gmpy2's products and powers of random
    values."""
    m = gmpy2.mpz(mod)

    def packs(nat):
        for widths in ([139, 139, 139], [7, 64, 1, 300], [5]):
            groups = [[gmpy2.mpz(secrets.randbelow(int(m))) for _ in widths] for _ in range(11)]
            want = []
            for gr in groups:
                acc = gr[-1]
                for c, w in zip(reversed(gr[:-1]), reversed(widths[:-1])):
                    acc = gmpy2.powmod(acc, gmpy2.mpz(1) << w, m) * c % m
                want.append(acc)
            if nat.horner_many(groups, widths) != want:
                return False
        return True

    def agrees(nat):
        if not packs(nat):
            return False
        vals = [gmpy2.mpz(secrets.randbelow(int(m))) for _ in range(40)]
        lens = [1, 2, 3, 17, 1, 5, 9, 1, 30, 4, 2]
        idx = [secrets.randbelow(len(vals)) for _ in range(sum(lens))]
        starts, want = [0], []
        for n_ in lens:
            acc = gmpy2.mpz(1)
            for i in idx[starts[-1]:starts[-1] + n_]:
                acc = acc * vals[i] % m
            want.append(acc)
            starts.append(starts[-1] + n_)
        return nat.values(nat.segment_products(nat.load(vals), idx, starts)) == want

    return _checked(lambda lib: NativeProducts(lib, mod), agrees, "gmpy2's products and powers")


def pow_sec(mod, exponent) -> NativePowSec | None:
    """A :class:`NativePowSec` for ``x^exponent mod mod``, checked against gmpy2's constant-time ``powmod_sec``."""
    m = gmpy2.mpz(mod)

    def agrees(nat):
        vals = [gmpy2.mpz(v) for v in (0, 1, int(m) - 1)] + [gmpy2.mpz(secrets.randbelow(int(m))) for _ in range(10)]
        return nat.pow_many(vals) == [gmpy2.powmod_sec(v, exponent, m) for v in vals]

    return _checked(lambda lib: NativePowSec(lib, mod, exponent), agrees, "gmpy2's powmod_sec")
