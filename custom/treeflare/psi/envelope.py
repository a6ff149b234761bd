"""The parties' messages, sealed end to end: the server relays them and reads none.

Each pair of parties shares a key (``secagg.MaskingKeys.channel_key``: X25519 between the keys every party announced
and checked, signed by the startup kits' certificates outside the simulator). A message from A to B is
AES-256-GCM under that key with a 96-bit nonce of the direction and A's running count of messages to B, and the
associated data (job, sender, receiver, count): B opens only A's messages to B, in the order A sent them, each once.
A relay that drops, repeats, reorders, swaps senders or changes a byte makes the next message fail to open, and the
receiver names the sender whose message it could not read.

Inside, a message is ``u32 header length | JSON header | body`` (the body: group elements or positions as bytes);
:func:`unpack` reads it back without trusting it further than its shape.
"""

from __future__ import annotations

import json
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAX_HEADER = 4096


class EnvelopeError(ValueError):
    """A message that cannot be opened or read (the text names the sender, never the content)."""


class Channels:
    """One party's sealed channels to each other party: ``seal(to, header, body)`` and ``open(frm, blob)``."""

    def __init__(self, site: str, job_id: str, keys: dict):
        self.site, self.job_id = str(site), str(job_id)
        self._aead = {peer: AESGCM(key) for peer, key in keys.items()}
        self._sent = {peer: 0 for peer in keys}
        self._received = {peer: 0 for peer in keys}

    def _nonce_aad(self, frm: str, to: str, count: int) -> tuple[bytes, bytes]:
        direction = 0 if frm < to else 1
        nonce = struct.pack(">IQ", direction, count)
        return nonce, json.dumps([self.job_id, frm, to, count]).encode()

    def seal(self, to: str, header: dict, body: bytes = b"") -> bytes:
        if to not in self._aead:
            raise EnvelopeError(f"{self.site}: no channel to {to}")
        text = json.dumps(header, separators=(",", ":")).encode()
        nonce, aad = self._nonce_aad(self.site, to, self._sent[to])
        self._sent[to] += 1
        return self._aead[to].encrypt(nonce, struct.pack(">I", len(text)) + text + bytes(body), aad)

    def open(self, frm: str, blob: bytes) -> tuple[dict, bytes]:
        if frm not in self._aead:
            raise EnvelopeError(f"a message said to come from {str(frm)[:80]!r}, not a party of this run")
        nonce, aad = self._nonce_aad(frm, self.site, self._received[frm])
        try:
            plain = self._aead[frm].decrypt(nonce, bytes(blob), aad)
        except InvalidTag:
            raise EnvelopeError(f"a message from {frm} does not open: changed, repeated, out of order or after a "
                                "dropped one (the relay or the sender)") from None
        self._received[frm] += 1
        return unpack(plain, frm)


def unpack(plain: bytes, frm: str) -> tuple[dict, bytes]:
    if len(plain) < 4:
        raise EnvelopeError(f"a message from {frm} is shorter than its header")
    (n,) = struct.unpack(">I", plain[:4])
    if not 2 <= n <= MAX_HEADER or len(plain) < 4 + n:
        raise EnvelopeError(f"a message from {frm} has a header of a bad length")
    try:
        header = json.loads(plain[4:4 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise EnvelopeError(f"a message from {frm} has a header that is not JSON") from None
    if not isinstance(header, dict):
        raise EnvelopeError(f"a message from {frm} has a header that is not an object")
    return header, plain[4 + n:]
