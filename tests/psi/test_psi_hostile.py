"""Hostile parties and a hostile relay against the ECDH-PSI (``treeflare.psi``), in process. A hostile party holds
its channel keys and controls every field of what it sends at once (headers consistent with the lie, bodies of the
right length); the relay controls what it forwards. Each case must stop the honest party that meets it with a
``PsiError`` naming the one at fault, before anything is kept."""

from __future__ import annotations

import numpy as np
import pytest
from test_psi_protocol import JOB, sessions_for, world

from treeflare.psi import group
from treeflare.psi.party import PsiError, PsiParty
from treeflare.psi.relay import relay, run_in_process
from treeflare.psi.session import PsiSession


def hostile(session: PsiSession, change):
    """Make ``session``'s party send ``change(out)`` of what it would send each step (a list of (to, header, body))."""
    real = PsiParty.step

    def step(inbox, party=None):
        return change(real(session.party, inbox))

    original_handle = session.handle

    def handle(req):
        if session.party is not None and not getattr(session.party, "_hostile", False):
            session.party.step = step
            session.party._hostile = True
        return original_handle(req)

    session.handle = handle
    return session


def run_with(items, chunk, make_hostile: dict) -> tuple[dict, Exception]:
    sessions = sessions_for(items)
    for site, change in make_hostile.items():
        hostile(sessions[site], change)
    with pytest.raises(PsiError) as exc:
        run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=chunk)
    for s in sessions.values():  # nobody kept anything
        assert s.party is None or s.party.kept is None or not s.done or s.party.site in make_hostile
    return sessions, exc.value


def edit_lists(fn):
    """A change applied to every list chunk the hostile party sends (its own list's first hop)."""
    def change(out):
        return [(to, *fn(h, b)) if h.get("t") == "list" else (to, h, b) for to, h, b in out]
    return change


def test_a_party_streaming_more_items_than_it_declared_is_refused_by_name():
    items, _ = world(3, 60, 20)

    def more(h, b):  # one more element, every field consistent with 61 items in this chunk
        return {**h, "count": h["count"] + 1}, b + b[:32]
    _, err = run_with(items, 16, {"site-3": edit_lists(more)})
    assert err.site == "site-3" and "does not continue it as declared (60 items" in str(err)


def test_a_party_sending_a_point_of_small_order_is_refused_by_name():
    items, _ = world(2, 40, 10)
    _, err = run_with(items, 16, {"site-2": edit_lists(lambda h, b: (h, bytes(32) + b[32:]))})
    assert err.site == "site-2" and "not a usable X25519 point" in str(err)


@pytest.mark.parametrize("culprit", ["site-2", "site-3"])
def test_one_value_for_two_items_is_refused_naming_the_party_that_sent_it(culprit):
    """Its own list or one it passes on: the first party to receive the repeat names its sender (distinct items stay
    distinct under any keys, so the sender made it)."""
    items, _ = world(3, 30, 10)

    def dup(h, b):
        return h, b[:32] + b[:32] + b[64:]
    _, err = run_with(items, 64, {culprit: edit_lists(dup)})
    assert err.site == culprit and "with a value twice" in str(err)


def test_a_party_sending_its_whole_list_in_one_round_is_refused():
    """An honest chain passes one chunk of a list a round: a burst (all of a list at once, each chunk well formed)
    would make the next party blind it all in one request, past its timeout."""
    items, _ = world(2, 40, 10)
    state = {}

    def burst(out):
        if state:
            return [(to, h, b) for to, h, b in out if h.get("t") != "list" or h.get("owner") != "site-2"]
        state["sent"] = True
        party = SESSIONS["site-2"].party
        chunks = []
        for start in range(0, 40, 8):
            u = group.hash_items([party.items[i] for i in party.order[start:start + 8]], JOB.encode())
            chunks.append(("site-1", {"t": "list", "owner": "site-2", "hop": 1, "start": start, "count": 8},
                           group.blind(party.key, u)))
        return [(to, h, b) for to, h, b in out if h.get("t") != "list"] + chunks
    SESSIONS.clear()
    sessions = sessions_for(items)
    SESSIONS.update(sessions)
    hostile(sessions["site-2"], burst)
    with pytest.raises(PsiError) as exc:
        run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=8)
    assert exc.value.site == "site-2" and "more than one chunk of site-2's list in one round" in str(exc.value)


