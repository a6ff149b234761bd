"""The ECDH-PSI core (``treeflare.psi``), in process: exact intersections for 2 to 4 parties, streamed in chunks,
on a worker pool or a Dask cluster alike; what crosses the relay (nothing but sealed bytes); what each party can
link to its own items (the intersection of all, nothing pairwise); the set-size bound, checked before anything is
blinded."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from treeflare.psi import group
from treeflare.psi.party import PsiError, PsiParty, chains, check_sizes
from treeflare.psi.relay import run_in_process
from treeflare.psi.session import PsiSession

JOB = "job-psi-test"


def world(n_parties: int, n: int, shared: int, seed: int = 0, sizes=None, pairwise: int = 0) -> tuple[dict, list]:
    """Each party's items (``train:``/``test:`` ids, odd characters included), shuffled; and the ones all hold.
    ``pairwise``: that many more are held by site-2 and site-3 only (and as many by site-1 and site-2 only)."""
    rng = random.Random(seed)
    common = [f"train:c{i},é\"{rng.random():.6f}" for i in range(shared)]
    common += [f"test:tst{i:08d}" for i in range(max(shared // 4, 0))]
    pairs = {1: [f"train:pair12-{i}" for i in range(pairwise)], 2: [f"train:pair23-{i}" for i in range(pairwise)]}
    out = {}
    for k in range(n_parties):
        size = (sizes or {}).get(k, n)
        extra = pairs.get(k + 1, []) + pairs.get(k, []) if n_parties > 2 else []
        own = extra + [f"train:p{k}-{i}" for i in range(size - len(common) - len(extra))]
        items = common + own
        rng.shuffle(items)
        out[f"site-{k + 1}"] = items
    return out, sorted(common)


def sessions_for(items: dict, **kw) -> dict:
    return {s: PsiSession(s, v, job_id=JOB, sites=list(items), **kw) for s, v in items.items()}


def run(items: dict, chunk: int = 97, max_ratio: float = 10.0, transcript=None, **kw):
    sessions = sessions_for(items, **kw)
    stats = run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=max_ratio, chunk=chunk,
                           transcript=transcript)
    return sessions, stats


@pytest.mark.parametrize("n_parties, n, shared", [(2, 300, 120), (3, 250, 60), (4, 200, 100), (2, 50, 0),
                                                  (3, 40, 32), (2, 1, 1)])
def test_every_party_keeps_exactly_the_intersection_of_all(n_parties, n, shared):
    items, common = world(n_parties, n, shared, seed=n_parties * n)
    sessions, stats = run(items)
    for site, s in sessions.items():
        assert s.done and sorted(s.kept_items()) == common, site
        assert s.kept_items() == [i for i in items[site] if i in set(common)]  # in the order the party holds them
    longest = -(-n // 97)
    assert stats["rounds"] <= longest + 2 * n_parties + 8


def test_unequal_sets_and_one_item_lists_stream_chunk_by_chunk():
    items, common = world(3, 230, 7, sizes={1: 9, 2: 41})
    for chunk in (1, 8, 1000):
        sessions, _ = run(items, chunk=chunk)
        assert all(sorted(s.kept_items()) == common for s in sessions.values()), chunk


def test_a_worker_pool_or_a_dask_cluster_gives_the_same_intersection():
    from treeflare.crypto.dask_pool import DaskPool
    from treeflare.crypto.workers import WorkerPool

    items, common = world(2, 3000, 1100, seed=5)
    pools = {"site-1": WorkerPool(2, ["treeflare.psi.group"]), "site-2": DaskPool("dask-local:2",
                                                                                  ["treeflare.psi.group"])}
    try:
        sessions = {s: PsiSession(s, v, job_id=JOB, sites=list(items), pool=pools[s]) for s, v in items.items()}
        run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=1024)
    finally:
        for p in pools.values():
            p.close()
    assert all(sorted(s.kept_items()) == common for s in sessions.values())


def test_blinding_commutes_and_hides_the_hash():
    u = group.hash_items(["train:a", "train:b"], b"salt")
    a, b = group.new_key(), group.new_key()
    assert group.blind(a, group.blind(b, u)) == group.blind(b, group.blind(a, u))
    assert group.blind(a, u) != group.blind(b, u) and group.blind(a, u)[:32] != u[:32]
    assert group.hash_items(["train:a"], b"salt") != group.hash_items(["train:a"], b"other job")
    with pytest.raises(group.GroupError) as exc:  # a point of small order (u = 0) is refused, by its index
        group.blind(a, u + bytes(32))
    assert exc.value.index == 2


def test_the_chains_end_at_the_leader_and_its_own_at_the_comparer():
    assert chains(["b", "a"]) == {"a": ["b"], "b": ["a"]}
    assert chains(["s1", "s2", "s3", "s4"]) == {"s1": ["s3", "s4", "s2"], "s2": ["s3", "s4", "s1"],
                                                  "s3": ["s4", "s2", "s1"], "s4": ["s2", "s3", "s1"]}


@pytest.mark.parametrize("n", [3, 4, 5, 6, 9])
def test_no_party_but_the_leader_receives_two_lists_under_the_same_keys(n):
    """Two lists under the same keys could be compared by whoever holds both: their common items match. The keys a
    list carries when it reaches a party are its owner's and those of the parties before on its chain."""
    sites = [f"site-{i}" for i in range(1, n + 1)]
    arrivals: dict = {}
    for owner, chain in chains(sites).items():
        assert sorted(chain + [owner]) == sites  # every party once
        for place, party in enumerate(chain):
            arrivals.setdefault(party, []).append(frozenset([owner, *chain[:place]]))
    for party, keysets in arrivals.items():
        if party != "site-1":
            assert len(set(keysets)) == len(keysets), party


