"""The engine's router, and its in-process use (tests, the exactness check, benchmarks): :func:`run_protocol`
forwards each request to every site, collects the key list at setup and sends it with every later request, checks
the replies, adds the masked vectors and hands the server only their sum. The FLARE controller runs the same
function, asking the sites over FLARE instead of in this process."""

from __future__ import annotations

import time

import numpy as np

from ...crypto import secagg
from .params import BoostParams
from .secure import SecureSite
from .server import EngineError, HistServer
from .site import HistSite


class ReplyError(EngineError):
    """A site's reply that is not what the protocol asks (the message names the site)."""


def run_protocol(server: HistServer, ask, observe=None) -> dict:
    """The engine's one router (the FLARE controller and :func:`route` both run it): number each request, send the
    setup's key list with every later one, check each reply (:func:`setup_key`, :func:`masked_sum`) and hand the
    server only the sum. ``ask(request)`` returns {site: reply} from every site (or raises); ``observe(request,
    replies, answer)`` is told of each exchange. Returns the model document."""
    gen = server.run()
    req, seq, keys = next(gen), 0, None
    while True:
        req = {**req, "seq": seq}
        if req["type"] != "setup":
            req["keys"] = keys
        replies = ask(req)
        if req["type"] == "setup":
            keys = [setup_key(site, replies[site], server.n_features) for site in sorted(replies)]
            answer = replies
        else:
            answer = masked_sum(req, replies)
            server.stats["values_summed"] += int(answer.size) * len(replies)
        server.stats["requests"] += 1
        if observe is not None:
            observe(req, replies, answer)
        seq += 1
        try:
            req = gen.send(answer)
        except StopIteration as stop:
            return stop.value


def setup_key(site: str, reply, n_features: int) -> dict:
    """A site's setup reply: the run's feature count and a well-formed key announcement (the sites check the list's
    certificates themselves); ReplyError otherwise."""
    if not isinstance(reply, dict) or type(reply.get("n_features")) is not int or reply["n_features"] != n_features:
        raise ReplyError(f"{site}: setup reply without the job's feature count")
    try:
        secagg.check_key_record(reply.get("key"), site)
    except secagg.SecAggError as exc:
        raise ReplyError(f"{site}: {exc}") from None
    return reply["key"]


def masked_sum(req: dict, replies: dict) -> np.ndarray:
    """The sum mod 2^64 of every site's masked vector: one uint64 vector each, for this request, all of one length;
    ReplyError naming the first site whose reply is not."""
    size, vectors = None, []
    for site in sorted(replies):
        reply = replies[site] if isinstance(replies[site], dict) else {}
        v = reply.get("masked")
        if not isinstance(v, np.ndarray) or v.dtype != np.uint64 or v.ndim != 1 or v.size > secagg.MAX_VALUES \
                or reply.get("seq") != req["seq"]:
            raise ReplyError(f"{site}: its reply to {req['type']} request {req['seq']} is not one masked vector of "
                             "this request")
        if size is not None and v.size != size:
            raise ReplyError(f"{site}: its masked vector holds {v.size} values, another site's {size}")
        size = v.size
        vectors.append(v)
    return secagg.sum_masked(vectors)


def route(server: HistServer, sites: dict, record: list | None = None) -> dict:
    """Run ``server`` against ``sites`` (name -> SecureSite) in this process; returns the model document.
    ``record`` collects (request, {site: reply}, what the server was handed) for the privacy tests."""
    observe = None if record is None else (lambda req, replies, answer: record.append((req, replies, answer)))
    return run_protocol(server, lambda req: {name: s.handle(req) for name, s in sites.items()}, observe)


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