SESSIONS: dict = {}


def test_a_chunk_sent_out_of_its_chain_or_as_another_owner_is_refused():
    items, _ = world(3, 30, 10)

    def as_other(out):
        return [(to, {**h, "owner": "site-1"} if h.get("t") == "list" else h, b) for to, h, b in out]
    _, err = run_with(items, 64, {"site-3": as_other})
    assert err.site == "site-3" and "out of its chain" in str(err)

    def elsewhere(out):  # site-3's list sent straight to the leader, skipping site-2
        return [("site-1" if h.get("t") == "list" and h.get("owner") == "site-3" else to, h, b) for to, h, b in out]
    _, err = run_with(items, 64, {"site-3": elsewhere})
    assert err.site == "site-3" and "out of its chain" in str(err)


def rewrite_matches(change):
    """A comparer's change to its matches message: ``change(where, hits) -> (where, hits)``, the header's counts made
    to agree (every field consistent with the lie)."""
    def edit(out):
        res = []
        for to, h, b in out:
            if h.get("t") == "matches":
                n = h["count"]
                where, hits = change(np.frombuffer(b[:4 * n], "<u4"), np.frombuffer(b[4 * n:], "<u4"))
                h, b = {**h, "count": len(where), "z": len(hits)}, where.astype("<u4").tobytes() + \
                    hits.astype("<u4").tobytes()
            res.append((to, h, b))
        return res
    return edit


def test_a_comparer_claiming_a_padding_value_is_caught_by_the_leader():
    items, _ = world(3, 40, 10)  # Z holds 4 x 40 values: 12 shared, the rest padding

    def claim_all(where, hits):  # n+1 positions, n+1 hits: the first n+1 values of Z
        return np.arange(len(where) + 1), np.arange(len(hits) + 1)
    _, err = run_with(items, 64, {"site-2": rewrite_matches(claim_all)})
    assert err.site == "site-2" and "claimed a match on a padding value" in str(err)


@pytest.mark.parametrize("positions", [[5, 3], [0, 10_000], [1, 1]])
def test_a_leader_sending_positions_that_are_not_positions_is_refused(positions):
    items, _ = world(3, 40, 10)

    def bad(out):
        return [(to, {**h, "count": len(positions)}, np.array(positions, "<u4").tobytes()) if h.get("t") == "positions"
                else (to, h, b) for to, h, b in out]
    _, err = run_with(items, 64, {"site-1": bad})
    assert err.site == "site-1" and "not increasing positions" in str(err)


def test_a_message_nobody_expects_now_is_refused():
    items, _ = world(2, 20, 5)

    sent = []

    def early(out):  # matches before site-2 could have compared anything
        sent.append(1)
        return out + [("site-1", {"t": "matches", "count": 0}, b"")] if len(sent) == 1 else out
    _, err = run_with(items, 8, {"site-2": early})
    assert err.site == "site-2" and "does not expect" in str(err)


# ---- a hostile relay ---------------------------------------------------------------------------------------------