def test_with_four_and_five_parties_no_middle_party_can_compare_two_lists():
    """The same, measured: every list chunk a party other than the leader received, by owner; two owners' lists
    share no value at any of them, although every list holds the common items."""
    for n in (4, 5):
        items, common = world(n, 60, 25, seed=n)
        sessions = sessions_for(items)
        got: dict = {}
        real = PsiParty.step

        def spy(self, inbox):
            for _, h, body in inbox:
                if h.get("t") == "list":
                    got.setdefault(self.site, {}).setdefault(h["owner"], set()).update(
                        body[i:i + 32] for i in range(0, len(body), 32))
            return real(self, inbox)
        PsiParty.step = spy
        try:
            run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=16)
        finally:
            PsiParty.step = real
        assert all(sorted(s.kept_items()) == common for s in sessions.values())
        for party, lists in got.items():
            owners = sorted(lists)
            overlaps = [(a, b) for i, a in enumerate(owners) for b in owners[i + 1:] if lists[a] & lists[b]]
            assert overlaps == [] if party != "site-1" else overlaps, (n, party)


# ---- the set-size bound ----------------------------------------------------------------------------------------

def test_a_party_far_larger_than_every_other_is_refused_by_name_before_anything_is_blinded(monkeypatch):
    with pytest.raises(PsiError) as exc:
        check_sizes({"site-1": 100, "site-2": 7_800, "site-3": 90}, ["site-1", "site-2", "site-3"], 10.0)
    assert exc.value.site == "site-2" and "7800 ids, more than 10 times the largest other party's 100" in str(exc.value)
    check_sizes({"site-1": 100, "site-2": 1_000, "site-3": 90}, ["site-1", "site-2", "site-3"], 10.0)  # at the bound
    blinded = []
    monkeypatch.setattr(group, "blind", lambda *a: blinded.append(1))
    items = {"site-1": ["train:a"] * 1, "site-2": [f"train:{i}" for i in range(30)]}
    with pytest.raises(PsiError, match="site-2: holds 30 ids, more than 10 times"):
        PsiParty("site-1", list(items), items["site-1"], salt=b"j", sizes={"site-1": 1, "site-2": 30})
    assert blinded == []


def test_a_site_lowers_the_jobs_ratio_for_itself():
    items = {"site-1": [f"train:{i}" for i in range(30)], "site-2": [f"train:{i}" for i in range(10)]}
    strict = PsiSession("site-2", items["site-2"], job_id=JOB, sites=list(items), max_ratio=2.0)
    start = {"type": "start", "sites": sorted(items), "sizes": {"site-1": 30, "site-2": 10}, "max_ratio": 10.0,
             "chunk": 64}
    with pytest.raises(PsiError, match="site-1: holds 30 ids, more than 2 times"):
        strict.handle(dict(start))
    relaxed = PsiSession("site-2", items["site-2"], job_id=JOB, sites=list(items), max_ratio=1e6)
    with pytest.raises(PsiError, match="more than 2 times"):  # a higher own ratio never raises the job's
        relaxed.handle({**start, "max_ratio": 2.0})


# ---- what crosses the relay, and what a party can link -------------------------------------------------------

def blinded_needles(sessions: dict, items: dict) -> set:
    """Every value of the protocol that is a function of an item: its hash, and its blinding under every non-empty
    set of the parties' keys (all orders give the same), full and as a match key."""
    keys = [s.party.key for s in sessions.values()]
    needles = set()
    for site, its in items.items():
        u = group.hash_items(its, JOB.encode())
        layers = {(): u}
        for k in range(len(keys)):
            for subset, values in list(layers.items()):
                if k not in subset:
                    layers[tuple(sorted(subset + (k,)))] = group.blind(keys[k], values)
        for values in layers.values():
            for i in range(0, len(values), 32):
                needles.add(values[i:i + 32])
                needles.add(values[i:i + group.MATCH_BYTES])
    return needles


def found_in(blobs, needles) -> int:
    hay = b"\x00".join(blobs)
    k = group.MATCH_BYTES
    return sum(1 for j in range(len(hay) - k + 1) if hay[j:j + k] in needles)


