"""The active party: holds the labels and the private key, and drives the protocol.

``step(inbox) -> outbox`` (``{passive_name: message}``; ``None`` when finished).  Nothing here
imports NVFlare: the in-process driver (:mod:`.driver`) and the FLARE controller/executors run
exactly this code and only route the messages.

Per tree the active party quantises the reference data once (:mod:`.objectives`), packs all
channels of a row into one plaintext (or as few as fit; or one per channel with
``packing=False``), encrypts (persistent worker processes), and sends it with the first layer.
Per layer every passive party returns compressed cumulative sums for each open node under random
ids (for two open siblings, the smaller one's only: the larger one's are the parent's minus these); the active party checks their number against what the passive declared at setup (features x
(bins - 1) per node), decrypts, unpacks, compares exact gains of its own and the passive
candidates (:func:`.gains.select`), and asks the winning passive party, by id only, for the
left/right partition (when several of its candidates tie, it sends all of them and the passive
picks the first by feature and bin, as the oracle does).  Prediction goes layer by layer: each
passive split is asked only about the test rows that reach it (:mod:`.inference`, the code path prediction-only
runs share).

(Over 400 lines: the active side is one generator whose phases -- setup, layers, decoding, split search,
partitions, prediction -- share its state; splitting it would pass that state around instead.)
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict

import numpy as np

from ..crypto import CiphertextError, KeyHolder, make_key_holder
from ..crypto.packing import SlotLayout, SlotOverflowError, pack_plan, unpack_fields
from ..crypto.workers import WorkerError
from .gains import make_criterion, select
from .gc_pause import gc_paused
from .inference import leaf_outputs, route_layers
from .messages import (ACTIVE_FORMAT, PROTOCOL_VERSION, Exchanges, ProtocolError, alignment_pieces, alignment_value,
                       check_split_ids, count_traffic, expect_reply, int_array, int_list, join_pieces, require,
                       split_alignment)
from .objectives import make_objective, tree_channels
from .params import VerticalParams
from .quantize import bin_matrix
from .stats import PlainHist, cum_candidates

_MAX_DECLARED_FEATURES = 100_000
# rows packed and encrypted per call of the key holder (enough for its pool to balance; bounds the buffers)
_ENCRYPT_ROWS = 32_768


def _positive_parts(chan, lo, hi):
    """(the signed channels, exact sums of their positive parts): with a node's plain totals, the range of a
    signed channel's left sum (:meth:`ActiveParty._channel_ranges`).  ((), None) when no channel is signed."""
    signed = tuple(c for c in range(len(chan)) if int(lo[c]) < 0)
    if not signed:
        return (), None
    pos = [[v if v > 0 else 0 for v in chan[c]] for c in signed]
    return signed, PlainHist(pos, [0] * len(signed), [max(0, int(hi[c])) for c in signed])


def _first_out_of_range(vecs, ranges):
    """The first channel some vector of ``vecs`` leaves its [low, high] in, or None; exact (Python integers, one
    min and one max per channel)."""
    if not vecs:
        return None
    lows, highs = ranges
    for c, col in enumerate(zip(*vecs)):
        if min(col) < lows[c] or max(col) > highs[c]:
            return c
    return None


_OWN_PAIRS = 1 << 22        # (row, feature) pairs per pass of the active party's own bin sums


class _Timer:
    def __init__(self, timings, key):
        self.timings, self.key = timings, key

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        self.timings[self.key] += time.perf_counter() - self.t


