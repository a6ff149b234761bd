"""One party of the ECDH-PSI: its items in, the positions of the intersection out; no I/O, no NVFlare.

Every party ``i`` has a secret key ``k_i`` (:mod:`.group`), and the protocol computes, for every item x of every
party, ``F(x) = H(x)^(k_1 ... k_m)`` (X25519 composes in any order), without anyone ever holding another party's
items under fewer than all keys *and* its own items under all keys. The parties, sorted by name: the *leader* L is the
first, the *comparer* C the second.

1. **Lists.** Each party shuffles its items (a secret permutation: positions say nothing of the rows), hashes and
   blinds them under its own key and streams them, ``CHUNK`` items a message, along its *chain*: every other party
   once, each applying its key and passing the chunk on, without reordering. Every list's chain ends at L, except
   L's own, which ends at C; the chains are rotations of one cycle, so that no party but L ever holds two lists under
   the same keys (:func:`chains`). The last party of a chain holds that list fully blinded (``F``), in its owner's order.
   Both (all) parties blind their own chunks and their partners' in the same rounds: nobody waits for a whole list.
2. **Two parties.** L returns C's fully blinded list to C, chunk by chunk as it blinds it; C then holds both lists
   fully blinded, keeps its items found in L's, and tells L the positions in L's list that it found in its own: each
   learns the intersection, and nothing else (the standard ECDH-PSI).
3. **Three or more.** L holds ``F`` of every other party's list and intersects them: ``Z``, padded with random values
   to ``PAD_FACTOR`` times the size of the smallest of those lists (a size every party knows) and shuffled, goes to C,
   which holds
   ``F`` of L's list and answers which values of ``Z`` it found (and at which positions of L's list). L checks no
   padding was claimed, and tells every other party the positions of its list in the intersection. No party ever
   holds its own items fully blinded beside another single party's list: the intersection of all is the only
   membership anyone learns. What is left, and bounded: L learns the *sizes* of the intersections among the other
   parties' sets (it holds their lists apart, unlinkable to any item it knows). SECURITY.md states it.

Every size is declared before anything is blinded (``sizes``, checked against the ``max_ratio`` bound by every party
on its own) and bound to what arrives: a list's chunks must hold exactly its owner's declared size, in order, from
the party the chain says; a fully blinded list must hold no value twice; positions must be in range and increasing.
A message that breaks any of this stops the party with :class:`PsiError` naming the party that sent it.

(About 380 lines: the two finishing steps share every check of the lists and are read together.)
"""

from __future__ import annotations

import os

import numpy as np

from . import group

CHUNK = 65536  # items a list message carries: ~2 MB of group elements, a few seconds of X25519 at most
PIECE = 8192  # items one worker-pool task blinds (a round's work is split into pieces for the pool)
MAX_ITEMS = 10**9
DEFAULT_MAX_RATIO = 10.0
# Z (three or more parties) is padded to this many times the smallest other list: a comparer that claims a value of
# Z it did not find hits padding, and is caught, with probability at least 1 - 1/PAD_FACTOR per value it claims
PAD_FACTOR = 4


class PsiError(ValueError):
    """The run cannot go on; ``site`` is the party whose message or set broke it (the text never holds an item)."""

    def __init__(self, site: str, message: str):
        super().__init__(f"{site}: {message}")
        self.site = str(site)


def check_ratio(value, what: str = "max_ratio") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= float(value) <= 1e6:
        raise ValueError(f"{what} must be a number from 1 to 1e6")
    return float(value)


