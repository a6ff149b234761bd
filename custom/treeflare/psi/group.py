"""The group the ECDH-PSI computes in: X25519 (RFC 7748) as OpenSSL implements it, through the ``cryptography``
package; no curve arithmetic of ours.

**Hashing onto it.** An item becomes ``u = SHA-256(DOMAIN | salt | item)``, read as an X25519 u-coordinate (RFC
7748 masks the top bit and reduces mod p = 2^255 - 19). Every u is the x-coordinate of a point on Curve25519 or on
its quadratic twist; a random u is a uniform x-coordinate of the union (each curve has about p points). X25519's
Montgomery ladder computes ``x(k P)`` on whichever of the two the point lies, and a clamped scalar k is a multiple
of 8, so the result lies in a subgroup of prime order: l (about 2^252) on the curve, l' (about 2^253, the twist's
large prime factor: Curve25519 was chosen twist-secure for this) on the twist. Hence:

* commutativity: ``X25519(a, X25519(b, u)) = x(ab P) = X25519(b, X25519(a, u))`` for any keys a, b;
* hiding: the values ``x(k P)`` of a secret k are pseudorandom under the decisional Diffie-Hellman assumption in
  both prime-order subgroups (the assumption X25519 key agreement rests on), with H a random oracle onto them;
* no collisions but by chance: distinct items map to equal values only if their u collide or their points differ by
  a point of order 8 or sign (x-only), each about 2^-250 per pair.

A u of small order (a handful of values) makes OpenSSL refuse the product (the all-zero result): an honest item hits
one with probability about 2^-250; a value a party receives that does is refused, naming the party that sent it.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

POINT_BYTES = 32  # one group element on the wire (an X25519 u-coordinate)
MATCH_BYTES = 16  # what is compared of a fully blinded value: a collision among 10^6 x 10^6 values is ~2^-88
DOMAIN = b"treeflare.psi.x25519.v1|"


class GroupError(ValueError):
    """A value that is not a usable group element (``index`` names which one, never the value)."""

    def __init__(self, index: int):
        super().__init__(f"element {index} is not a usable X25519 point (small order)")
        self.index = int(index)


def new_key() -> bytes:
    """A fresh secret scalar (32 bytes, clamped by X25519 at every use)."""
    return X25519PrivateKey.generate().private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                                     serialization.NoEncryption())


def hash_items(items, salt: bytes) -> bytes:
    """Each item (a str) as a u-coordinate, concatenated: ``len(items) * POINT_BYTES`` bytes."""
    prefix = hashlib.sha256(DOMAIN + bytes(salt))
    out = bytearray()
    for item in items:
        h = prefix.copy()
        h.update(str(item).encode("utf-8"))
        out += h.digest()
    return bytes(out)


def blind(key: bytes, points: bytes) -> bytes:
    """Every 32-byte element of ``points`` multiplied by ``key``: X25519(key, u) each, concatenated."""
    if len(points) % POINT_BYTES:
        raise ValueError(f"points must be a multiple of {POINT_BYTES} bytes")
    exchange = X25519PrivateKey.from_private_bytes(bytes(key)).exchange
    load = X25519PublicKey.from_public_bytes
    view = memoryview(points)
    out = bytearray(len(points))
    i = 0
    try:
        for i in range(0, len(points), POINT_BYTES):
            out[i:i + POINT_BYTES] = exchange(load(view[i:i + POINT_BYTES].tobytes()))
    except ValueError:
        raise GroupError(i // POINT_BYTES) from None
    return bytes(out)


def match_keys(points: bytes) -> list[bytes]:
    """The compared part (the first ``MATCH_BYTES``) of each fully blinded value."""
    return [points[i:i + MATCH_BYTES] for i in range(0, len(points), POINT_BYTES)]


# a worker pool's operations (crypto.workers / crypto.dask_pool): the party's key and a piece of a chunk in, the
# piece blinded out; a small-order element comes back as its index in the piece
def _op_blind(state, args, blobs):
    key, points = blobs
    try:
        return {"bad": -1}, [blind(key, points)]
    except GroupError as exc:
        return {"bad": exc.index}, [b""]


OPS = {"psi_blind": _op_blind}
