"""Slot layouts: packing several integer channels into one plaintext, and several packed
results into one ciphertext (the patent's compression, claims 2-4 and 6).

A *channel* is one per-sample integer quantity (a one-hot label indicator, a fixed-point
gradient or hessian).  A slot layout gives every channel a slot of ``width`` bits so that the
sum of that channel over **any subset of at most ``n_max`` samples** fits in its slot: carries
can never cross a slot boundary (asserted at construction and at packing time).

* unsigned channel (lo >= 0): width = bitlen(n_max * hi)
* signed channel (lo < 0): width = bitlen(n_max * max(|lo|, hi)) + 1 (two's complement);
  decoding works low slot first with a borrow, so no offset has to be removed.

Values per ciphertext for the returned split statistics = ``usable_bits // total_width``
(``usable_bits`` = key bits - 2, so any packed value M has |M| < n/2 and the centred
decryption is unambiguous).
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


@dataclass(frozen=True)
class SlotLayout:
    lo: tuple          # per-sample lower bound per channel
    hi: tuple          # per-sample upper bound per channel
    n_max: int         # most samples any sum may include
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
        try:
            return cls(tuple(int(v) for v in msg["lo"]), tuple(int(v) for v in msg["hi"]),
                       int(msg["n_max"]), tuple(int(v) for v in msg["widths"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"slot layout message malformed: {e}") from None

    def to_message(self) -> dict:
        return {"lo": [int(v) for v in self.lo], "hi": [int(v) for v in self.hi],
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
        k = int(usable_bits) // self.total_width
        if k < 1:
            raise SlotOverflowError(
                f"one packed value needs {self.total_width} bits but the key offers {usable_bits}")
        return k

    def channel_layout(self, c: int) -> "SlotLayout":
        return SlotLayout((self.lo[c],), (self.hi[c],), self.n_max, (self.widths[c],))

    # packing ----------------------------------------------------------------------------
    def check_values(self, values: np.ndarray) -> None:
        """values: int array (n, channels) of per-sample channel values."""
        v = np.asarray(values)
        if v.ndim != 2 or v.shape[1] != self.n_channels:
            raise ValueError("channel matrix has the wrong shape")
        if v.shape[0] > self.n_max:
            raise SlotOverflowError(f"{v.shape[0]} samples exceed the layout's n_max={self.n_max}")
        for c in range(self.n_channels):
            col = v[:, c]
            if col.size and (int(col.min()) < self.lo[c] or int(col.max()) > self.hi[c]):
                raise SlotOverflowError(f"channel {c} value outside [{self.lo[c]}, {self.hi[c]}]")

    def pack(self, vec) -> int:
        m = 0
        for v, off in zip(vec, self.offsets):
            m += int(v) << off
        return m

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
        m = int(m)
        out = []
        signed = self.signed
        for _ in range(count):
            vec = []
            for w, s in zip(self.widths, signed):
                v = m & ((1 << w) - 1)
                if s and v >> (w - 1):
                    v -= 1 << w
                vec.append(v)
                m = (m - v) >> w
            out.append(vec)
        if m != 0:
            raise SlotOverflowError("packed value has bits above its last slot (overflow or corruption)")
        return out


def compress_plan(n_items: int, k: int) -> list:
    """Group ``n_items`` consecutive items into ciphertexts of at most k items each."""
    return [(i, min(i + k, n_items)) for i in range(0, n_items, k)]