def check_chunk(value) -> int:
    """Items a list message carries: an integer from 1 to 2^20 (every party and the relay agree on it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
        raise ValueError("chunk must be an integer from 1 to 2^20")
    return value


def check_sizes(sizes, sites, max_ratio: float) -> dict[str, int]:
    """``sizes`` ({site: number of items}) for exactly ``sites``, each party's at most ``max_ratio`` times the
    largest of the others' (else :class:`PsiError` naming the party: it could probe the others' sets with ids it
    guesses)."""
    if not isinstance(sizes, dict) or set(sizes) != set(sites):
        raise PsiError("sizes", "must give the number of items of every party of the run")
    out = {}
    for site in sites:
        n = sizes[site]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ITEMS:
            raise PsiError(site, f"its declared number of items is not a count from 1 to {MAX_ITEMS}")
        out[site] = int(n)
    for site in sites:
        largest_other = max(out[s] for s in sites if s != site)
        if out[site] > max_ratio * largest_other:
            raise PsiError(site, f"holds {out[site]} ids, more than {max_ratio:g} times the largest other party's "
                                 f"{largest_other} (the ratio the job or a site allows): a party that enlarges its "
                                 "set learns whether each id it adds is in the others'; the phase stops before any "
                                 "encryption")
    return out


def chains(sites) -> dict[str, list[str]]:
    """The parties each list passes, in order, after its owner: every other party, L (the first site) last; L's own
    list ends at C (the second).

    The non-leaders' chains are rotations of one cycle (the owner's successors in it, then L): the list of the owner j
    places before a party arrives there under the keys of the j places, a run of the cycle ending just before it, so
    no party but L ever holds two lists under the same keys, which it could compare (L's own list carries L's key,
    which no other list has before L)."""
    sites = sorted(sites)
    leader, others = sites[0], sites[1:]
    out = {leader: others[1:] + others[:1]}
    for j, owner in enumerate(others):
        out[owner] = [others[(j + t) % len(others)] for t in range(1, len(others))] + [leader]
    return out


def secret_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``n`` from the operating system's CSPRNG (64-bit random keys sorted; a tie,
    about n^2 / 2^65, only fixes the order of the two): positions revealed later say nothing of it."""
    return np.argsort(np.frombuffer(os.urandom(8 * n), dtype=np.uint64), kind="stable")


def _positions(body: bytes, count: int) -> np.ndarray:
    return np.frombuffer(body, dtype="<u4", count=count).astype(np.int64)


def _increasing_below(pos: np.ndarray, n: int) -> bool:
    return bool(pos.size == 0 or (pos[0] >= 0 and pos[-1] < n and (pos.size < 2 or np.all(np.diff(pos) > 0))))