def relay_run(items, tamper, chunk=16):
    """The relay, with ``tamper(round, reqs)`` changing the requests it forwards."""
    sessions = sessions_for(items)
    gen = relay(list(sessions), {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=chunk)
    reqs, r = next(gen), 0
    with pytest.raises(PsiError) as exc:
        while True:
            reqs = tamper(r, reqs)
            reqs = gen.send({s: sessions[s].handle(q) for s, q in reqs.items()})
            r += 1
    return exc.value


def test_a_relay_that_drops_repeats_reorders_or_changes_a_message_is_caught():
    items, _ = world(2, 40, 10)

    def drop(r, reqs):
        if r == 2:
            reqs["site-2"]["inbox"] = reqs["site-2"]["inbox"][1:]
        return reqs
    err = relay_run(items, drop)
    assert err.site == "site-1" and "does not open" in str(err)

    kept = {}

    def repeat(r, reqs):
        if r == 2:
            kept["m"] = reqs["site-2"]["inbox"][0]
        if r == 3:
            reqs["site-2"]["inbox"] = [kept["m"]] + reqs["site-2"]["inbox"]
        return reqs
    assert "does not open" in str(relay_run(items, repeat))

    def flip(r, reqs):
        if r == 2:
            blob = reqs["site-1"]["inbox"][0]["blob"].copy()
            blob[40] ^= 1
            reqs["site-1"]["inbox"][0] = {"from": "site-2", "blob": blob}
        return reqs
    err = relay_run(items, flip)
    assert err.site == "site-2" and "does not open" in str(err)


def test_a_relay_telling_the_parties_different_setups_gets_no_message_read():
    items, _ = world(2, 40, 10)

    def sizes(r, reqs):
        if r == 0:  # site-2 told a chunk of 8: consistent sizes, another plan
            reqs["site-2"] = {**reqs["site-2"], "chunk": 8}
        return reqs
    err = relay_run(items, sizes)
    assert "does not open" in str(err) and "different setups" in str(err)


def test_a_relay_swapping_senders_or_sending_rounds_out_of_order_is_caught():
    items, _ = world(3, 30, 10)

    def swap(r, reqs):
        if r == 2 and reqs["site-2"]["inbox"]:
            reqs["site-2"]["inbox"] = [{**m, "from": "site-1" if m["from"] == "site-3" else "site-3"}
                                       for m in reqs["site-2"]["inbox"]]
        return reqs
    assert "does not open" in str(relay_run(items, swap))

    def again(r, reqs):
        if r == 2:
            reqs["site-1"] = {**reqs["site-1"], "round": 1}
        return reqs
    err = relay_run(items, again)
    assert err.site == "relay" and "rounds out of order" in str(err)


def test_the_relay_refuses_replies_of_no_protocol_shape_naming_the_site():
    sites = ["site-1", "site-2"]
    sizes = {"site-1": 10, "site-2": 10}
    good_key = PsiSession("site-1", ["train:a"] * 0 + [f"train:{i}" for i in range(10)], job_id=JOB,
                          sites=sites).handle({"type": "start", "sites": sites, "sizes": sizes, "max_ratio": 10.0,
                                               "chunk": 4})
    cases = [
        ({"key": "nope"}, None, "key of site-2"),
        (good_key, {"outbox": [{"to": "site-2", "blob": np.zeros(3, np.uint8)}], "done": False}, "another party"),
        (good_key, {"outbox": [{"to": "site-1", "blob": np.zeros(10**6, np.uint8)}], "done": False},
         "more than any step"),
        (good_key, {"outbox": [{"to": "site-1", "blob": b"raw"}], "done": False}, "must be bytes"),
        (good_key, {"outbox": [], "done": "yes"}, "must be {outbox"),
    ]
    for start_reply, round_reply, text in cases:
        gen = relay(sites, sizes, max_ratio=10, chunk=4)
        next(gen)
        other = {**good_key, "key": {**good_key["key"], "site": "site-2"}}
        with pytest.raises(PsiError) as exc:
            gen.send({"site-1": good_key, "site-2": start_reply if start_reply is not good_key else other})
            gen.send({"site-1": {"outbox": [], "done": False}, "site-2": round_reply})
        assert exc.value.site == "site-2" and text in str(exc.value), text


def test_a_party_that_never_finishes_ends_the_run_within_its_round_bound():
    sites, sizes = ["site-1", "site-2"], {"site-1": 10, "site-2": 10}
    gen = relay(sites, sizes, max_ratio=10, chunk=4)
    next(gen)
    keys = {s: PsiSession(s, [f"train:{i}" for i in range(10)], job_id=JOB, sites=sites).handle(
        {"type": "start", "sites": sites, "sizes": sizes, "max_ratio": 10.0, "chunk": 4}) for s in sites}
    gen.send(keys)
    with pytest.raises(PsiError, match="did not finish within 15 rounds"):
        for _ in range(100):
            gen.send({s: {"outbox": [], "done": s == "site-1"} for s in sites})


def test_a_comparer_claiming_a_value_it_did_not_find_is_caught_at_least_three_times_in_four():
    """What the padding bounds: with three parties, a comparer (site-2) that claims one more value of the padded
    intersection than it found learns, if that value is real, that one of its items is held by site-3 but not by the
    leader. Real values are at most a quarter of what it could claim, the rest padding, which the leader catches.
    Measured here with most of site-2's and site-3's items shared without the leader: caught in at least half of 40
    runs (expected: about 3 in 4); SECURITY.md states the rest."""
    rng = np.random.default_rng(0)
    base, _ = world(3, 40, 4, pairwise=30)  # site-2 and site-3 share 30 items the leader lacks
    caught = 0
    for trial in range(40):
        def one_more(where, hits):  # a value of Z not found, and a position of the leader's list not claimed
            extra = int(rng.choice(np.setdiff1d(np.arange(4 * 10), hits)))  # Z's size: 4 x the smallest list
            at = int(rng.choice(np.setdiff1d(np.arange(40), where)))
            return np.sort(np.append(where, at)), np.sort(np.append(hits, extra))
        lie = rewrite_matches(one_more)
        items = {s: list(v) for s, v in base.items()}
        items["site-3"] = items["site-3"][:10]  # the smallest other list: Z holds 4 x 10 values
        sessions = sessions_for(items)
        hostile(sessions["site-2"], lie)
        try:
            run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=64)
        except PsiError as exc:
            assert exc.site == "site-2" and "padding" in str(exc)
            caught += 1
    assert 20 <= caught < 40, caught  # and some lies go through: the bound is a probability, not a proof


