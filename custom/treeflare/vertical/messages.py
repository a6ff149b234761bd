"""Message helpers: every message is a plain dict of str/int/float/bool/None, lists, dicts,
bytes and numeric numpy arrays (FOBS-safe).  Ciphertexts travel as fixed-width big-endian
bytes concatenated in one uint8 array under a key named ``cts``.

Row alignment (:func:`alignment_value`, :func:`encrypt_alignment`, :func:`alignment_pieces`): no digest of the
ids crosses the server in the clear (issue 22).  At training setup each passive party sends the integer of a
SHA-256 over its training and test ids, beside a fresh random 256-bit *link* key, encrypted under the active
party's Paillier key (fresh randomness, so the server sees one semantically secure ciphertext and cannot confirm
a guessed id list); the active party decrypts it and compares the hash with its own.  Both keep the link in their
model parts, so a later prediction run (no Paillier key there) checks its rows with :func:`ids_mac`, an HMAC
under the link and a fresh nonce: the server never saw the link, so it can neither confirm a guess nor tell two
runs on the same rows apart.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets

import gmpy2
import numpy as np
from gmpy2 import mpz

from ..crypto import CiphertextError

# 3: sibling pairs in histogram replies (subtraction at the active party); 4: no id digest in setup, the passive
# parties' alignment value encrypted under the active party's key in setup_ok; 5: returned fields narrowed to the
# node's row count (SlotLayout.node_widths)
PROTOCOL_VERSION = 5
# what a saved model part says it is (checked when a prediction run loads it)
ACTIVE_FORMAT, PASSIVE_FORMAT = "treeflare.vertical.active/2", "treeflare.vertical.passive/2"
_ID_RE = re.compile(r"^[0-9a-f]{16}$")


class ProtocolError(RuntimeError):
    """A party received a message that breaks the protocol (malformed, unknown id, ...)."""


def ids_digest(ids) -> str:
    h = hashlib.sha256()
    for v in ids:
        h.update(str(v).encode())
        h.update(b"\x00")
    return h.hexdigest()


_ALIGNMENT_TAG, _MAC_TAG = b"treeflare.vertical.alignment/1", b"treeflare.vertical.predict-ids/1"
ALIGNMENT_BITS = LINK_BITS = 256
_LINK_RE = re.compile(r"^[0-9a-f]{64}$")
_NONCE_RE = re.compile(r"^[0-9a-f]{32}$")


def _ids_bytes(*lists):
    """Id lists as one unambiguous byte string: each list and each id length-prefixed."""
    out = []
    for ids in lists:
        out.append(len(ids).to_bytes(8, "big"))
        for v in ids:
            b = str(v).encode()
            out.append(len(b).to_bytes(8, "big") + b)
    return b"".join(out)


def alignment_value(ids_train, ids_test) -> int:
    """The integer of SHA-256 over a party's training ids, then its test ids, in row order (the order the protocol
    numbers rows in: after PSI every party's rows are sorted by id, so equal values mean the same rows in the same
    order).  Never sent in the clear."""
    return int.from_bytes(hashlib.sha256(_ALIGNMENT_TAG + _ids_bytes(ids_train, ids_test)).digest(), "big")


def alignment_pieces(value: int, pub, bits: int = ALIGNMENT_BITS + LINK_BITS) -> list:
    """``value`` (``bits`` bits) as plaintexts of this key: one for any real key (1024 bits and up), a few for the
    small test keys.  Each piece is below 2^(usable_bits - 1): the key holder's centred decryption returns it."""
    width = pub.usable_bits - 1
    return [(value >> (i * width)) & ((1 << width) - 1) for i in range(-(-bits // width))]


def join_pieces(pieces, pub) -> int:
    width = pub.usable_bits - 1
    return sum(int(v) << (i * width) for i, v in enumerate(pieces))


def split_alignment(value: int) -> tuple:
    """(the ids' hash, the link key as 64 hex digits) of a decrypted alignment value."""
    return value & ((1 << ALIGNMENT_BITS) - 1), f"{value >> ALIGNMENT_BITS:064x}"


def public_encrypt(pub, m: int):
    """E(m) under a public key alone, with fresh randomness (the key holder's batch encryption in
    :mod:`treeflare.crypto` needs the private key; this is the one value a passive party encrypts):

    * Paillier: (1 + m n) r^n mod n^2, r uniform in Z*_n;
    * Okamoto-Uchiyama: g^m h^r mod n (n = p^2 q, h = g^n), r uniform in [0, n), 0 <= m < 2^usable_bits;
    * mock (plaintext oracle): the identity."""
    if pub.scheme == "mock":
        c = mpz(m)
    elif pub.scheme == "paillier":
        n, nsq = mpz(pub.n), mpz(pub.nsq)
        while True:
            r = mpz(secrets.randbelow(int(n) - 1) + 1)
            if gmpy2.gcd(r, n) == 1:
                break
        c = (1 + (mpz(m) % n) * n) * gmpy2.powmod(r, n, nsq) % nsq
    elif pub.scheme == "ou":
        c = pub.pk.encrypt(m)          # g^m h^r mod n, r uniform in [0, n) (treeflare.crypto.ou)
    else:
        raise CiphertextError(f"no public-key encryption for scheme {pub.scheme!r}")
    pub.check(c)
    return c


def encrypt_alignment(pub, ids_train, ids_test, link: str) -> np.ndarray:
    """A passive party's alignment value and link key, encrypted under the active party's key, as a ciphertext
    array (one ciphertext for a real key)."""
    value = alignment_value(ids_train, ids_test) | (int(check_link(link), 16) << ALIGNMENT_BITS)
    return pub.serialize([public_encrypt(pub, m) for m in alignment_pieces(value, pub)])


def new_link() -> str:
    return secrets.token_hex(LINK_BITS // 8)


def new_nonce() -> str:
    return secrets.token_hex(16)


def is_link(v) -> bool:
    return isinstance(v, str) and bool(_LINK_RE.match(v))


def check_link(link) -> str:
    if not is_link(link):
        raise ProtocolError("malformed link key (64 hex digits)")
    return link


def ids_mac(link: str, nonce: str, ids) -> str:
    """HMAC-SHA256 of the ids, in row order, under the link key two parties share since training and a nonce."""
    if not isinstance(nonce, str) or not _NONCE_RE.match(nonce):
        raise ProtocolError("malformed nonce (32 hex digits)")
    msg = _MAC_TAG + bytes.fromhex(nonce) + _ids_bytes(ids)
    return hmac.new(bytes.fromhex(check_link(link)), msg, hashlib.sha256).hexdigest()


def same_mac(a, b: str) -> bool:
    return isinstance(a, str) and hmac.compare_digest(a, b)


_HEX_RE = re.compile(r"[0-9a-f]*")


def check_split_ids(ids) -> None:
    """check_split_id on every id of a list, at once (a layer's reply carries hundreds of thousands)."""
    if not all(type(x) is str and len(x) == 16 for x in ids) or not _HEX_RE.fullmatch("".join(ids)):
        for sid in ids:
            check_split_id(sid)          # names the first bad one


def check_split_id(sid) -> str:
    if not isinstance(sid, str) or not _ID_RE.match(sid):
        raise ProtocolError(f"malformed split id {sid!r}")
    return sid


def require(msg, key, types):
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a dict")
    if key not in msg:
        raise ProtocolError(f"message field {key!r} missing")
    v = msg[key]
    if types is not None:
        tt = types if isinstance(types, tuple) else (types,)
        if not isinstance(v, tt) or (isinstance(v, bool) and bool not in tt):
            raise ProtocolError(f"message field {key!r} has type {type(v).__name__}")
    return v


def expect_reply(replies, party, kind) -> dict:
    """The reply of ``party`` in ``replies``, which must be a message of type ``kind``."""
    if not isinstance(replies, dict) or party not in replies:
        raise ProtocolError(f"no reply from {party}")
    r = replies[party]
    if not isinstance(r, dict) or r.get("type") != kind:
        got = r.get("type") if isinstance(r, dict) else type(r).__name__
        detail = r.get("error") if isinstance(r, dict) else None
        raise ProtocolError(f"{party}: expected a {kind!r} reply, got {got!r}" + (f" ({detail})" if detail else ""))
    return r


def int_array(msg, key, length=None, lo=None, hi=None) -> np.ndarray:
    a = require(msg, key, np.ndarray)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise ProtocolError(f"field {key!r} must be a 1-D integer array")
    if length is not None and a.size != length:
        raise ProtocolError(f"field {key!r} has {a.size} entries, expected {length}")
    if a.size and ((lo is not None and int(a.min()) < lo) or (hi is not None and int(a.max()) > hi)):
        raise ProtocolError(f"field {key!r} has values out of range")
    return a.astype(np.int64)


def int_list(msg, key, lo=None, hi=None) -> list:
    v = require(msg, key, (list, tuple))
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise ProtocolError(f"field {key!r} must hold integers")
        x = int(x)
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise ProtocolError(f"field {key!r} value {x} out of range")
        out.append(x)
    return out


def message_stats(msg, ct_bytes: int) -> tuple:
    """(ciphertexts, approximate payload bytes) of a message."""
    n_ct = 0
    n_bytes = 0
    stack = [("", msg)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                n_bytes += len(str(k))
                stack.append((str(k), x))
        elif isinstance(v, (list, tuple)):
            # lists of ids (a layer carries hundreds of thousands): their strings counted here, the rest walked
            n_bytes += sum(len(x) for x in v if isinstance(x, str))
            stack.extend((key, x) for x in v if not isinstance(x, str))
        elif isinstance(v, np.ndarray):
            n_bytes += v.nbytes
            if key == "cts" and ct_bytes:
                n_ct += v.nbytes // ct_bytes
        elif isinstance(v, (bytes, bytearray, str)):
            n_bytes += len(v)
        else:
            n_bytes += 8
    return n_ct, n_bytes


def count_traffic(comm, messages, to: str, ct_bytes: int = 0) -> None:
    """Add messages sent to the ``to`` side ("active" or "passive") to the ``comm`` counter: how many, their
    approximate bytes and, where ``ct_bytes`` (one ciphertext's size) is given, their ciphertexts."""
    for msg in messages:
        n_ct, n_bytes = message_stats(msg, ct_bytes)
        comm[f"messages_to_{to}"] += 1
        comm[f"bytes_to_{to}"] += n_bytes
        if ct_bytes:
            comm[f"ciphertexts_to_{to}"] += n_ct


class Exchanges:
    """A protocol written as a generator of outboxes ({party: message}), run one exchange at a time:
    :meth:`send` starts it at the first call, then sends it the replies to its previous outbox, and returns
    the next outbox, or None once the protocol has finished."""

    def __init__(self, protocol):
        self._protocol, self._gen = protocol, None

    def send(self, inbox):
        if self._gen is None:
            self._gen = self._protocol()
            return next(self._gen)
        try:
            return self._gen.send(inbox)
        except StopIteration:
            return None
