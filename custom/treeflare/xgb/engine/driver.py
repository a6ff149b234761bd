"""In-process router of the engine (tests, the exactness check, benchmarks): it does what the FLARE controller
does, on the same objects: forwards each request to every site, collects the key list at setup and sends it with
every later request, adds the masked vectors and hands the server only their sum."""

from __future__ import annotations

import time

import numpy as np

from ...crypto import secagg
from .params import BoostParams
from .secure import SecureSite
from .server import HistServer
from .site import HistSite


def route(server: HistServer, sites: dict, record: list | None = None) -> dict:
    """Run ``server`` against ``sites`` (name -> SecureSite); returns the model document. ``record`` collects
    (request, {site: reply}, what the server was handed) for the privacy tests."""
    gen = server.run()
    req, seq, keys = next(gen), 0, None
    while True:
        req = {**req, "seq": seq}
        if req["type"] == "setup":
            replies = {name: s.handle(req) for name, s in sites.items()}
            keys = [replies[name]["key"] for name in sorted(replies)]
            answer = replies
        else:
            req["keys"] = keys
            replies = {name: s.handle(req) for name, s in sites.items()}
            answer = secagg.sum_masked([replies[name]["masked"] for name in sorted(replies)])
            server.stats["values_summed"] += int(answer.size) * len(replies)
        server.stats["requests"] += 1
        if record is not None:
            record.append((req, replies, answer))
        seq += 1
        try:
            req = gen.send(answer)
        except StopIteration as stop:
            return stop.value


def train(parts, params: BoostParams, *, valid=None, feature_names=None, job_id: str = "inprocess",
          record: list | None = None, workers=0) -> tuple[dict, HistServer]:
    """Train on ``parts`` = [(X, y), ...], one per site (``valid``: [(X, y), ...] or None); returns (model document,
    server)."""
    n_features = np.asarray(parts[0][0]).shape[1]
    names = [f"site-{i + 1}" for i in range(len(parts))]
    valid = valid or [(None, None)] * len(parts)
    sites = {n: SecureSite(HistSite(n, X, y, Xv, yv, workers=workers), job_id)
             for n, (X, y), (Xv, yv) in zip(names, parts, valid)}
    server = HistServer(params, n_features, feature_names)
    t = time.perf_counter()
    try:
        doc = route(server, sites, record)
    finally:
        for s in sites.values():
            s.site.close()
    server.stats["seconds"] = time.perf_counter() - t
    return doc, server
