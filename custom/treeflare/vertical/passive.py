"""The passive party: holds its own feature columns only and answers the active party's requests.

At setup this party proves to the active party that it holds the same rows in the same order: it sends the hash
of its ids, with a fresh link key for later prediction runs, encrypted under the active party's key
(:func:`.messages.encrypt_alignment`), which only the active party can read and compare; the server sees one
ciphertext.

Every request is checked against what was agreed at setup (trees, depth, minimum rows per node,
key size) and against what this party saw and answered before:

* layers come in order (tree by tree, depth by depth, within the agreed caps), and a new tree
  starts with fresh gradients at depth 0;
* node ids match the depth (2^d - 1 .. 2^(d+1) - 2), at most 2^d nodes are open;
* every row of a layer sits in a child of the node it was in one layer up, a split node's rows
  all go to its two children (both non-empty), a closed node's rows leave the tree, and a split
  this party made is followed exactly;
* an open node with fewer rows than the agreed minimum gets no answer at all (the request fails), nor does a layer
  in which a non-empty child below the minimum has an open sibling (the parent's sums minus the sibling's would
  be that child's); this party's own candidates leave at least the minimum on each side;
* one split request per layer, for candidates of this layer only; prediction requests (after which no
  training request is answered) only for trained splits, once each, with the test rows that reach the node
  (checked against this party's own earlier answers where it owns the parent split: :mod:`.inference`), and
  about at most ``PassivePolicy.max_predict_rows`` test rows.

Candidates are shuffled before compression (their order would reveal feature boundaries), carry
fresh random ids, and thresholds never leave this party.  For two open siblings only the smaller one's
sums are sent, over the parent's candidates; the active party subtracts them from the parent's.  These checks narrow what a malicious
active party can learn; they cannot stop it from encoding rows in its own plaintexts (see
SECURITY.md).

(Over 400 lines because each check sits next to the request it guards, in the one class that holds the
state the checks compare against.)
"""
from __future__ import annotations

import secrets
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from ..crypto import MAX_KEY_BITS, MIN_SECURE_BITS, CiphertextError, check_key_bits, public_from_message
from ..crypto.packing import SlotLayout, SlotOverflowError, pack_plan
from ..crypto.workers import WorkerError, parse_workers
from .gc_pause import gc_paused
from .histo import HistEngine
from .inference import PredictionAnswers
from .messages import (PASSIVE_FORMAT, PROTOCOL_VERSION, ProtocolError, check_split_id, encrypt_alignment,
                       int_array, int_list, new_link, require)
from .params import DEFAULT_MIN_ROWS_NODE, MAX_DEPTH, MAX_PREDICT_ROWS, MAX_TREES
from .quantize import bin_matrix

_MAX_CHANNELS = 4096
_RNG = secrets.SystemRandom()


def _ciphertext_view(pub, arr, count: int) -> memoryview:
    """The tree's ciphertexts as received, after the checks of ``pub.wire_bytes`` (shape and count; the values
    are checked by the workers that hold them), without its copy: they are the largest message of a run."""
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 1:
        raise CiphertextError("ciphertexts must arrive as a 1-D uint8 array")
    if arr.size != count * pub.ct_bytes:
        raise CiphertextError(f"expected {count} ciphertexts of {pub.ct_bytes} bytes, got {arr.size} bytes")
    return memoryview(np.ascontiguousarray(arr))


@dataclass
class PassivePolicy:
    """What this site accepts, whatever the active party proposes."""
    min_key_bits: int = MIN_SECURE_BITS
    max_key_bits: int = MAX_KEY_BITS
    min_rows_node: int = DEFAULT_MIN_ROWS_NODE   # a setup proposing fewer rows per node is refused
    max_trees: int = MAX_TREES
    max_depth: int = MAX_DEPTH
    allow_mock: bool = False
    max_predict_rows: int = MAX_PREDICT_ROWS     # rows this site answers prediction requests about, per run


