"""What the vertical job's server and sites both name: the two tasks, the message vocabulary, and the wire form of
the messages. No NVFlare imports: tested directly.

* ``STEP`` (to the active site): ``inbox`` (the passive sites' replies the server routed to it; none on the first
  step) and, on the first step, ``params`` and ``passives`` or ``mode="predict"``; the reply holds ``done`` and
  either ``outbox`` (site -> message) or, when done, ``result``.
* ``MSG`` (to one passive site): ``msg``, one message of the active site's outbox; the reply's ``msg`` goes back.

Messages are plain dicts with a ``type``; numpy arrays travel as :func:`to_wire` dicts, inline with the task.
"""
from __future__ import annotations

import numpy as np

from ...vertical import ProtocolError

STEP, MSG = "vertical_step", "vertical_msg"
# the types of the active site's messages to a passive site, and of the passive site's replies
MSG_TYPES = frozenset({"setup", "layer", "split", "predict", "finish", "predict_setup"})
REPLY_TYPES = frozenset({"setup_ok", "hist", "partition", "predictions", "done", "predict_ok"})

_WIRE_DTYPES = {"uint8", "int32", "int64", "float64"}
_ND = "__ndarray__"


def to_wire(obj):
    """numpy arrays -> {"__ndarray__": dtype, "shape": [...], "data": bytes}: plain msgpack types that
    travel inline with the task (FOBS would fetch each array in its own download transaction)."""
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_wire(v) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype.name not in _WIRE_DTYPES:
            raise ProtocolError(f"array dtype {obj.dtype} may not cross the wire")
        a = np.ascontiguousarray(obj)
        return {_ND: a.dtype.name, "shape": [int(v) for v in a.shape], "data": a.astype(a.dtype.newbyteorder("<"),
                                                                                          copy=False).tobytes()}
    if isinstance(obj, np.generic):
        raise ProtocolError(f"numpy scalar {type(obj).__name__} may not cross the wire")
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(1 << 63) <= obj < (1 << 64):
        # FLARE's msgpack would fail while encoding the reply, after this executor returned
        raise ProtocolError("an integer beyond 64 bits may not cross the wire")
    return obj


def from_wire(obj, _depth=0):
    """Inverse of :func:`to_wire`, with checks: known dtypes only, size consistent with the shape,
    bounded nesting."""
    if _depth > 32:
        raise ProtocolError("message nested too deeply")
    if isinstance(obj, dict):
        if _ND in obj:
            dt, shape, data = obj.get(_ND), obj.get("shape"), obj.get("data")
            if dt not in _WIRE_DTYPES or not isinstance(shape, list) or not isinstance(data, (bytes, bytearray)):
                raise ProtocolError("malformed array on the wire")
            if len(shape) > 4 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in shape):
                raise ProtocolError("malformed array shape on the wire")
            dtype = np.dtype(dt).newbyteorder("<")
            if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
                raise ProtocolError("array size does not match its shape")
            return np.frombuffer(data, dtype=dtype).astype(np.dtype(dt)).reshape(shape)
        return {k: from_wire(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [from_wire(v, _depth + 1) for v in obj]
    return obj
