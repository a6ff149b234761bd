"""Packing integers into Paillier plaintexts: several per-row values in one plaintext, and several
summed results in one returned ciphertext (the patent's compression, claims 2-4 and 6).

A *channel* is one per-row integer quantity (a one-hot label indicator, a fixed-point gradient
or hessian, a count).  A :class:`SlotLayout` gives every channel a slot of ``width`` bits so that
the sum of that channel over **any subset of at most ``n_max`` rows** fits in its slot: carries
can never cross a slot boundary (asserted at construction and at packing time).

* unsigned channel (lo >= 0): width = bitlen(n_max * hi)
* signed channel (lo < 0): width = bitlen(n_max * max(|lo|, hi)) + 1 (two's complement);
  decoding works low slot first with a borrow, so no offset has to be removed.

When all channels of a row do not fit in one plaintext (``usable_bits`` = key bits - 2), they are
split into *units*: consecutive channel groups, one plaintext (one ciphertext) each
(:meth:`SlotLayout.units`).  Summed results travel back as a stream of (item, unit) fields that
:func:`pack_plan` fills greedily into ciphertexts of ``usable_bits``; sender and receiver compute
the same plan from the same numbers, so nothing about it needs to be sent.

Typical use (summing encrypted vectors)::

    lay = SlotLayout.for_channels(lo=[0, 0, 0], hi=[1, 1, 1], n_max=10_000)   # 3 counters per row
    plain = lay.pack_rows(rows)                     # rows: int array (n, 3) -> one int per row
    cts = [key.encrypt(m) for m in plain]           # ... sum any subset homomorphically ...
    lay.unpack(key.decrypt(total), 1)               # -> [[sum0, sum1, sum2]]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SlotOverflowError(AssertionError):
    """A slot is too small for the values it must hold (detected, never silently wrong)."""


def required_width(n_max: int, lo: int, hi: int) -> int:
    n_max, lo, hi = int(n_max), int(lo), int(hi)
    if n_max < 1 or hi < lo:
        raise ValueError("bad channel bounds")
    if lo >= 0:
        return max(1, (n_max * hi).bit_length())
    return max((n_max * -lo).bit_length(), (n_max * hi).bit_length(), 1) + 1


def unpack_fields(m: int, widths, signed) -> list:
    """Decode consecutive slots (lowest first) of ``m``; raise if bits are left above the last one."""
    m = int(m)
    out = []
    for w, s in zip(widths, signed):
        v = m & ((1 << w) - 1)
        if s and v >> (w - 1):
            v -= 1 << w
        out.append(v)
        m = (m - v) >> w
    if m != 0:
        raise SlotOverflowError("packed value has bits above its last slot (overflow or corruption)")
    return out


@dataclass(frozen=True)
class SlotLayout:
    lo: tuple          # per-row lower bound per channel
    hi: tuple          # per-row upper bound per channel
    n_max: int         # most rows any sum may include
    widths: tuple      # slot width per channel (bits)

    def __post_init__(self):
        if not (len(self.lo) == len(self.hi) == len(self.widths)) or not self.lo:
            raise ValueError("slot layout: inconsistent channel count")
        for c, (lo, hi, w) in enumerate(zip(self.lo, self.hi, self.widths)):
            need = required_width(self.n_max, lo, hi)
            if int(w) < need:
                raise SlotOverflowError(
                    f"slot {c} is {w} bits but sums of {self.n_max} values in [{lo}, {hi}] need {need}")

    # construction -------------------------------------------------------------------
    @classmethod
    def for_channels(cls, lo, hi, n_max: int) -> "SlotLayout":
        lo = tuple(int(v) for v in lo)
        hi = tuple(int(v) for v in hi)
        widths = tuple(required_width(n_max, a, b) for a, b in zip(lo, hi))
        return cls(lo, hi, int(n_max), widths)

    @classmethod
    def from_message(cls, msg: dict) -> "SlotLayout":
        def num(v):
            # bounds travel as decimal strings (they can exceed 64 bits); widths and n_max as ints
            if isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, str) and len(v) > 1300):
                raise TypeError(f"bad number {type(v).__name__}")
            return int(v)
        try:
            return cls(tuple(num(v) for v in msg["lo"]), tuple(num(v) for v in msg["hi"]),
                       num(msg["n_max"]), tuple(num(v) for v in msg["widths"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"slot layout message malformed: {e}") from None

    def to_message(self) -> dict:
        return {"lo": [str(int(v)) for v in self.lo], "hi": [str(int(v)) for v in self.hi],
                "n_max": int(self.n_max), "widths": [int(v) for v in self.widths]}

    # geometry ---------------------------------------------------------------------------
    @property
    def n_channels(self) -> int:
        return len(self.widths)

    @property
    def signed(self) -> tuple:
        return tuple(lo < 0 for lo in self.lo)

    @property
    def total_width(self) -> int:
        return int(sum(self.widths))

    @property
    def offsets(self) -> tuple:
        out, acc = [], 0
        for w in self.widths:
            out.append(acc)
            acc += w
        return tuple(out)

    def values_per_ciphertext(self, usable_bits: int) -> int:
        """Whole packed rows (all channels) per plaintext of ``usable_bits``."""
        k = int(usable_bits) // self.total_width
        if k < 1:
            raise SlotOverflowError(
                f"one packed value needs {self.total_width} bits but the key offers {usable_bits}")
        return k

    def units(self, usable_bits: int, packing: bool = True) -> list:
        """Channel groups (start, stop), one plaintext each: as many consecutive channels as fit in
        ``usable_bits`` (``packing=False``: one channel per plaintext)."""
        out = []
        start, used = 0, 0
        for c, w in enumerate(self.widths):
            if w > usable_bits:
                raise SlotOverflowError(f"channel {c} needs a {w}-bit slot but the key offers {usable_bits} bits")
            if c > start and (not packing or used + w > usable_bits):
                out.append((start, c))
                start, used = c, 0
            used += w
        out.append((start, self.n_channels))
        return out

    def node_widths(self, units, n_rows: int) -> tuple:
        """Slot widths for sums over at most ``n_rows`` rows (one node's), given the layout's ``units``: the last
        channel of each unit narrows to what that many rows need, the others keep their widths, since they sit at
        the offsets the rows were packed with.  Sender and receiver both know a node's row count, so fewer fields
        travel (one more per returned ciphertext in small nodes) at no cost in what either learns."""
        n = max(1, min(int(n_rows), self.n_max))
        w = list(self.widths)
        for _a, b in units:
            w[b - 1] = min(w[b - 1], required_width(n, self.lo[b - 1], self.hi[b - 1]))
        return tuple(w)

    def unit_layout(self, start: int, stop: int) -> "SlotLayout":
        return SlotLayout(self.lo[start:stop], self.hi[start:stop], self.n_max, self.widths[start:stop])

    # packing ----------------------------------------------------------------------------
    def check_values(self, values: np.ndarray) -> None:
        """values: int array (n, channels) of per-row channel values."""
        v = np.asarray(values)
        if v.ndim != 2 or v.shape[1] != self.n_channels:
            raise ValueError("channel matrix has the wrong shape")
        if v.shape[0] > self.n_max:
            raise SlotOverflowError(f"{v.shape[0]} rows exceed the layout's n_max={self.n_max}")
        for c in range(self.n_channels):
            col = v[:, c]
            if col.size and (int(col.min()) < self.lo[c] or int(col.max()) > self.hi[c]):
                raise SlotOverflowError(f"channel {c} value outside [{self.lo[c]}, {self.hi[c]}]")

    def pack_rows(self, values: np.ndarray) -> list:
        self.check_values(values)
        offs = self.offsets
        cols = [[int(x) for x in values[:, c]] for c in range(self.n_channels)]
        out = []
        for i in range(values.shape[0]):
            m = 0
            for c, off in enumerate(offs):
                m += cols[c][i] << off
            out.append(m)
        return out

    def unpack(self, m: int, count: int = 1) -> list:
        """Decode ``count`` consecutive packed values (lowest first) from the integer m."""
        flat = unpack_fields(m, self.widths * count, self.signed * count)
        k = self.n_channels
        return [flat[i * k:(i + 1) * k] for i in range(count)]


def pack_plan(n_items: int, unit_widths, usable_bits: int, compress: bool = True) -> list:
    """How ``n_items`` results of ``len(unit_widths)`` units each travel back: a list of
    ciphertexts, each a list of (item, unit) fields, lowest bits first.  With ``compress`` the
    fields are filled greedily in item-major order while they fit in ``usable_bits``; without it,
    one field per ciphertext."""
    widths = [int(w) for w in unit_widths]
    if any(w > usable_bits for w in widths):
        raise SlotOverflowError(f"a unit of {max(widths)} bits exceeds the {usable_bits} usable bits")
    if compress and len(widths) == 1:         # one unit per item: as many whole items per ciphertext as fit
        k = usable_bits // widths[0]
        return [[(i, 0) for i in range(a, min(a + k, int(n_items)))] for a in range(0, int(n_items), k)]
    out, cur, used = [], [], 0
    for i in range(int(n_items)):
        for u, w in enumerate(widths):
            if cur and (not compress or used + w > usable_bits):
                out.append(cur)
                cur, used = [], 0
            cur.append((i, u))
            used += w
    if cur:
        out.append(cur)
    return out