class PsiParty:
    """One party's side. ``start()`` then ``step(inbox)`` once a round: ``inbox`` and the returned outbox are lists
    of ``(site, header, body)``; ``done`` when it has its intersection (``kept_items()``)."""

    def __init__(self, site: str, sites, items, *, salt: bytes, sizes, max_ratio: float = DEFAULT_MAX_RATIO,
                 chunk: int = CHUNK, pool=None):
        self.site = str(site)
        self.sites = sorted(str(s) for s in sites)
        if self.site not in self.sites or len(set(self.sites)) != len(self.sites) or len(self.sites) < 2:
            raise PsiError(self.site, "the run's parties must be at least 2 distinct sites, this one among them")
        self.items = list(items)
        self.sizes = check_sizes(sizes, self.sites, check_ratio(max_ratio))
        if self.sizes[self.site] != len(self.items):
            raise PsiError(self.site, "the size declared for this party is not the number of its items")
        self.chunk, self.salt, self.pool = check_chunk(chunk), bytes(salt), pool
        self.leader, self.comparer = self.sites[0], self.sites[1]
        self.chains = chains(self.sites)
        self.key = group.new_key()
        self.order = secret_permutation(len(self.items))
        self.sent = 0  # own items blinded and sent
        self.arrived = {o: 0 for o in self.sites if o != self.site}  # items of each list that reached this party
        self.full: dict[str, bytearray] = {}  # lists this party holds fully blinded (match keys, owner's order)
        for owner, chain in self.chains.items():
            if chain[-1] == self.site:
                self.full[owner] = bytearray()
        self.seen: dict[str, set] = {}  # each list's values as they arrived here (a repeat names its sender)
        self.returned = bytearray()  # two parties, at C: its own list fully blinded, as L returns it
        self.z = bytearray()  # three or more, at C: the padded intersection of the others' lists
        self.z_size = PAD_FACTOR * min(self.sizes[s] for s in self.sites if s != self.leader)
        self.padding: np.ndarray | None = None  # at L: which values of Z are padding
        self.z_values: list[bytes] | None = None
        self.matches_sent = False
        self.kept: np.ndarray | None = None  # positions in this party's shuffled list
        self.done = False

    # ---------------------------------------------------------------- blinding
    def _blind_all(self, jobs) -> list[bytes]:
        """Blind every ``(tag, points)`` of this round (one pool call, split into pieces); a small-order value
        raises PsiError naming the party ``tag`` says sent it."""
        tasks, where = [], []
        for j, (sender, points) in enumerate(jobs):
            for start in range(0, len(points), PIECE * group.POINT_BYTES):
                tasks.append(({}, [self.key, points[start:start + PIECE * group.POINT_BYTES]]))
                where.append(j)
        out = [bytearray() for _ in jobs]
        if not tasks:
            return []
        if self.pool is None:
            replies = [group.OPS["psi_blind"]({}, args, blobs) for args, blobs in tasks]
        else:
            replies = self.pool.run_tasks("psi_blind", tasks)
        for j, (result, blobs) in zip(where, replies):
            if int(result.get("bad", -1)) >= 0:
                raise PsiError(jobs[j][0], "sent a value that is not a usable X25519 point")
            out[j] += blobs[0]
        return [bytes(b) for b in out]

    def _own_chunk(self) -> tuple[int, bytes]:
        start = self.sent
        count = min(self.chunk, len(self.items) - start)
        idx = self.order[start:start + count]
        return start, group.hash_items((self.items[i] for i in idx), self.salt)

    # ---------------------------------------------------------------- the rounds
    def start(self) -> list:
        return self.step([])

    def step(self, inbox) -> list:
        if self.done:
            if inbox:
                raise PsiError(inbox[0][0], "sent a message after this party had its intersection")
            return []
        out: list = []
        lists, other = [], []
        for frm, header, body in inbox:
            kind = header.get("t")
            if kind == "list":
                lists.append(self._check_list(frm, header, body))
                if sum(1 for x in lists if x[1] == lists[-1][1]) > 1:  # an honest chain passes one chunk a round
                    raise PsiError(frm, f"sent more than one chunk of {lists[-1][1]}'s list in one round")
            else:
                other.append((frm, kind, header, body))
        jobs = [(frm, body) for frm, _owner, _h, _s, body in lists]
        own = None
        if self.sent < len(self.items):
            own = self._own_chunk()
            jobs.append((self.site, own[1]))
        blinded = self._blind_all(jobs)
        for (frm, owner, hop, start, _body), values in zip(lists, blinded):
            out.extend(self._pass_on(owner, hop, start, values))
        if own is not None:
            count = len(own[1]) // group.POINT_BYTES
            first = self.chains[self.site][0]
            out.append((first, {"t": "list", "owner": self.site, "hop": 1, "start": own[0], "count": count},
                        blinded[-1]))
            self.sent += count
        for frm, kind, header, body in other:
            out.extend(self._finish_message(frm, kind, header, body))
        out.extend(self._maybe_finish())
        return out

    def _check_list(self, frm, header, body):
        owner, hop, start, count = (header.get(k) for k in ("owner", "hop", "start", "count"))
        if not isinstance(owner, str) or owner not in self.arrived:
            raise PsiError(frm, "sent a list chunk of no other party of the run")
        chain = self.chains[owner]
        place = chain.index(self.site)
        expected_from = owner if place == 0 else chain[place - 1]
        if frm != expected_from or hop != place + 1:
            raise PsiError(frm, f"sent a chunk of {owner}'s list out of its chain")
        n = self.sizes[owner]
        want = min(self.chunk, n - self.arrived[owner])
        if start != self.arrived[owner] or want <= 0 or count != want or len(body) != count * group.POINT_BYTES:
            raise PsiError(frm, f"sent a chunk of {owner}'s list that does not continue it as declared "
                                f"({n} items, {self.chunk} a chunk)")
        seen = self.seen.setdefault(owner, set())
        before = len(seen)
        seen.update(body[i:i + group.MATCH_BYTES] for i in range(0, len(body), group.POINT_BYTES))
        if len(seen) != before + count:  # distinct items stay distinct under any keys: the sender made the repeat
            raise PsiError(frm, f"sent {owner}'s list with a value twice (one value for two items)")
        self.arrived[owner] += count
        return frm, owner, hop, start, body

    def _pass_on(self, owner: str, hop: int, start: int, values: bytes) -> list:
        chain = self.chains[owner]
        place = chain.index(self.site)
        count = len(values) // group.POINT_BYTES
        if place + 1 < len(chain):
            return [(chain[place + 1], {"t": "list", "owner": owner, "hop": hop + 1, "start": start, "count": count},
                     values)]
        keys = b"".join(group.match_keys(values))
        self.full[owner] += keys
        if len(self.sites) == 2 and self.site == self.leader:  # L returns C's list to C as it blinds it
            return [(owner, {"t": "final", "start": start, "count": count}, keys)]
        return []

    def _complete(self, owner: str) -> bool:
        return len(self.full[owner]) == self.sizes[owner] * group.MATCH_BYTES

    @staticmethod
    def _keys(buf) -> list[bytes]:
        """The match keys of a fully blinded list. Its values were checked distinct as they arrived (``seen``), so
        they stay distinct but by a 2^-128 chance; only the list L returns to C (two parties) is checked here."""
        mb = group.MATCH_BYTES
        return [bytes(buf[i:i + mb]) for i in range(0, len(buf), mb)]

    # ---------------------------------------------------------------- finishing
    def _finish_message(self, frm, kind, header, body) -> list:
        two = len(self.sites) == 2
        if kind == "final" and two and self.site == self.comparer and frm == self.leader:
            start, count = header.get("start"), header.get("count")
            n = self.sizes[self.site]
            have = len(self.returned) // group.MATCH_BYTES
            if start != have or count != min(self.chunk, n - have) or count <= 0 or \
                    len(body) != count * group.MATCH_BYTES:
                raise PsiError(frm, "returned a chunk of this party's list that does not continue it")
            self.returned += body
            return []
        if kind == "z" and not two and self.site == self.comparer and frm == self.leader:
            start, count = header.get("start"), header.get("count")
            have = len(self.z) // group.MATCH_BYTES
            if start != have or count != min(self.chunk, self.z_size - have) or count <= 0 or \
                    len(body) != count * group.MATCH_BYTES:
                raise PsiError(frm, f"sent a chunk of the padded intersection that does not continue it "
                                    f"({self.z_size} values)")
            self.z += body
            return []
        if kind == "matches" and self.site == self.leader and frm == self.comparer and self.kept is None and \
                self.sent == len(self.items) and all(self._complete(o) for o in self.full) and \
                (two or self.z_values is not None):  # C cannot have compared before it had everything
            return self._leader_matches(frm, header, body)
        if kind == "positions" and not two and self.site != self.leader and frm == self.leader and \
                self.kept is None and self.matches_sent is (self.site == self.comparer):
            count = header.get("count")
            n = self.sizes[self.site]
            if not isinstance(count, int) or not 0 <= count <= min(self.sizes.values()) or len(body) != 4 * count:
                raise PsiError(frm, "sent positions of a bad count")
            pos = _positions(body, count)
            if not _increasing_below(pos, n):
                raise PsiError(frm, "sent positions that are not increasing positions of this party's list")
            self.kept, self.done = pos, True
            return []
        raise PsiError(frm, f"sent a message ({str(kind)[:20]!r}) this party does not expect from it now")

    def _maybe_finish(self) -> list:
        if self.kept is not None or self.matches_sent:
            return []
        if len(self.sites) == 2:
            if self.site == self.comparer and self._complete(self.leader) and \
                    len(self.returned) == self.sizes[self.site] * group.MATCH_BYTES:
                return self._comparer_two()
            return []
        if self.site == self.leader and self.z_values is None and all(self._complete(o) for o in self.full):
            return self._leader_z()
        if self.site == self.comparer and self._complete(self.leader) and \
                len(self.z) == self.z_size * group.MATCH_BYTES:
            return self._comparer_many()
        return []

    def _comparer_two(self) -> list:
        theirs = self._keys(self.full[self.leader])
        mine = self._keys(self.returned)
        if len(set(mine)) != len(mine):
            raise PsiError(self.leader, f"returned {self.site}'s list with a value twice (one value for two items)")
        in_theirs, in_mine = set(theirs), set(mine)
        own = np.array([p for p, v in enumerate(mine) if v in in_theirs], dtype=np.int64)
        their = np.array([p for p, v in enumerate(theirs) if v in in_mine], dtype="<u4")
        self.kept, self.done, self.matches_sent = own, True, True
        return [(self.leader, {"t": "matches", "count": int(their.size)}, their.tobytes())]

    def _leader_z(self) -> list:
        lists = [set(self._keys(self.full[o])) for o in sorted(self.full)]
        common = set.intersection(*lists)
        mb = group.MATCH_BYTES
        noise = os.urandom(mb * (self.z_size - len(common)))
        values = sorted(common) + [noise[i:i + mb] for i in range(0, len(noise), mb)]
        padding = np.zeros(self.z_size, dtype=bool)
        padding[len(common):] = True
        order = secret_permutation(self.z_size)
        self.z_values = [values[i] for i in order]
        self.padding = padding[order]
        blob = b"".join(self.z_values)
        return [(self.comparer, {"t": "z", "start": s, "count": min(self.chunk, self.z_size - s)},
                 blob[s * mb:(s + min(self.chunk, self.z_size - s)) * mb]) for s in range(0, self.z_size, self.chunk)]

    def _comparer_many(self) -> list:
        theirs = self._keys(self.full[self.leader])
        mb = group.MATCH_BYTES
        z = [bytes(self.z[i:i + mb]) for i in range(0, len(self.z), mb)]
        in_theirs, in_z = set(theirs), set(z)
        hits = np.array([q for q, v in enumerate(z) if v in in_theirs], dtype="<u4")
        where = np.array([p for p, v in enumerate(theirs) if v in in_z], dtype="<u4")
        self.matches_sent = True
        return [(self.leader, {"t": "matches", "count": int(where.size), "z": int(hits.size)},
                 where.tobytes() + hits.tobytes())]

    def _leader_matches(self, frm, header, body) -> list:
        count, zcount = header.get("count"), header.get("z", header.get("count"))
        n = self.sizes[self.site]
        bound = min(self.sizes.values())
        two = len(self.sites) == 2
        if not isinstance(count, int) or not isinstance(zcount, int) or not 0 <= count <= bound or \
                zcount != count or len(body) != 4 * (count if two else 2 * count) or (not two and self.z_values is None):
            raise PsiError(frm, "sent matches of a bad count")
        mine = _positions(body[:4 * count], count)
        if not _increasing_below(mine, n):
            raise PsiError(frm, "sent positions that are not increasing positions of this party's list")
        if two:
            self.kept, self.done = mine, True
            return []
        hits = _positions(body[4 * count:], count)
        if not _increasing_below(hits, self.z_size):
            raise PsiError(frm, "sent matches that are not increasing positions of the padded intersection")
        if self.padding[hits].any():
            raise PsiError(frm, "claimed a match on a padding value: its answer is not the comparison it was asked")
        found = {self.z_values[q] for q in hits}
        out = []
        for owner in sorted(self.full):
            keys = self._keys(self.full[owner])
            pos = np.array([p for p, v in enumerate(keys) if v in found], dtype="<u4")
            out.append((owner, {"t": "positions", "count": int(pos.size)}, pos.tobytes()))
        self.kept, self.done = mine, True
        return out

    # ---------------------------------------------------------------- the result
    def kept_items(self) -> list:
        """This party's items in the intersection, in the order it holds them."""
        if self.kept is None:
            raise RuntimeError("the intersection is not known yet")
        return [self.items[i] for i in sorted(int(self.order[p]) for p in self.kept)]