def relayed_bytes(transcript) -> list:
    out = []
    for _, _, msg in transcript:
        for box in ("inbox", "outbox"):
            out.extend(m["blob"].tobytes() for m in msg.get(box, []))
        for rec in msg.get("keys", []) + ([msg["key"]] if "key" in msg else []):
            out.append(rec["public_key"].tobytes())
    return out


@pytest.fixture(scope="module")
def three():
    items, common = world(3, 400, 150, seed=11, pairwise=40)
    transcript = []
    seen = {}  # site -> every (header, body) it opened
    sessions = sessions_for(items)
    seen = {site: [] for site in sessions}
    real_step = PsiParty.step

    def spy(self, inbox):
        seen[self.site].extend(inbox)
        return real_step(self, inbox)

    PsiParty.step = spy
    try:
        run_in_process(sessions, {s: len(v) for s, v in items.items()}, max_ratio=10, chunk=64,
                       transcript=transcript)
    finally:
        PsiParty.step = real_step
    return items, common, sessions, transcript, seen


def test_the_relay_sees_no_id_no_hash_and_no_blinded_value_only_sealed_bytes(three):
    items, common, sessions, transcript, seen = three
    from test_psi_inprocess import leaked

    blobs = relayed_bytes(transcript)
    assert sum(map(len, blobs)) > 3 * 400 * 32  # every list crossed it, several times
    needles = blinded_needles(sessions, items)
    assert found_in(blobs, needles) == 0
    every = {i.split(":", 1)[1] for its in items.values() for i in its}
    assert leaked([["/", "bytes", b.hex()] for b in blobs], every) == []
    # the scan finds them where they are: in the parties' opened messages
    assert found_in([body for inbox in seen.values() for _, _, body in inbox], needles) > 3 * 400


def test_no_party_can_link_what_it_receives_to_its_own_items_but_the_intersection_of_all(three):
    """A curious party's best attack on its view: what it received (every message opened) that it can tie to one of
    its own items, by computing the hash or its own blinding of that item, or by position (its own list coming
    back). Nothing: its list never comes back (with 3 or more parties), and no value it receives is one it can
    compute from its items. What it learns of its items is the positions it is told: the intersection of all."""
    items, common, sessions, transcript, seen = three
    for site, s in sessions.items():
        own = group.hash_items(items[site], JOB.encode())
        mine = {own[i:i + n] for i in range(0, len(own), 32) for n in (32, group.MATCH_BYTES)}
        own = group.blind(s.party.key, own)
        mine |= {own[i:i + n] for i in range(0, len(own), 32) for n in (32, group.MATCH_BYTES)}
        assert found_in([body for _, _, body in seen[site]], mine) == 0, site
        assert not [h for _, h, _ in seen[site] if h.get("owner") == site or h.get("t") == "final"], site
        assert len(s.party.returned) == 0 and site not in s.party.full


def test_the_leader_learns_the_sizes_of_the_others_intersections_and_no_more(three):
    """What SECURITY.md states the leader learns beyond the intersection of all: with the others' lists apart, the
    size of every intersection among them; not which of its own items are in them (the test above)."""
    items, common, sessions, transcript, seen = three
    leader = sessions["site-1"].party
    lists = {o: set(leader._keys(buf)) for o, buf in leader.full.items()}
    assert len(lists["site-2"] & lists["site-3"]) == len(set(items["site-2"]) & set(items["site-3"]))


def test_two_parties_each_learn_the_intersection_and_nothing_else():
    items, common = world(2, 120, 45, seed=3)
    sessions, _ = run(items, chunk=50)
    c = sessions["site-2"].party
    assert len(c.returned) == 120 * group.MATCH_BYTES and list(c.full) == ["site-1"]
    assert list(sessions["site-1"].party.full) == ["site-2"]  # L holds C's list only, returned to C as it goes
    assert all(sorted(s.kept_items()) == common for s in sessions.values())


def test_positions_say_nothing_of_the_row_order():
    items = {"site-1": [f"train:{i:05d}" for i in range(500)], "site-2": [f"train:{i:05d}" for i in range(0, 1000, 2)]}
    sessions, _ = run(items, chunk=100)
    leader = sessions["site-1"].party
    # the positions C sent the leader are of the leader's secretly shuffled list, not of its rows (ids in order)
    rows = np.sort(leader.order[leader.kept])
    assert np.array_equal(rows, np.arange(0, 500, 2)) and not np.array_equal(np.sort(leader.kept), rows)
    assert sorted(sessions["site-2"].kept_items()) == [f"train:{i:05d}" for i in range(0, 500, 2)]


def test_each_run_blinds_under_fresh_keys():
    items, _ = world(2, 30, 10)
    a, _ = run(items)
    b, _ = run(items)
    assert {s.party.key for s in a.values()}.isdisjoint({s.party.key for s in b.values()})
    assert hashlib.sha256(a["site-1"].party.key).digest() != hashlib.sha256(b["site-1"].party.key).digest()
