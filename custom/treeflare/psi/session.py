"""A party of the ECDH-PSI as the relay (the FLARE server, or :mod:`.relay` in process) talks to it: requests in,
replies out, plain dicts and uint8 arrays (no pickle).

* ``{"type": "start", "sites", "sizes", "max_ratio", "chunk"}`` -> ``{"key": record}``: the party checks the run's
  parties against its own list, every declared size against the ratio bound it allows (the lower of the job's and
  its own), makes its keys, and announces its X25519 key for the channels (``secagg.MaskingKeys``: signed by its
  startup kit's certificate where it has one). Nothing is blinded before this check passes.
* ``{"type": "round", "round": r, "inbox": [{"from", "blob"}], "keys": [...] (round 1 only)}`` ->
  ``{"outbox": [{"to", "blob"}], "done": bool}``: round 1 checks the key list (``secagg.verify_key_list``: exactly
  the run's parties, certificates from its own root CA) and opens the sealed channels (:mod:`.envelope`); every round
  opens the messages relayed to it, runs the party a step and seals what it sends.

The channel keys are bound to a digest of the start request (parties, sizes, ratio, chunk): parties told different
setups by the relay cannot read each other's messages, so they never compute on different plans.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..crypto import secagg
from .envelope import Channels, EnvelopeError
from .party import DEFAULT_MAX_RATIO, PsiError, PsiParty, check_chunk, check_ratio

MAX_SITES = 64


def blob_of(value, what: str) -> bytes:
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 1:
        raise PsiError("relay", f"{what} must be bytes (a uint8 array)")
    return value.tobytes()


class PsiSession:
    """One party's session. ``items``: its items (``"<kind>:<id>"`` strings, unique). ``sites``: the run's parties
    as this party knows them (its job configuration). ``max_ratio``: the largest ratio of one party's set to the
    largest other's this party takes part with (it takes the lower of this and the job's). ``pool``: a
    ``crypto.workers`` pool for the blinding (None: in this thread)."""

    def __init__(self, site: str, items, *, job_id: str, sites, identity=None, max_ratio: float = DEFAULT_MAX_RATIO,
                 pool=None):
        self.site, self.job_id = str(site), str(job_id)
        self.sites = sorted(str(s) for s in sites)
        self.items = items
        self.identity = identity
        self.max_ratio = check_ratio(max_ratio)
        self.pool = pool
        self.party: PsiParty | None = None
        self.keys: secagg.MaskingKeys | None = None
        self.channels: Channels | None = None
        self.digest = b""
        self.round = 0
        self.bytes_sent = 0
        self.bytes_received = 0

    def handle(self, req) -> dict:
        if not isinstance(req, dict):
            raise PsiError("relay", "the request is not a dict")
        if req.get("type") == "start":
            return self._start(req)
        if req.get("type") == "round":
            return self._round(req)
        raise PsiError("relay", "the request is neither start nor round")

    def _start(self, req) -> dict:
        if self.party is not None:
            raise PsiError("relay", "a second start in one run")
        sites = req.get("sites")
        if not isinstance(sites, list) or sorted(str(s) for s in sites) != self.sites or len(sites) > MAX_SITES:
            raise PsiError("relay", "the run's parties are not the ones this site's job names")
        job_ratio, chunk, sizes = req.get("max_ratio"), req.get("chunk"), req.get("sizes")
        try:
            ratio = min(check_ratio(job_ratio, "the job's max_ratio"), self.max_ratio)
            check_chunk(chunk)
        except ValueError as exc:
            raise PsiError("relay", f"the start request: {exc}") from None
        self.party = PsiParty(self.site, self.sites, self.items, salt=self.job_id.encode(), sizes=sizes,
                              max_ratio=ratio, chunk=chunk, pool=self.pool)
        setup = {"sites": self.sites, "sizes": {s: int(sizes[s]) for s in self.sites}, "max_ratio": float(job_ratio),
                 "chunk": self.party.chunk}
        self.digest = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).digest()
        self.keys = secagg.MaskingKeys(self.site, self.job_id, self.identity)
        return {"key": self.keys.record()}

    def _round(self, req) -> dict:
        if self.party is None:
            raise PsiError("relay", "a round before the start")
        r = req.get("round")
        if r != self.round + 1:
            raise PsiError("relay", "rounds out of order")
        self.round = r
        inbox = req.get("inbox")
        if not isinstance(inbox, list):
            raise PsiError("relay", "inbox must be a list")
        if r == 1:
            self._open_channels(req.get("keys"))
            if inbox:
                raise PsiError("relay", "messages before the first round")
            out = self.party.start()
        else:
            if "keys" in req:
                raise PsiError("relay", "keys after the first round")
            opened = []
            for msg in inbox:
                if not isinstance(msg, dict) or set(msg) != {"from", "blob"} or not isinstance(msg["from"], str) \
                        or msg["from"] not in self.sites:
                    raise PsiError("relay", "an inbox message must be {from: a party, blob}")
                blob = blob_of(msg["blob"], "an inbox message's blob")
                self.bytes_received += len(blob)
                try:
                    header, body = self.channels.open(msg["from"], blob)
                except EnvelopeError as exc:
                    raise PsiError(msg["from"], f"{exc} (or the relay told the parties different setups)") from None
                opened.append((msg["from"], header, body))
            out = self.party.step(opened)
        outbox = []
        for to, header, body in out:
            blob = self.channels.seal(to, header, body)
            self.bytes_sent += len(blob)
            outbox.append({"to": to, "blob": np.frombuffer(blob, dtype=np.uint8)})
        return {"outbox": outbox, "done": bool(self.party.done)}

    def _open_channels(self, records) -> None:
        ident = self.identity
        try:
            peers = secagg.verify_key_list(records, site=self.site, own_public=self.keys.public, job_id=self.job_id,
                                           root_ca=ident.root_ca if ident is not None else None,
                                           server_names=ident.server_names if ident is not None else None,
                                           min_sites=2, allowed_sites=self.sites)
        except secagg.SecAggError as exc:
            raise PsiError("relay", f"the key list: {exc}") from None
        if sorted(peers) != self.sites:
            raise PsiError("relay", "the key list is not one key for each of the run's parties")
        keys = {p: self.keys.channel_key(p, peers, "psi:" + self.digest.hex()) for p in self.sites if p != self.site}
        self.channels = Channels(self.site, self.job_id, keys)

    @property
    def done(self) -> bool:
        return self.party is not None and self.party.done

    def kept_items(self) -> list:
        return self.party.kept_items()
