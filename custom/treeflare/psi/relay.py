"""The server's side of the ECDH-PSI: a relay of sealed messages, which it checks for shape and size only (it
holds no key and opens none), and :func:`run_in_process`, the same relay talking to :class:`.session.PsiSession`
objects directly (tests, benchmarks).

:func:`relay` is a generator: it yields ``{site: request}`` each round and is sent ``{site: reply}``; the FLARE
controller (``flare/psi/ecdh.py``) and :func:`run_in_process` both drive it, so every check runs in both.
"""

from __future__ import annotations

import math

import numpy as np

from ..crypto import secagg
from . import group
from .party import CHUNK, PAD_FACTOR, PsiError, check_chunk, check_ratio, check_sizes

HEADER_ROOM = 4096 + 16 + 64  # a message's header, GCM tag and framing, beside its body


def max_rounds(sizes, chunk: int) -> int:
    """Rounds an honest run needs at most: every list's chunks through its chain, then the finish, with room."""
    longest = math.ceil(max(sizes.values()) / chunk)
    return longest + 2 * len(sizes) + 8


def max_messages(sizes, chunk: int) -> int:
    """The most messages an honest party sends in one round: a chunk of each list it passes on, its own, and the
    leader's padded intersection, all of it in one round."""
    return 4 * len(sizes) + 64 + math.ceil(PAD_FACTOR * max(sizes.values()) / chunk)


def max_blob(sizes, chunk: int) -> int:
    """The largest message an honest party sends: a chunk of a list, or all positions of the intersection."""
    return HEADER_ROOM + max(chunk * group.POINT_BYTES, 8 * min(sizes.values()))


def relay(sites, sizes, *, max_ratio: float, chunk: int = CHUNK):
    """The relay of one run; returns ``{"rounds", "bytes_relayed", "messages"}``. Raises :class:`PsiError` naming the
    site whose reply breaks the protocol's shape (or that takes part in no way it should)."""
    sites = sorted(str(s) for s in sites)
    sizes = check_sizes(sizes, sites, check_ratio(max_ratio))
    start = {"type": "start", "sites": sites, "sizes": dict(sizes), "max_ratio": float(max_ratio), "chunk": int(chunk)}
    replies = yield {s: dict(start) for s in sites}
    keys = []
    for s in sites:
        reply = replies.get(s)
        if not isinstance(reply, dict) or set(reply) != {"key"}:
            raise PsiError(s, "its start reply must be {key}")
        try:
            secagg.check_key_record(reply["key"], s)
        except secagg.SecAggError as exc:
            raise PsiError(s, str(exc)) from None
        keys.append(reply["key"])
    check_chunk(chunk)
    limit, biggest, most = max_rounds(sizes, chunk), max_blob(sizes, chunk), max_messages(sizes, chunk)
    inbox = {s: [] for s in sites}
    relayed = messages = 0
    for r in range(1, limit + 1):
        reqs = {s: {"type": "round", "round": r, "inbox": inbox[s], **({"keys": keys} if r == 1 else {})}
                for s in sites}
        replies = yield reqs
        inbox = {s: [] for s in sites}
        all_done = True
        for s in sites:
            reply = replies.get(s)
            if not isinstance(reply, dict) or set(reply) != {"outbox", "done"} or not isinstance(reply["done"], bool) \
                    or not isinstance(reply["outbox"], list) or len(reply["outbox"]) > most:
                raise PsiError(s, "its round reply must be {outbox: a list of messages, done: a bool}")
            for msg in reply["outbox"]:
                if not isinstance(msg, dict) or set(msg) != {"to", "blob"} or not isinstance(msg["to"], str) \
                        or msg["to"] not in inbox or msg["to"] == s:
                    raise PsiError(s, "a message must be {to: another party of the run, blob}")
                blob = msg["blob"]
                if not isinstance(blob, np.ndarray) or blob.dtype != np.uint8 or blob.ndim != 1:
                    raise PsiError(s, "a message's blob must be bytes (a uint8 array)")
                if blob.size > biggest:
                    raise PsiError(s, f"sent a message of {blob.size} bytes, more than any step of the protocol sends")
                inbox[msg["to"]].append({"from": s, "blob": blob})  # the sender is who replied, never what it says
                relayed += int(blob.size)
                messages += 1
            all_done &= reply["done"]
        if all_done and not any(inbox.values()):
            return {"rounds": r, "bytes_relayed": relayed, "messages": messages}
    raise PsiError("relay", f"the parties did not finish within {limit} rounds (a party that sends nothing, or "
                            "messages that go nowhere)")


def run_in_process(sessions: dict, sizes, *, max_ratio: float, chunk: int = CHUNK, transcript: list | None = None):
    """Run :func:`relay` against ``{site: PsiSession}``, one after the other each round; ``transcript`` (a list)
    gets every request and reply that crosses the relay, as the server would see them."""
    gen = relay(list(sessions), sizes, max_ratio=max_ratio, chunk=chunk)
    reqs = next(gen)
    while True:
        replies = {}
        for site, req in reqs.items():
            replies[site] = sessions[site].handle(req)
            if transcript is not None:
                transcript.append(("request", site, req))
                transcript.append(("reply", site, replies[site]))
        try:
            reqs = gen.send(replies)
        except StopIteration as stop:
            return stop.value