class PassiveParty:
    def __init__(self, name: str, X_train, X_test, feature_names, ids_train=None, ids_test=None,
                 workers: int = 1, min_key_bits: int | None = None, allow_mock: bool | None = None,
                 policy: PassivePolicy | None = None):
        self.name = name
        self.X_train = np.asarray(X_train, dtype=np.float64)
        self.X_test = np.asarray(X_test, dtype=np.float64)
        self.n = self.X_train.shape[0]
        self.n_test = self.X_test.shape[0]
        self.feature_names = list(feature_names)
        self.ids_train = list(ids_train) if ids_train is not None else list(range(self.n))
        self.ids_test = list(ids_test) if ids_test is not None else list(range(self.n_test))
        self.workers = parse_workers(workers or 1)    # processes, or this party's Dask cluster (crypto.workers)
        self.policy = policy or PassivePolicy()
        self.min_key_bits = int(min_key_bits if min_key_bits is not None else self.policy.min_key_bits)
        self.allow_mock = bool(allow_mock if allow_mock is not None else self.policy.allow_mock)
        self.pub = None
        self.link = new_link()        # shared with the active party under its key only: prediction runs' MAC key
        self.engine: HistEngine | None = None
        self.edges = None
        self.bins = None
        self.splits: dict = {}        # split id -> {feature, feature_index, bin, threshold, tree, node, depth}
        self._pending: dict = {}      # candidate id -> (node, feature, bin), this layer only
        self._grad = None
        self._lists: dict = {}        # node -> its candidates (features, bins) arrays, open nodes of the previous layer
        self._counts: dict = {}       # node -> its rows' bin counts, open nodes of the previous layer
        self._idx: dict = {}
        self.tree, self.depth = -1, -1
        self._prev_assign, self._prev_open = None, []
        self._own: dict = {}          # node -> left mask of the split this party made in the previous layer
        self._split_done = True
        self._predicting = False
        self._answers: PredictionAnswers | None = None    # the checked answers to prediction requests
        self.timings = defaultdict(float)
        self.ops = Counter()

    # ------------------------------------------------------------------------------- dispatch
    def handle(self, msg: dict) -> dict:
        kind = require(msg, "type", str)
        fn = {"setup": self._setup, "layer": self._layer, "split": self._split,
              "predict": self._predict, "finish": self._finish}.get(kind)
        if fn is None:
            raise ProtocolError(f"unknown message type {kind!r}")
        if kind != "setup" and self.pub is None:
            raise ProtocolError("protocol not set up")
        with gc_paused():
            return fn(msg)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # ------------------------------------------------------------------------------- setup
    def _setup(self, msg):
        if self.pub is not None:
            raise ProtocolError("protocol already set up")
        if require(msg, "version", int) != PROTOCOL_VERSION:
            raise ProtocolError("protocol version mismatch")
        try:
            pub = public_from_message(require(msg, "pk", dict))
        except (CiphertextError, ValueError) as e:
            raise ProtocolError(f"bad public key: {e}") from None
        if pub.scheme == "mock" and not self.allow_mock:
            raise ProtocolError("refusing the mock (plaintext) scheme: real encryption required")
        try:
            check_key_bits(pub.key_bits, minimum=self.min_key_bits, maximum=self.policy.max_key_bits)
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        n_train, n_test = require(msg, "n_train", int), require(msg, "n_test", int)
        if n_train != self.n or n_test != self.n_test:
            raise ProtocolError(f"{self.name}: {self.n} training and {self.n_test} test rows here, {n_train} and "
                                f"{n_test} at the active party: row counts differ")
        if self.n_test > self.policy.max_predict_rows:
            raise ProtocolError(f"{self.n_test} test rows; this site answers prediction requests about at most "
                                f"{self.policy.max_predict_rows} rows per run")
        bins = require(msg, "bins", int)
        if not 2 <= bins <= 1024:
            raise ProtocolError("bins out of range")
        self.n_trees = require(msg, "n_trees", int)
        self.max_depth = require(msg, "max_depth", int)
        self.min_rows = require(msg, "min_rows_node", int)
        pol = self.policy
        if not 1 <= self.n_trees <= pol.max_trees:
            raise ProtocolError(f"{self.n_trees} trees proposed; this site allows at most {pol.max_trees}")
        if not 1 <= self.max_depth <= pol.max_depth:
            raise ProtocolError(f"depth {self.max_depth} proposed; this site allows at most {pol.max_depth}")
        if self.min_rows < max(2, pol.min_rows_node):
            raise ProtocolError(f"minimum of {self.min_rows} rows per node proposed; this site requires at "
                                f"least {pol.min_rows_node}")
        self.hist_subtraction = bool(msg.get("hist_subtraction", True))
        t = time.perf_counter()
        self.edges, self.bins = bin_matrix(self.X_train, bins)         # codes uint8 up to 256 bins
        self.X_train = None           # only the codes and edges are used from here on (a caller may still hold it)
        self.nbins = [len(e) + 1 for e in self.edges]
        self.features = [f for f, nb in enumerate(self.nbins) if nb >= 2]   # constant columns give no split
        self._engine_col = np.full(len(self.nbins), -1, dtype=np.int64)        # column -> its index in the engine
        self._engine_col[self.features] = np.arange(len(self.features))
        self.pub = pub
        used = self.bins if len(self.features) == self.bins.shape[1] else self.bins[:, self.features]
        self.engine = HistEngine(pub, used, [self.nbins[f] for f in self.features], self.workers)
        del used
        self.timings["binning"] += time.perf_counter() - t
        # the active party checks the rows are aligned: this party's ids, hashed, under its key (no digest in the
        # clear crosses the server)
        t = time.perf_counter()
        try:
            alignment = encrypt_alignment(pub, self.ids_train, self.ids_test, self.link)
        except CiphertextError as e:
            raise ProtocolError(f"cannot encrypt under the proposed key: {e}") from None
        self.ops["alignment_encryptions"] += 1
        self.timings["alignment"] += time.perf_counter() - t
        return {"type": "setup_ok", "n_features": len(self.feature_names), "alignment": alignment}

    def _load_gradients(self, g):
        if not isinstance(g, dict):
            raise ProtocolError("gradients must be a dict")
        try:
            layout = SlotLayout.from_message(require(g, "layout", dict))
        except (ValueError, SlotOverflowError) as e:
            raise ProtocolError(f"bad slot layout: {e}") from None
        if layout.n_max < self.n:
            raise ProtocolError("slot layout too small for the number of rows")
        if layout.n_channels > _MAX_CHANNELS:
            raise ProtocolError(f"slot layout with more than {_MAX_CHANNELS} channels")
        packing = require(g, "packing", bool)
        compress = require(g, "compress", bool)
        try:
            units = layout.units(self.pub.usable_bits, packing)
        except SlotOverflowError as e:
            raise ProtocolError(f"slot layout does not fit the key: {e}") from None
        t = time.perf_counter()
        try:
            self.engine.load(_ciphertext_view(self.pub, require(g, "cts", np.ndarray), self.n * len(units)),
                             len(units))
        except (CiphertextError, WorkerError) as e:
            raise ProtocolError(str(e)) from None
        self.timings["deserialize"] += time.perf_counter() - t
        self._grad = {"units": len(units), "layout": layout, "unit_ranges": units, "compress": compress}
        self._lists = {}
        self._counts = {}

    # ------------------------------------------------------------------------------- layers
    def _check_layer(self, t, d, assign, open_, has_grad):
        if self._predicting:
            raise ProtocolError("training request after prediction started")
        if has_grad:
            # a later tree (a round whose root was never opened sends nothing), always at depth 0
            if d != 0 or t <= self.tree:
                raise ProtocolError(f"gradients must start a new tree (after tree {self.tree}) at depth 0, "
                                    f"got tree {t} depth {d}")
        elif t != self.tree or d != self.depth + 1 or self.tree < 0:
            raise ProtocolError(f"layer out of order: tree {t} depth {d} after tree {self.tree} depth {self.depth}")
        if t >= self.n_trees:
            raise ProtocolError(f"tree {t} is beyond the {self.n_trees} trees agreed at setup")
        if d >= self.max_depth:
            raise ProtocolError(f"depth {d} is beyond the maximum depth {self.max_depth} agreed at setup")
        lo_id, hi_id = (1 << d) - 1, (1 << (d + 1)) - 2
        present = assign[assign >= 0]
        if present.size and (int(present.min()) < lo_id or int(present.max()) > hi_id):
            raise ProtocolError(f"node ids inconsistent with depth {d} (must be in [{lo_id}, {hi_id}])")
        if not open_ or len(set(open_)) != len(open_):
            raise ProtocolError("open node list empty or duplicated")
        if len(open_) > (1 << d):
            raise ProtocolError(f"{len(open_)} open nodes at depth {d}: more than 2^{d}")
        if any(not lo_id <= v <= hi_id for v in open_):
            raise ProtocolError(f"open node ids inconsistent with depth {d}")
        if d == 0 and not np.all(assign == 0):
            raise ProtocolError("at depth 0 every row must be in the root")
        ids, counts = np.unique(present, return_counts=True)
        rows_in = dict(zip(ids.tolist(), counts.tolist()))
        if d > 0:
            self._check_children(assign)
            self._check_small_children(rows_in, open_)
        sizes = {}
        for nid in open_:
            sizes[nid] = rows_in.get(nid, 0)
            if sizes[nid] < max(2, self.min_rows):
                raise ProtocolError(f"node {nid} has {sizes[nid]} rows, fewer than the {self.min_rows} agreed "
                                    "at setup: no answer")

    def _check_children(self, assign):
        prev = self._prev_assign
        in_open = np.isin(prev, np.asarray(self._prev_open, dtype=np.int64))
        if np.any(assign[~in_open] != -1):
            raise ProtocolError("rows outside the previous layer's open nodes were put in a node")
        a, p = assign[in_open], prev[in_open]
        if not np.all((a == -1) | (a == 2 * p + 1) | (a == 2 * p + 2)):
            raise ProtocolError("a row moved to a node that is not a child of its node one layer up")
        for pid in self._prev_open:
            ch = assign[prev == pid]
            closed = ch == -1
            if closed.any():
                if not closed.all():
                    raise ProtocolError(f"node {pid}: some rows left the tree while others went to its children")
                if pid in self._own:
                    raise ProtocolError(f"node {pid} was split by this party but its rows left the tree")
                continue
            left = ch == 2 * pid + 1
            if left.all() or not left.any():
                raise ProtocolError(f"node {pid}: a split with an empty child")
            if pid in self._own and not np.array_equal(left, self._own[pid]):
                raise ProtocolError(f"node {pid}: its children differ from the partition this party returned")

    def _check_small_children(self, rows_in: dict, open_):
        """A child below the minimum whose sibling is open: refused.  The active party holds the parent's sums over
        the parent's candidates, so the sibling's sums would give this child's by subtraction, at every threshold."""
        m = max(2, self.min_rows)
        open_set = set(open_)
        for pid in self._prev_open:
            kids = (2 * pid + 1, 2 * pid + 2)
            for child, sibling in (kids, kids[::-1]):
                if sibling in open_set and child not in open_set and 0 < rows_in.get(child, 0) < m:
                    raise ProtocolError(f"node {child} is below the {self.min_rows} rows agreed at setup and its "
                                        f"sibling {sibling} is open: its sums would follow from the parent's; "
                                        "no answer")

    def _layer(self, msg):
        t, d = require(msg, "tree", int), require(msg, "depth", int)
        assign = int_array(msg, "assign", self.n, -1, 2**31 - 1)
        open_ = int_list(msg, "open", 0, 2**31 - 1)
        has_grad = "gradients" in msg
        self._check_layer(t, d, assign, open_, has_grad)
        if has_grad:
            self._load_gradients(msg["gradients"])
        if self._grad is None:
            raise ProtocolError("layer request before any gradients")
        idx = {}

        def rows(nid):
            if nid not in idx:
                idx[nid] = np.flatnonzero(assign == nid)
            return idx[nid]

        pairs = self._pairs(d, open_, rows)
        paired = set(pairs) | {x for x, _parent in pairs.values()}
        direct = [nid for nid in open_ if nid not in paired]
        t0 = time.perf_counter()
        before = self.engine.counts["multiplications"]
        hists = self.engine.histograms({nid: rows(nid) for nid in sorted(direct + list(pairs))})
        self.ops["additions"] += self.engine.counts["multiplications"] - before
        self.timings["histogram"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        G, pub = self._grad, self.pub
        self._pending = {}
        lists = {}
        replies = []                  # (entry without cts, number of ciphertexts)
        groups = []

        def offer(nid, F, B):
            raw = secrets.token_bytes(8 * len(F)).hex()          # one 64-bit random id each, one draw
            ids = [raw[16 * i:16 * i + 16] for i in range(len(F))]
            self._pending.update(zip(ids, zip(repeat(int(nid)), F.tolist(), B.tolist())))
            return ids

        def cumulative(hist, F, B):
            # the engine's histograms are cumulative: bin b of a column sums the rows in bins 0..b
            return self.engine.handles(hist, self._engine_col[F], B)

        def pack(values, n_rows):
            # fields as wide as sums over the node's rows need (the active party knows its row count too)
            w = G["layout"].node_widths(G["unit_ranges"], n_rows)
            uw = [sum(w[a:b]) for a, b in G["unit_ranges"]]
            plan = pack_plan(len(values), uw, pub.usable_bits, G["compress"])
            groups.extend([(values[i][u], uw[u]) for i, u in fields] for fields in plan)
            return len(plan)

        counts = {}                   # node -> bin counts of its rows (kept for the next layer's pairs)
        for nid in direct:
            counts[nid] = self._bin_counts(rows(nid))
            F, B = np.nonzero(self._admissible(rows(nid).size, counts[nid]))
            order = list(range(F.size))
            _RNG.shuffle(order)                 # order would reveal feature boundaries
            F, B = F[order], B[order]
            lists[nid] = (F, B)
            ids = offer(nid, F, B)
            replies.append(({"nid": int(nid), "ids": ids}, pack(cumulative(hists[nid], F, B), rows(nid).size)))
        for s_nid, (x_nid, parent) in pairs.items():
            counts[s_nid] = self._bin_counts(rows(s_nid))
            # the children split the parent's rows (checked): the larger's counts are the parent's minus the smaller's
            up = self._counts.get(parent)
            counts[x_nid] = up - counts[s_nid] if up is not None else self._bin_counts(rows(x_nid))
            # the parent's candidates that are admissible in either child, in the parent's order
            Fp, Bp = self._lists[parent]
            sel_s = self._admissible(rows(s_nid).size, counts[s_nid])[Fp, Bp]
            sel_x = self._admissible(rows(x_nid).size, counts[x_nid])[Fp, Bp]
            keep = sel_s | sel_x
            F, B, sel_s, sel_x = Fp[keep], Bp[keep], sel_s[keep], sel_x[keep]
            lists[s_nid] = lists[x_nid] = (F, B)
            entry = {"nid": int(s_nid), "sibling": int(x_nid), "pos": np.flatnonzero(keep).astype(np.int32),
                     "sel": sel_s.astype(np.uint8), "sel_sibling": sel_x.astype(np.uint8),
                     "ids": offer(s_nid, F[sel_s], B[sel_s]), "ids_sibling": offer(x_nid, F[sel_x], B[sel_x])}
            replies.append((entry, pack(cumulative(hists[s_nid], F, B), rows(s_nid).size)))
        self.timings["cumulate"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        packed = self.engine.compress(groups)
        self.ops["shifts"] += sum(len(g) - 1 for g in groups)
        self.ops["additions"] += sum(len(g) - 1 for g in groups)
        self.timings["compress"] += time.perf_counter() - t0
        out, pos, w = [], 0, pub.ct_bytes
        for entry, n_ct in replies:
            entry["cts"] = np.frombuffer(memoryview(packed)[pos * w:(pos + n_ct) * w], dtype=np.uint8).copy()
            out.append(entry)
            pos += n_ct
        self._lists = lists
        self._counts = counts
        self._idx = idx
        self.tree, self.depth = t, d
        self._prev_assign, self._prev_open = assign, list(open_)
        self._own = {}
        self._split_done = False
        return {"type": "hist", "nodes": out}

    def _pairs(self, d, open_, rows) -> dict:
        """{smaller child: (its sibling, parent)} for the sibling pairs that are both open: only the smaller
        child's sums are sent, over the parent's candidates, and the active party subtracts them from the
        parent's decrypted sums (it knows those and both children's rows, so it learns nothing new)."""
        if not self.hist_subtraction or d == 0:
            return {}
        open_set = set(open_)
        out = {}
        for nid in open_:
            sib = nid + 1
            if nid % 2 == 1 and sib in open_set:
                parent = (nid - 1) // 2
                if parent not in self._lists:
                    continue
                small, large = (nid, sib) if rows(nid).size <= rows(sib).size else (sib, nid)
                out[small] = (large, parent)
        return out

    def _bin_counts(self, rows) -> np.ndarray:
        """(columns, widest bin count) matrix: how many of ``rows`` fall in each bin of each column."""
        n_cols = self.bins.shape[1]
        width = max(self.nbins, default=1)
        counts = np.zeros(n_cols * width, dtype=np.int64)
        offsets = np.arange(n_cols, dtype=np.intp) * width
        step = max(1, (1 << 20) // max(1, n_cols))     # rows per pass: whole code rows, one bincount for all columns
        for a in range(0, rows.size, step):
            keys = self.bins[rows[a:a + step]].astype(np.intp)
            keys += offsets
            counts += np.bincount(keys.ravel(), minlength=counts.size)
        return counts.reshape(n_cols, width)

    def _admissible(self, n_rows: int, counts) -> np.ndarray:
        """(columns, widest bin count - 1) booleans: [f, b] when a threshold after bin b of column f leaves at least
        the agreed minimum rows on each side of a node of ``n_rows`` rows and bin b holds rows (after an empty bin
        the split repeats the last one).  So this party's own splits never create a node below the minimum (see
        _check_small_children).  ``counts``: the rows' :meth:`_bin_counts` (zero past a column's own bins, and a
        constant column's one bin holds every row, so neither offers a threshold there)."""
        m = max(2, self.min_rows)
        left = np.cumsum(counts, axis=1)[:, :-1]
        return (counts[:, :-1] > 0) & (left >= m) & (left <= n_rows - m)

    # ------------------------------------------------------------------------------- splits
    def _split(self, msg):
        entries = require(msg, "ids", list)
        if not entries:
            raise ProtocolError("split request empty")
        groups = []
        for e in entries:
            tied = [e] if isinstance(e, str) else e
            if not isinstance(tied, list) or not tied or len(set(map(str, tied))) != len(tied):
                raise ProtocolError("split request entries must be non-empty lists of distinct ids")
            for sid in tied:
                check_split_id(sid)
                if sid not in self._pending:
                    raise ProtocolError(f"unknown split id {sid!r}")
            groups.append(tied)
        if self._split_done:
            raise ProtocolError("one split request per layer")
        nodes = []
        for tied in groups:
            nids = {self._pending[s][0] for s in tied}
            if len(nids) != 1:
                raise ProtocolError("tied candidates of different nodes in one entry")
            nodes.append(nids.pop())
        if len(set(nodes)) != len(nodes):
            raise ProtocolError("two split entries for one node")
        t = time.perf_counter()
        chosen, sizes, parts = [], [], []
        for tied, nid in zip(groups, nodes):
            # ties between this party's candidates: the first by (feature, bin), as the oracle does
            sid = min(tied, key=lambda s: (self._pending[s][1], self._pending[s][2]))
            _nid, f, b = self._pending[sid]
            ii = self._idx[nid]
            m = self.bins[ii, f] <= b
            self._own[nid] = m
            chosen.append(sid)
            sizes.append(int(ii.size))
            parts.append(m.astype(np.uint8))
            self.splits[sid] = {"feature": self.feature_names[f], "feature_index": int(f), "bin": int(b),
                                "threshold": float(self.edges[f][b]), "tree": int(self.tree), "node": int(nid),
                                "depth": int(self.depth)}
        self._split_done = True
        self.timings["partition"] += time.perf_counter() - t
        return {"type": "partition", "ids": chosen, "sizes": sizes,
                "left": np.concatenate(parts) if parts else np.zeros(0, np.uint8)}

    # ------------------------------------------------------------------------------- prediction
    def _predict(self, msg):
        # prediction ends training: no layer request is answered after it (see _check_layer)
        self._predicting = True
        if self._answers is None:
            self._answers = PredictionAnswers(self.splits, self.X_test)
        t0 = time.perf_counter()
        out = self._answers.answer(msg)
        self.timings["predict"] += time.perf_counter() - t0
        return out

    def _finish(self, msg):
        self._grad = None
        self._lists = {}
        self._counts = {}
        self.close()
        return {"type": "done", "stats": {"ops": {k: int(v) for k, v in self.ops.items()},
                                          "timings_s": {k: float(v) for k, v in self.timings.items()}}}

    def model(self) -> dict:
        return {"format": PASSIVE_FORMAT, "party": self.name,
                "features": self.feature_names, "splits": self.splits, "link": self.link}