def test_fields_of_the_wrong_type_are_refused_naming_the_sender_not_crashing_the_receiver():
    items, _ = world(3, 20, 5)

    def odd(out):
        return [(to, {**h, "owner": ["site-1"]} if h.get("t") == "list" else h, b) for to, h, b in out]
    _, err = run_with(items, 64, {"site-3": odd})
    assert err.site == "site-3" and "no other party" in str(err)
    sites, sizes = ["site-1", "site-2"], {"site-1": 10, "site-2": 10}
    for field, value in (("chunk", 0), ("chunk", 1 << 21), ("chunk", True), ("max_ratio", 0.5), ("max_ratio", None)):
        s = PsiSession("site-1", [f"train:{i}" for i in range(10)], job_id=JOB, sites=sites)
        start = {"type": "start", "sites": sites, "sizes": sizes, "max_ratio": 10.0, "chunk": 4, field: value}
        with pytest.raises(PsiError) as exc:
            s.handle(start)
        assert exc.value.site == "relay" and "the start request" in str(exc.value), (field, value)
    gen = relay(sites, sizes, max_ratio=10, chunk=4)
    next(gen)
    keys = {s: PsiSession(s, [f"train:{i}" for i in range(10)], job_id=JOB, sites=sites).handle(
        {"type": "start", "sites": sites, "sizes": sizes, "max_ratio": 10.0, "chunk": 4}) for s in sites}
    gen.send(keys)
    with pytest.raises(PsiError) as exc:
        gen.send({"site-1": {"outbox": [], "done": False},
                  "site-2": {"outbox": [{"to": ["site-1"], "blob": np.zeros(4, np.uint8)}], "done": False}})
    assert exc.value.site == "site-2"


def test_three_parties_with_a_padded_intersection_of_many_chunks_finish():
    """The leader sends the padded intersection in one round, as many chunks as it takes; the relay allows that."""
    items, common = world(3, 40, 12)
    sessions = sessions_for(items)
    run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=1)  # 160 chunks of Z
    assert all(sorted(s.kept_items()) == common for s in sessions.values())
