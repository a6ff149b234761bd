"""What stands between a site's histograms and the server: the pairwise masks of ``crypto.secagg``.

A site announces a fresh X25519 key with the setup reply (signed with its startup kit's certificate where it has
one); every later request carries the key list the server forwards, which the site checks itself on first use
(client-site certificates from its own root CA, at least ``MIN_SITES`` sites, among ``allowed_sites`` when known,
its own key unchanged) and then requires unchanged, so that no two sums are over different sets of sites. Each
vector is masked for the request's ``seq`` and a running digest of every request the site has answered, the setup
included (what a request means depends on the ones before: splits already applied, trees already added), so masks
cancel only in the sum over every listed site that was asked the same questions from the start.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ...crypto import secagg
from ...trees.validate import PayloadError
from .site import HistSite

MIN_SITES = 3  # from two sites' sum and its own vector, a site would read the other's


def request_digest(req: dict) -> bytes:
    """A digest of what a request asks (its keys aside): masks cancel only between sites asked the same."""
    body = {k: v for k, v in req.items() if k != "keys"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=_plain).encode()).digest()


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON: {type(v).__name__}")


class SecureSite:
    """A :class:`HistSite` whose summed answers leave it masked."""

    def __init__(self, site: HistSite, job_id: str, identity=None, allowed_sites=None, min_sites: int = MIN_SITES):
        self.site, self.job_id, self.identity = site, str(job_id), identity
        self.allowed_sites = None if allowed_sites is None else frozenset(allowed_sites)
        self.min_sites = int(min_sites)
        self.keys = secagg.MaskingKeys(site.name, self.job_id, identity)
        self.peers = None
        self.transcript = b""  # SHA-256 chain over every request answered in this run

    def _chain(self, req) -> bytes:
        self.transcript = hashlib.sha256(self.transcript + request_digest(req)).digest()
        return self.transcript

    def handle(self, req) -> dict:
        if isinstance(req, dict) and req.get("type") == "setup":
            reply = {**self.site.handle(req), "key": self.keys.record()}
            self._chain(req)
            return reply
        if not isinstance(req, dict):
            raise PayloadError("request", "expected a dict")
        ident = self.identity
        peers = secagg.verify_key_list(req.get("keys"), site=self.site.name, own_public=self.keys.public,
                                       job_id=self.job_id, root_ca=ident.root_ca if ident is not None else None,
                                       server_names=ident.server_names if ident is not None else None,
                                       min_sites=self.min_sites, allowed_sites=self.allowed_sites)
        if self.peers is not None and peers != self.peers:
            raise PayloadError("keys", "differ from the sites of this run's first sum")
        out = self.site.handle(req)
        self.peers = peers
        masked = self.keys.mask(out["values"], peers, int(req["seq"]), context=self._chain(req))
        return {"masked": masked, "seq": int(req["seq"])}