class ActiveParty:
    def __init__(self, name: str, X_train, y_train, X_test, feature_names, n_classes: int,
                 passive_names, params: VerticalParams, ids_train=None, ids_test=None,
                 key_holder: KeyHolder | None = None):
        self.name = name
        self.params = P = params.validate()
        self.X_train = np.asarray(X_train, dtype=np.float64)
        self.X_test = np.asarray(X_test, dtype=np.float64)
        self.n = self.X_train.shape[0]
        self.n_classes = int(n_classes)
        self.objective = None
        if P.model == "gbdt" and P.objective == "squared_error":
            self.y = np.asarray(y_train, dtype=np.float64)
            if self.y.shape != (self.n,) or not np.all(np.isfinite(self.y)):
                raise ValueError("regression targets must be finite, one per training row")
            self.objective = make_objective(P.objective, 0)
        else:
            self.y = np.asarray(y_train).astype(np.int64)
            if self.y.shape != (self.n,):
                raise ValueError("labels do not match the training rows")
            if self.n_classes < 2 or self.y.min() < 0 or self.y.max() >= self.n_classes:
                raise ValueError("labels must be integer codes in [0, n_classes)")
            if P.model == "gbdt":
                self.objective = make_objective(P.objective, self.n_classes)
        self.n_outputs = self.objective.n_outputs if self.objective else 1
        self.feature_names = list(feature_names)
        self.passives = list(passive_names)
        if not self.passives:
            raise ValueError("at least one passive party is needed")
        self.ids_train = list(ids_train) if ids_train is not None else list(range(self.n))
        self.ids_test = list(ids_test) if ids_test is not None else list(range(len(self.X_test)))
        self.edges, self.bins = bin_matrix(self.X_train, P.bins)       # codes uint8 up to 256 bins
        self.X_train = None           # only the codes and edges are used from here on
        self.crit = make_criterion(P, self.n_classes, self.n_outputs)
        self.kh = key_holder
        self.trees: list = []
        self.timings = defaultdict(float)
        self.comm = Counter()
        self.layout_info: dict = {}
        self.passive_stats: dict = {}
        self.declared: dict = {}
        self.links: dict = {}         # passive -> the link key it sent under this party's key (prediction runs' MAC)
        self.test_pred = None
        self.test_score = None
        self._exchanges = Exchanges(self._protocol)
        self.base_score = 0.0
        self._node_sums: dict = {}   # passive -> node -> decrypted sums over its candidates (previous layer)
        self._range_stats = ((), None)   # this tree's signed channels and their positive parts (_channel_ranges)

    # ---------------------------------------------------------------- driver interface
    def step(self, inbox):
        """Advance the protocol.  inbox = replies to the previous outbox ({name: reply}).
        Returns the next outbox ({passive_name: message}) or None when finished."""
        count_traffic(self.comm, (inbox or {}).values(), "active",
                      self.kh.public.ct_bytes if self.kh is not None else 0)
        with gc_paused():
            out = self._exchanges.send(inbox)
        if out is not None:
            count_traffic(self.comm, out.values(), "passive", self.kh.public.ct_bytes)
        return out

    def close(self) -> None:
        """Stop the key holder's worker processes (also done when the protocol finishes)."""
        if self.kh is not None:
            self.kh.close()

    # ---------------------------------------------------------------- protocol
    def _protocol(self):
        P = self.params
        with _Timer(self.timings, "keygen"):
            if self.kh is None:
                self.kh = make_key_holder(P.scheme, P.key_bits, P.obfuscation, P.allow_insecure_key)
        with _Timer(self.timings, "workers_start"):
            self.kh.start(P.n_workers)
        pub = self.kh.public
        setup = {"type": "setup", "version": PROTOCOL_VERSION, "pk": pub.to_message(),
                 "n_train": int(self.n), "n_test": int(len(self.X_test)),
                 "bins": int(P.bins), "model": P.model, "n_trees": int(P.n_trees),
                 "max_depth": int(P.max_depth), "min_rows_node": int(P.min_rows_node),
                 "hist_subtraction": bool(P.hist_subtraction)}
        replies = yield {p: dict(setup) for p in self.passives}
        for p in self.passives:
            r = expect_reply(replies, p, "setup_ok")
            nf = require(r, "n_features", int)
            if not 0 <= nf <= _MAX_DECLARED_FEATURES:
                raise ProtocolError(f"{p}: declares {nf} features (at most {_MAX_DECLARED_FEATURES})")
            self._check_alignment(p, r)
            self.declared[p] = nf

        F = None
        if self.objective is not None:
            base = self.objective.base_score(self.y)
            self.base_score = [float(v) for v in base] if self.n_outputs > 1 else float(base[0])
            F = np.tile(base, (self.n, 1))
        self.timings["train_start"] = time.perf_counter()
        for t in range(P.n_trees):
            t0 = time.perf_counter()
            tree, leaf_of = yield from self._build_tree(t, F)
            self.trees.append(tree)
            if F is not None:
                vals = {nd["nid"]: nd["value"] for nd in tree["nodes"] if nd["leaf"]}
                for nid, idx in leaf_of.items():
                    F[idx] += np.asarray(vals[nid], dtype=np.float64)
            self.timings[f"tree_{t}"] = time.perf_counter() - t0
        self.timings["train"] = time.perf_counter() - self.timings.pop("train_start")

        with _Timer(self.timings, "predict"):
            yield from self._predict()
        replies = yield {p: {"type": "finish"} for p in self.passives}
        for p in self.passives:
            r = expect_reply(replies, p, "done")
            self.passive_stats[p] = r.get("stats", {})
        self.close()

    def _check_alignment(self, p, reply) -> None:
        """The passive party's alignment value (:func:`.messages.alignment_value` of its ids, with a link key,
        encrypted under this party's key) must hold this party's own hash: same rows, same order.  Only ciphertexts
        crossed the server.  The link key is kept for the model part (prediction runs check their rows with it)."""
        with _Timer(self.timings, "alignment"):
            pub = self.kh.public
            count = len(alignment_pieces(0, pub))
            if "alignment" not in reply:
                raise ProtocolError(f"{p}: setup_ok without its alignment ciphertext")
            try:
                raw = pub.wire_bytes(require(reply, "alignment", np.ndarray), count)
                pub.from_bytes(raw, check=True)
                got = self.kh.decrypt_bytes(raw, 1)
            except (CiphertextError, WorkerError) as e:
                raise ProtocolError(f"{p}: alignment ciphertext refused: {e}") from None
            width = pub.usable_bits - 1
            if any(not 0 <= int(v) < (1 << width) for v in got):
                raise ProtocolError(f"{p}: alignment ciphertext refused: it does not decrypt to an alignment value")
            digest, link = split_alignment(join_pieces(got, pub))
        if digest != alignment_value(self.ids_train, self.ids_test) or len(link) != 64:
            raise ProtocolError(f"{p}: its rows are not this party's ({self.n} training and {len(self.X_test)} test "
                                "rows on both sides, but different sample ids or order): every party must train on "
                                "the rows the PSI phase kept")
        self.links[p] = link

    # ---------------------------------------------------------------- reference data
    def _channels(self, F):
        if self.objective is None:
            return tree_channels(self.y, self.n_classes)
        return self.objective.channels(F, self.y, self.params.precision)

    def _encrypt_tree(self, F):
        P = self.params
        pub = self.kh.public
        with _Timer(self.timings, "quantise_pack"):
            try:
                chan, lo, hi = self._channels(F)
                layout = SlotLayout.for_channels(lo, hi, self.n)
                vals = np.array(chan, dtype=object).T
                layout.check_values(vals)                      # slot overflow impossible: asserted
                units = layout.units(pub.usable_bits, P.packing)
            except (ValueError, SlotOverflowError) as e:
                raise ValueError(f"the {P.model} reference data cannot be packed: {e}") from None
            stats = PlainHist(chan, lo, hi)
            self._range_stats = _positive_parts(chan, lo, hi)
            del chan
            unit_layouts = [layout.unit_layout(a, b) for a, b in units]
        # packed and encrypted by row block, straight into the message's one array: no list of every row's
        # plaintext and no second copy of the ciphertexts (the tree's largest buffers)
        row_bytes = len(units) * pub.ct_bytes
        cts = np.empty(self.n * row_bytes, dtype=np.uint8)
        for r0 in range(0, self.n, _ENCRYPT_ROWS):
            r1 = min(self.n, r0 + _ENCRYPT_ROWS)
            with _Timer(self.timings, "quantise_pack"):
                per_unit = [ul.pack_rows(vals[r0:r1, a:b]) for ul, (a, b) in zip(unit_layouts, units)]
                plain = [v for row in zip(*per_unit) for v in row]          # row-major
            with _Timer(self.timings, "encrypt"):
                cts[r0 * row_bytes:r1 * row_bytes] = np.frombuffer(self.kh.encrypt_bytes(plain, P.n_workers),
                                                                   dtype=np.uint8)
            del plain, per_unit
        del vals
        unit_widths = [sum(layout.widths[a:b]) for a, b in units]
        grad = {"layout": layout.to_message(), "packing": bool(P.packing), "compress": bool(P.compress),
                "cts": cts}
        whole = pub.usable_bits // layout.total_width
        self.layout_info = {"widths": list(layout.widths), "total_width": layout.total_width,
                            "units_per_row": len(units), "unit_widths": unit_widths,
                            "values_per_ciphertext": (pub.usable_bits // max(unit_widths)) if P.compress else 1,
                            "capacity_values": whole, "usable_bits": pub.usable_bits,
                            "packing": bool(P.packing), "compress": bool(P.compress)}
        return layout, units, unit_widths, stats, grad

    def _build_tree(self, t, F):
        P = self.params
        layout, units, unit_widths, stats, grad = self._encrypt_tree(F)
        self._node_sums = {}
        nodes: dict = {}
        node_idx = {0: np.arange(self.n)}
        layer = [0]
        leaf_of = {}
        min_rows = max(2, P.min_rows_node)
        for depth in range(P.max_depth + 1):
            totals = {nid: stats.total(node_idx[nid]) for nid in layer}
            open_ = [nid for nid in layer
                     if depth < P.max_depth and totals[nid][0] >= min_rows and self.crit.node_ok(totals[nid][1])]
            best, masks = {}, {}
            if open_:
                assign = np.full(self.n, -1, dtype=np.int32)
                for nid in layer:
                    assign[node_idx[nid]] = nid
                msg = {"type": "layer", "tree": int(t), "depth": int(depth), "assign": assign,
                       "open": [int(v) for v in open_]}
                if depth == 0:
                    msg["gradients"] = grad
                    grad = None             # held by the message only: freed once every passive has it
                replies = yield {p: dict(msg) for p in self.passives}
                ranges = {nid: self._channel_ranges(node_idx[nid], totals[nid][1]) for nid in open_}
                sizes = {nid: int(node_idx[nid].size) for nid in open_}
                cands = self._passive_candidates(replies, open_, layout, units, sizes, ranges)
                with _Timer(self.timings, "split_search"):
                    for nid in open_:
                        b = self._best_split(node_idx[nid], totals[nid], stats, cands.get(nid, {}))
                        if b is not None:
                            best[nid] = b
                req = defaultdict(list)
                for nid, b in best.items():
                    if b["party"] != self.name:
                        req[b["party"]].append(b["tied"])
                if req:
                    replies = yield {p: {"type": "split", "ids": tied} for p, tied in req.items()}
                    masks = self._partitions(replies, req, best, node_idx)
            next_layer = []
            for nid in layer:
                idx = node_idx[nid]
                cnt, tot = totals[nid]
                if nid in best:
                    b = best[nid]
                    go_left = self.bins[idx, b["feature"]] <= b["bin"] if b["party"] == self.name else masks[nid]
                    l, r = 2 * nid + 1, 2 * nid + 2
                    node_idx[l], node_idx[r] = idx[go_left], idx[~go_left]
                    nd = {"nid": nid, "depth": depth, "leaf": False, "n": cnt, "owner": b["party"],
                          "left": l, "right": r}
                    if b["party"] == self.name:
                        f = b["feature"]
                        nd.update(feature=self.feature_names[f], feature_index=f, bin=b["bin"],
                                  threshold=float(self.edges[f][b["bin"]]))
                    else:
                        nd["split_id"] = b["split_id"]
                    nodes[nid] = nd
                    next_layer += [l, r]
                else:
                    nodes[nid] = {"nid": nid, "depth": depth, "leaf": True, "n": cnt,
                                  "value": self.crit.leaf(tot)}
                    leaf_of[nid] = idx
                del node_idx[nid]
            layer = next_layer
            if not layer:
                break
        return {"nodes": [nodes[k_] for k_ in sorted(nodes)]}, leaf_of

    # ---------------------------------------------------------------- decrypt & decode
    def _passive_candidates(self, replies, open_, layout, units, sizes, ranges):
        """{node: {passive: [(id, left channel sums)]}} from the passives' histogram replies (``sizes``: each open
        node's row count, which sets the width of the returned fields, :meth:`.SlotLayout.node_widths`; ``ranges``:
        the range of every channel's left sum in each open node, :meth:`_channel_ranges`).

        A reply entry is either one node's candidates, or a sibling pair: the smaller child's sums over
        some of the parent's candidates (``pos``), from which the larger child's follow by subtracting them
        from the parent's decrypted sums (histogram subtraction on plaintexts: half the shifts and
        decryptions).  ``sel`` / ``sel_sibling`` say which of those candidates each child is offered."""
        P = self.params
        pub = self.kh.public
        open_set = set(open_)
        by_size = {}

        def node_fields(nid):
            # (per unit: channel widths, signedness, channel range; the units' field widths) for the node's rows
            n = sizes[nid]
            if n not in by_size:
                w = layout.node_widths(units, n)
                by_size[n] = ([(w[a:b], layout.signed[a:b], a, b) for a, b in units], [sum(w[a:b]) for a, b in units])
            return by_size[n]

        jobs, raws = [], []
        with _Timer(self.timings, "deserialize"):
            for p in self.passives:
                r = expect_reply(replies, p, "hist")
                prev = self._node_sums.get(p, {})
                covered = []
                bound = self.declared[p] * (P.bins - 1)
                seen = set()          # split ids are unique across the whole reply (they name one node's candidate)
                for nd in require(r, "nodes", list):
                    nid = require(nd, "nid", int)
                    if nid not in open_set:
                        raise ProtocolError(f"{p}: histogram reply for node {nid}, which is not open")
                    ids = self._offered(p, nd, "ids", bound, seen)
                    if "sibling" in nd:
                        if not P.hist_subtraction:
                            raise ProtocolError(f"{p}: a sibling pair although histogram subtraction is off")
                        sib = require(nd, "sibling", int)
                        parent = (nid - 1) // 2
                        if nid == 0 or sib == nid or (sib - 1) // 2 != parent or sib not in open_set \
                                or parent not in prev:
                            raise ProtocolError(f"{p}: node {nid} and {sib} are not an open sibling pair")
                        n_par = len(prev[parent])
                        pos = int_array(nd, "pos", None, 0, n_par - 1)
                        if pos.size and np.any(np.diff(pos) <= 0):
                            raise ProtocolError(f"{p}: candidate positions of node {nid} not increasing")
                        sel = int_array(nd, "sel", pos.size, 0, 1).astype(bool)
                        sel_sib = int_array(nd, "sel_sibling", pos.size, 0, 1).astype(bool)
                        ids_sib = self._offered(p, nd, "ids_sibling", bound, seen)
                        if len(ids) != int(sel.sum()) or len(ids_sib) != int(sel_sib.sum()):
                            raise ProtocolError(f"{p}: split ids of nodes {nid} and {sib} do not match their "
                                                "candidates")
                        pair = (sib, parent, pos, sel, sel_sib, ids_sib)
                        n_values = pos.size
                        covered += [nid, sib]
                    else:
                        pair, n_values = None, len(ids)
                        covered.append(nid)
                    fields, unit_widths = node_fields(nid)      # the sums are over nid's rows (the smaller child's)
                    plan = pack_plan(n_values, unit_widths, pub.usable_bits, P.compress)
                    try:
                        raw = pub.wire_bytes(require(nd, "cts", np.ndarray), len(plan))
                        pub.from_bytes(raw, check=True)
                    except CiphertextError as e:
                        raise ProtocolError(f"{p}: {e}") from None
                    jobs.append((p, nid, ids, n_values, plan, pair, fields))
                    raws.append(raw)
                    self.comm["hist_nodes"] += 1 if pair is None else 2      # nodes answered, not reply entries
                if sorted(covered) != sorted(open_):
                    raise ProtocolError(f"{p}: histogram reply does not cover the open nodes")
        with _Timer(self.timings, "decrypt"):
            try:
                plain = self.kh.decrypt_bytes(b"".join(raws), P.n_workers)
            except (CiphertextError, WorkerError) as e:
                raise ProtocolError(f"returned ciphertexts do not decrypt: {e}") from None
        out = defaultdict(dict)
        sums = defaultdict(dict)
        with _Timer(self.timings, "unpack"):
            pos_ct = 0
            nch = layout.n_channels
            shapes = {}               # (node's widths, units of a ciphertext's fields) -> its slot widths, signs
            whole = len(units) == 1          # one unit holds every channel: a field is a whole vector
            for p, nid, ids, n_values, plan, pair, fields in jobs:
                try:
                    if whole:           # ciphertext c holds whole vectors, items in order: decode, then cut
                        flat = []
                        for fl in plan:
                            key = (id(fields), len(fl))
                            if key not in shapes:
                                shapes[key] = (fields[0][0] * len(fl), fields[0][1] * len(fl))
                            flat += unpack_fields(plain[pos_ct], *shapes[key])
                            pos_ct += 1
                        vecs = [flat[i:i + nch] for i in range(0, len(flat), nch)]
                    else:
                        vecs = [[0] * nch for _ in range(n_values)]
                        for fl in plan:
                            key = (id(fields), tuple(u for _i, u in fl))
                            if key not in shapes:
                                shapes[key] = ([w for _i, u in fl for w in fields[u][0]],
                                               [x for _i, u in fl for x in fields[u][1]])
                            vals = unpack_fields(plain[pos_ct], *shapes[key])
                            pos_ct += 1
                            k = 0
                            for i, u in fl:
                                a, b = fields[u][2], fields[u][3]
                                vecs[i][a:b] = vals[k:k + b - a]
                                k += b - a
                except SlotOverflowError as e:
                    raise ProtocolError(f"{p}: returned statistics do not decode: {e}") from None
                nodes = [(nid, vecs, None)]
                if pair is not None:
                    sib, parent, pos, sel, sel_sib, ids_sib = pair
                    par = self._node_sums[p][parent]
                    sib_vecs = [[x - y for x, y in zip(par[i], v)] for i, v in zip(pos.tolist(), vecs)]
                    self.comm["derived_sums"] += len(sib_vecs)
                    nodes = [(nid, vecs, sel), (sib, sib_vecs, sel_sib)]
                    ids_of = {nid: ids, sib: ids_sib}
                else:
                    ids_of = {nid: ids}
                for node, node_vecs, node_sel in nodes:
                    bad = _first_out_of_range(node_vecs, ranges[node])
                    if bad is not None:
                        raise ProtocolError(f"{p}: split statistics inconsistent with node {node} "
                                            f"({self._channel_name(bad)} outside the sums its rows allow)")
                    offered = node_vecs if node_sel is None else [v for v, s in zip(node_vecs, node_sel) if s]
                    out[node][p] = list(zip(ids_of[node], offered))
                    sums[p][node] = node_vecs
        self._node_sums = dict(sums)
        return out

    def _offered(self, p, nd, key, bound, seen: set) -> list:
        ids = require(nd, key, list)
        if len(ids) > bound:
            raise ProtocolError(f"{p}: {len(ids)} candidates for node {nd['nid']}, more than the {bound} "
                                f"its {self.declared[p]} declared features x {self.params.bins - 1} thresholds allow")
        check_split_ids(ids)
        n_before = len(seen)
        seen.update(ids)
        if len(seen) != n_before + len(ids):
            raise ProtocolError(f"{p}: duplicate split ids")
        return ids

    def _channel_ranges(self, idx, total) -> tuple:
        """(lows, highs): the exact range of each channel's sum over any subset of the node's rows ``idx``.  A
        channel that is never negative (counts, hessians): [0, the node's total]; a signed one (gradients):
        [the sum of its negative values, the sum of its positive values] over the node's rows.  Every decoded
        field a passive party returns must lie in it: under OU a crafted ciphertext decrypts to a value mod the
        secret p (SECURITY.md, "Okamoto-Uchiyama"), and no field may go unchecked."""
        lows, highs = [0] * len(total), [int(v) for v in total]
        signed, pos_stats = self._range_stats
        if signed:
            _cnt, pos = pos_stats.total(idx)
            for c, s in zip(signed, pos):
                lows[c], highs[c] = int(total[c]) - s, s
        return lows, highs

    def _channel_name(self, c: int) -> str:
        if self.objective is None:
            return f"count of class {c}"
        return f"{'gh'[c % 2]}_{c // 2}"

    def _best_split(self, idx, total, stats, cands):
        _cnt, parent = total
        lefts, owners = [], []
        # own features first (party order: active, then passives in order), feature, bin
        feats = [f for f in range(self.bins.shape[1]) if len(self.edges[f]) >= 1]
        width = max((len(self.edges[f]) + 1 for f in feats), default=1)
        all_c, all_v = [], []
        # the features' bin sums a few features per pass (keys j * width + bin): one pass over a node's rows for a
        # chunk, about 4 million (row, feature) pairs, so a million-row root does not hold 30 copies of its rows
        step = max(1, _OWN_PAIRS // max(1, idx.size))
        node_bins = self.bins[idx]                   # the node's codes, gathered once for every chunk
        for a in range(0, len(feats), step):
            chunk = feats[a:a + step]
            keys = node_bins[:, chunk].astype(np.intp) + np.arange(len(chunk), dtype=np.intp) * width
            c, v = stats.sums(np.repeat(idx, len(chunk)), keys.ravel(), len(chunk) * width)
            all_c += c
            all_v += v
        for j, f in enumerate(feats):
            nb = len(self.edges[f]) + 1
            bc, bv = all_c[j * width:j * width + nb], all_v[j * width:j * width + nb]
            # no child below the node minimum: the passive sites would refuse to answer its open sibling
            for b, _nl, left in cum_candidates(bc, bv, max(2, self.params.min_rows_node)):
                lefts.append(left)
                owners.append((self.name, f, b))
        for p in self.passives:
            got = cands.get(p, [])
            lefts += [left for _sid, left in got]
            owners += [(p, sid, None) for sid, _left in got]
        best, winners = select(lefts, parent, self.crit)
        if best is None or not best > 0:
            return None
        party = owners[winners[0]][0]
        if party == self.name:
            _p, f, b = owners[winners[0]]
            return {"party": party, "feature": f, "bin": b, "gain": best}
        tied = [owners[i][1] for i in winners if owners[i][0] == party]
        return {"party": party, "tied": tied, "gain": best,
                "lefts": {owners[i][1]: lefts[i] for i in winners if owners[i][0] == party}}

    def _partitions(self, replies, req, best, node_idx):
        by_entry = {}
        for nid, b in best.items():
            if "tied" in b:
                by_entry[(b["party"], b["tied"][0])] = nid
        masks = {}
        with _Timer(self.timings, "partition"):
            for p, entries in req.items():
                r = expect_reply(replies, p, "partition")
                chosen = require(r, "ids", list)
                sizes = int_list(r, "sizes", 0, self.n)
                left = int_array(r, "left", None, 0, 1)
                if len(chosen) != len(entries) or len(sizes) != len(entries) or sum(sizes) != left.size:
                    raise ProtocolError(f"{p}: partition reply does not match the request")
                pos = 0
                for tied, sid, sz in zip(entries, chosen, sizes):
                    nid = by_entry[(p, tied[0])]
                    if sid not in tied:
                        raise ProtocolError(f"{p}: partition of node {nid} names a candidate that was not offered")
                    if sz != len(node_idx[nid]):
                        raise ProtocolError(f"{p}: partition of node {nid} has the wrong size")
                    m = left[pos:pos + sz].astype(bool)
                    pos += sz
                    nl = int(m.sum())
                    if nl == 0 or nl == sz:
                        raise ProtocolError(f"{p}: partition of node {nid} leaves a child empty")
                    if self.objective is None and nl != sum(best[nid]["lefts"][sid]):
                        raise ProtocolError(f"{p}: partition of node {nid} contradicts its statistics")
                    best[nid]["split_id"] = sid
                    masks[nid] = m
        return masks

    # ---------------------------------------------------------------- prediction
    def _predict(self):
        """The test rows through the trees, layer by layer (:mod:`.inference`, shared with prediction-only runs)."""
        leaves = yield from route_layers(self.trees, self.X_test, self.name)
        self.test_pred, self.test_score = leaf_outputs(self.trees, leaves, self.objective, self.base_score,
                                                       self.n_classes)

    # ---------------------------------------------------------------- outputs
    def model(self) -> dict:
        return {"format": ACTIVE_FORMAT, "party": self.name, "model": self.params.model,
                "objective": self.objective.name if self.objective else None,
                "params": self.params.to_dict(), "n_classes": self.n_classes,
                "base_score": self.base_score, "features": self.feature_names,
                "passives": self.passives, "links": dict(self.links), "trees": self.trees}

    def ops(self) -> dict:
        ops = Counter(self.kh.ops) if self.kh is not None else Counter()
        for st in self.passive_stats.values():
            for k_, v in (st.get("ops") or {}).items():
                ops[k_] += int(v)
        return dict(ops)
