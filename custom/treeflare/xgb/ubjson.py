"""A bounded decoder of UBJSON (draft 12), the binary JSON XGBoost writes for ``save_model("*.ubj")``.

Read here so that a model file is checked before XGBoost sees it (``model_file.py``); what XGBoost writes is
covered: objects, arrays (plain, counted, typed), integers, floats, strings, booleans, null. Bounded: nesting at
most ``max_depth``, every count at most the bytes left, so a hostile file cannot make it recurse or allocate
without limit.
"""

from __future__ import annotations

import numpy as np


class UBJSONError(ValueError):
    """Not a well-formed UBJSON document; the message says where (byte offset)."""


def decode_ubjson(data: bytes, max_depth: int = 64):
    """The document ``data`` holds, as Python values (typed numeric arrays become lists)."""
    return _UBJReader(data, max_depth).document()


class _UBJReader:
    """UBJSON (draft 12) as XGBoost writes it: objects, arrays (typed and counted ones too), integers, floats,
    strings. Bounded: nesting at most ``max_depth``, every count at most the bytes left."""

    _SCALARS = {b"i": ">i1", b"U": ">u1", b"I": ">i2", b"l": ">i4", b"L": ">i8", b"d": ">f4", b"D": ">f8"}

    def __init__(self, data: bytes, max_depth: int):
        self.data, self.pos, self.max_depth = data, 0, max_depth

    def document(self):
        value = self._value(self._marker(), 0)
        if self.pos != len(self.data):
            raise UBJSONError(f"{len(self.data) - self.pos} bytes after the document")
        return value

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise UBJSONError(f"truncated at byte {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def _marker(self) -> bytes:
        m = self._take(1)
        while m == b"N":  # no-op
            m = self._take(1)
        return m

    def _count(self, marker: bytes) -> int:
        if marker not in (b"i", b"U", b"I", b"l", b"L"):
            raise UBJSONError(f"expected a length at byte {self.pos - 1}, got marker {marker!r}")
        n = int(self._scalar(marker))
        if n < 0 or n > len(self.data) - self.pos + 1:
            raise UBJSONError(f"length {n} at byte {self.pos} runs past the end of the file")
        return n

    def _scalar(self, marker: bytes):
        dtype = np.dtype(self._SCALARS[marker])
        return np.frombuffer(self._take(dtype.itemsize), dtype=dtype)[0].item()

    def _string(self) -> str:
        raw = self._take(self._count(self._marker()))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UBJSONError(f"a string before byte {self.pos} is not UTF-8") from None

    def _value(self, m: bytes, depth: int):
        if m in self._SCALARS:
            return self._scalar(m)
        if m == b"S" or m == b"H":  # a high-precision number stays its text
            return self._string()
        if m == b"C":
            return self._take(1).decode("latin-1")
        if m in (b"T", b"F", b"Z"):
            return {b"T": True, b"F": False, b"Z": None}[m]
        if m in (b"[", b"{"):
            if depth >= self.max_depth:
                raise UBJSONError(f"nested deeper than {self.max_depth} at byte {self.pos}")
            return self._container(m == b"{", depth + 1)
        raise UBJSONError(f"unknown marker {m!r} at byte {self.pos - 1}")

    def _container(self, is_object: bool, depth: int):
        close = b"}" if is_object else b"]"
        item_type, count = None, None
        m = self._marker()
        if m == b"$":
            item_type = self._take(1)
            if item_type in (b"[", b"{") or self._marker() != b"#":
                raise UBJSONError(f"a typed container needs a scalar type and a count (byte {self.pos - 1})")
            m = b"#"
        if m == b"#":
            count = self._count(self._marker())
            m = None
            if not is_object and item_type in self._SCALARS:  # a typed array: one block of big-endian numbers
                dtype = np.dtype(self._SCALARS[item_type])
                return np.frombuffer(self._take(count * dtype.itemsize), dtype=dtype).tolist()
        out = {} if is_object else []
        read = 0  # items read (an object's repeated key does not grow it)
        while count is None or read < count:
            if count is None:
                m = m or self._marker()
                if m == close:
                    return out
            if is_object:
                key_length = self._count(m or self._marker())
                try:
                    key = self._take(key_length).decode("utf-8")
                except UnicodeDecodeError:
                    raise UBJSONError(f"a key before byte {self.pos} is not UTF-8") from None
                out[key] = self._value(item_type or self._marker(), depth)
            else:
                out.append(self._value(item_type or m or self._marker(), depth))
            m, read = None, read + 1
        return out
