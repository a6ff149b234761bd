"""The two party roles of the vertical protocol, as message-in / message-out objects.

* :class:`ActiveParty` holds the labels and the private key.  It drives the protocol:
  ``step(inbox) -> outbox`` (``{passive_name: message}``; ``None`` when finished).
* :class:`PassiveParty` holds only its own columns: ``handle(message) -> reply``.

Nothing here imports NVFlare: the in-process driver (:mod:`.driver`) and the FLARE
controller/executors run exactly this code and only route the messages.

Per tree the active party quantises the reference data once (one-hot label counts for a
classification tree, fixed-point (g, h) for GBDT), packs all channels of a sample into one
plaintext (or not: ``packing=False``), encrypts, and sends it with the first layer.  Per layer
every passive party builds encrypted per-feature, per-bin sums for each open node (histogram
subtraction for the larger sibling), turns them into cumulative "left" sums, compresses k of
them into one ciphertext (Horner: c <- c^(2^W) * c'), and returns them under random split
ids.  The active party decrypts, unpacks, computes exact gains for its own and the passive
candidates, picks the best (ties: party, feature, bin), and asks the winning passive party
(by id only) for the left/right partition of the node.
"""
from __future__ import annotations

import math
import secrets
import time
from collections import Counter, defaultdict

import numpy as np

from ..crypto import CiphertextError, KeyHolder, make_key_holder, public_from_message
from . import histo
from .gains import make_criterion
from .messages import (PROTOCOL_VERSION, ProtocolError, check_split_id, ids_digest, int_array,
                       int_list, message_stats, require)
from .packing import SlotLayout, SlotOverflowError
from .params import VerticalParams
from .quantize import apply_bins, fit_bins, to_fixed

_LIMB = 31
_MAX_SAMPLES = 1 << 22          # float64 limb sums stay exact below this


class _Timer:
    def __init__(self, timings, key):
        self.timings, self.key = timings, key

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        self.timings[self.key] += time.perf_counter() - self.t


# ======================================================================================
# plaintext statistics at the active party (exact, integer)
# ======================================================================================
class _PlainHist:
    """Exact per-key sums of integer channels, via 31-bit limbs and float64 bincount
    (every partial sum stays below 2^53, so the float additions are exact)."""

    def __init__(self, chan: list, lo: list, hi: list):
        n = len(chan[0])
        if n >= _MAX_SAMPLES:
            raise ValueError(f"at most {_MAX_SAMPLES - 1} training rows")
        self.lo = [int(v) for v in lo]
        self.limbs = []
        for c, vals in enumerate(chan):
            span = int(hi[c]) - self.lo[c]
            nl = max(1, math.ceil(span.bit_length() / _LIMB))
            off = np.array([int(v) - self.lo[c] for v in vals], dtype=np.int64)
            self.limbs.append([((off >> (_LIMB * j)) & ((1 << _LIMB) - 1)).astype(np.float64)
                               for j in range(nl)])

    def sums(self, idx: np.ndarray, keys: np.ndarray, nkeys: int):
        """-> (counts per key, [channel sums per key])"""
        cnt = np.bincount(keys, minlength=nkeys)
        out = []
        for c, limbs in enumerate(self.limbs):
            tot = [0] * nkeys
            for j, limb in enumerate(limbs):
                s = np.bincount(keys, weights=limb[idx], minlength=nkeys)
                for b in range(nkeys):
                    tot[b] += int(s[b]) << (_LIMB * j)
            lo = self.lo[c]
            out.append([tot[b] + int(cnt[b]) * lo for b in range(nkeys)])
        return [int(x) for x in cnt], [[out[c][b] for c in range(len(out))] for b in range(nkeys)]

    def total(self, idx):
        cnt, sums = self.sums(idx, np.zeros(len(idx), dtype=np.int64), 1)
        return cnt[0], sums[0]


def _cum_candidates(cnt, vecs):
    """Cumulative left sums over bins; admissible thresholds only (bin non-empty, both sides
    non-empty).  Yields (bin, left_count, left_vector)."""
    n = sum(cnt)
    left = [0] * len(vecs[0])
    nl = 0
    for b in range(len(cnt) - 1):
        nl += cnt[b]
        left = [a + v for a, v in zip(left, vecs[b])]
        if cnt[b] > 0 and 0 < nl < n:
            yield b, nl, list(left)


# ======================================================================================
# active party
# ======================================================================================
class ActiveParty:
    def __init__(self, name: str, X_train, y_train, X_test, feature_names, n_classes: int,
                 passive_names, params: VerticalParams, ids_train=None, ids_test=None,
                 key_holder: KeyHolder | None = None):
        self.name = name
        self.params = params.validate()
        self.X_train = np.asarray(X_train, dtype=np.float64)
        self.X_test = np.asarray(X_test, dtype=np.float64)
        self.y = np.asarray(y_train).astype(np.int64)
        self.n = self.X_train.shape[0]
        if self.y.shape != (self.n,):
            raise ValueError("labels do not match the training rows")
        self.n_classes = int(n_classes)
        if self.n_classes < 2 or self.y.min() < 0 or self.y.max() >= self.n_classes:
            raise ValueError("labels must be integer codes in [0, n_classes)")
        if params.model == "gbdt" and self.n_classes != 2:
            raise ValueError("gbdt supports binary labels only (multiclass softmax not implemented)")
        self.feature_names = list(feature_names)
        self.passives = list(passive_names)
        if not self.passives:
            raise ValueError("at least one passive party is needed")
        self.ids_train = list(ids_train) if ids_train is not None else list(range(self.n))
        self.ids_test = list(ids_test) if ids_test is not None else list(range(len(self.X_test)))
        self.edges = fit_bins(self.X_train, params.bins)
        self.bins = apply_bins(self.X_train, self.edges)
        self.crit = make_criterion(params, self.n_classes)
        self.kh = key_holder
        self.trees: list = []
        self.timings = defaultdict(float)
        self.comm = Counter()
        self.layout_info: dict = {}
        self.passive_stats: dict = {}
        self.test_pred = None
        self.test_score = None
        self._gen = None
        self.base_score = 0.0

    # ---------------------------------------------------------------- driver interface
    def step(self, inbox):
        """Advance the protocol.  inbox = replies to the previous outbox ({name: reply}).
        Returns the next outbox ({passive_name: message}) or None when finished."""
        ct_bytes = self.kh.public.ct_bytes if self.kh is not None else 0
        if inbox:
            for r in inbox.values():
                c, b = message_stats(r, ct_bytes)
                self.comm["ciphertexts_to_active"] += c
                self.comm["bytes_to_active"] += b
                self.comm["messages_to_active"] += 1
        if self._gen is None:
            self._gen = self._protocol()
            out = next(self._gen)
        else:
            try:
                out = self._gen.send(inbox)
            except StopIteration:
                return None
        ct_bytes = self.kh.public.ct_bytes
        for m in out.values():
            c, b = message_stats(m, ct_bytes)
            self.comm["ciphertexts_to_passive"] += c
            self.comm["bytes_to_passive"] += b
            self.comm["messages_to_passive"] += 1
        return out

    def _reply(self, replies, p, kind):
        if not isinstance(replies, dict) or p not in replies:
            raise ProtocolError(f"no reply from {p}")
        r = replies[p]
        if not isinstance(r, dict) or r.get("type") != kind:
            got = r.get("type") if isinstance(r, dict) else type(r).__name__
            detail = r.get("error") if isinstance(r, dict) else None
            raise ProtocolError(f"{p}: expected a {kind!r} reply, got {got!r}"
                                + (f" ({detail})" if detail else ""))
        return r

    # ---------------------------------------------------------------- protocol
    def _protocol(self):
        P = self.params
        with _Timer(self.timings, "keygen"):
            if self.kh is None:
                self.kh = make_key_holder(P.scheme, P.key_bits, P.obfuscation)
        pub = self.kh.public
        setup = {"type": "setup", "version": PROTOCOL_VERSION, "pk": pub.to_message(),
                 "n_train": int(self.n), "n_test": int(len(self.X_test)),
                 "ids_train": ids_digest(self.ids_train), "ids_test": ids_digest(self.ids_test),
                 "bins": int(P.bins), "model": P.model}
        replies = yield {p: dict(setup) for p in self.passives}
        for p in self.passives:
            self._reply(replies, p, "setup_ok")

        F = None
        if P.model == "gbdt":
            prior = float(np.clip(self.y.mean(), 1e-6, 1 - 1e-6))
            self.base_score = math.log(prior / (1 - prior))
            F = np.full(self.n, self.base_score)
        for t in range(P.n_trees):
            t0 = time.perf_counter()
            tree, leaf_of = yield from self._build_tree(t, F)
            self.trees.append(tree)
            if F is not None:
                vals = {nd["nid"]: nd["value"] for nd in tree["nodes"] if nd["leaf"]}
                for nid, idx in leaf_of.items():
                    F[idx] += vals[nid]
            self.timings[f"tree_{t}"] = time.perf_counter() - t0

        with _Timer(self.timings, "predict"):
            yield from self._predict()
        replies = yield {p: {"type": "finish"} for p in self.passives}
        for p in self.passives:
            r = self._reply(replies, p, "done")
            self.passive_stats[p] = r.get("stats", {})

    # ---------------------------------------------------------------- reference data
    def _channels(self, F):
        P = self.params
        if P.model == "tree":
            L = self.n_classes
            chan = [[int(v) for v in (self.y == c)] for c in range(L)]
            return chan, [0] * L, [1] * L
        p = 1.0 / (1.0 + np.exp(-F))
        g = p - self.y
        h = p * (1.0 - p)
        gi = to_fixed(g, P.precision)
        hi_ = to_fixed(h, P.precision)
        one = 1 << P.precision
        return [gi, hi_], [-one, 0], [one, one >> 2]

    def _build_tree(self, t, F):
        P = self.params
        kh, pub = self.kh, self.kh.public
        with _Timer(self.timings, "quantise_pack"):
            chan, lo, hi = self._channels(F)
            layout = SlotLayout.for_channels(lo, hi, self.n)
            vals = np.array(chan, dtype=object).T if P.model == "gbdt" else np.array(chan).T
            layout.check_values(vals)                      # slot overflow impossible: asserted
            k = layout.values_per_ciphertext(pub.usable_bits) if P.compress else 1
            if P.packing:
                plain = layout.pack_rows(vals)
                units = 1
            else:
                plain = [int(v) for row in chan_rows(chan) for v in row]
                units = layout.n_channels
            stats = _PlainHist(chan, lo, hi)
        with _Timer(self.timings, "encrypt"):
            cts = kh.encrypt_many(plain, P.n_workers)
        with _Timer(self.timings, "serialize"):
            grad = {"layout": layout.to_message(), "packing": bool(P.packing),
                    "compress": int(k), "units": int(units), "cts": pub.serialize(cts)}
        del cts, plain
        self.layout_info = {"widths": list(layout.widths), "total_width": layout.total_width,
                            "values_per_ciphertext": int(k) if P.compress else 1,
                            "capacity_values": layout.values_per_ciphertext(pub.usable_bits),
                            "usable_bits": pub.usable_bits, "packing": bool(P.packing),
                            "compress": bool(P.compress)}

        nodes: dict = {}
        node_idx = {0: np.arange(self.n)}
        layer = [0]
        leaf_of = {}
        for depth in range(P.max_depth + 1):
            totals = {nid: stats.total(node_idx[nid]) for nid in layer}
            open_ = [nid for nid in layer
                     if depth < P.max_depth and totals[nid][0] >= 2 and self.crit.node_ok(totals[nid][1])]
            best = {}
            if open_:
                assign = np.full(self.n, -1, dtype=np.int32)
                for nid in layer:
                    assign[node_idx[nid]] = nid
                msg = {"type": "layer", "tree": int(t), "depth": int(depth), "assign": assign,
                       "open": [int(v) for v in open_]}
                if depth == 0:
                    msg["gradients"] = grad
                replies = yield {p: dict(msg) for p in self.passives}
                cands = self._passive_candidates(replies, open_, layout, k, node_idx, totals)
                with _Timer(self.timings, "split_search"):
                    for nid in open_:
                        b = self._best_split(nid, node_idx[nid], totals[nid], stats, cands)
                        if b is not None:
                            best[nid] = b
                masks = {}
                req = defaultdict(list)
                for nid, b in best.items():
                    if b["party"] != self.name:
                        req[b["party"]].append(b["split_id"])
                if req:
                    replies = yield {p: {"type": "split", "ids": ids} for p, ids in req.items()}
                    masks = self._partitions(replies, req, best, node_idx)
            next_layer = []
            for nid in layer:
                idx = node_idx[nid]
                cnt, tot = totals[nid]
                if nid in best:
                    b = best[nid]
                    if b["party"] == self.name:
                        go_left = self.bins[idx, b["feature"]] <= b["bin"]
                    else:
                        go_left = masks[nid]
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
    def _passive_candidates(self, replies, open_, layout, k, node_idx, totals):
        P = self.params
        pub = self.kh.public
        units = 1 if P.packing else layout.n_channels
        jobs = []          # (party, nid, ids, n_cts)
        all_cts = []
        with _Timer(self.timings, "deserialize"):
            for p in self.passives:
                r = self._reply(replies, p, "hist")
                nodes = require(r, "nodes", list)
                if sorted(require(nd, "nid", int) for nd in nodes) != sorted(open_):
                    raise ProtocolError(f"{p}: histogram reply does not cover the open nodes")
                for nd in nodes:
                    ids = require(nd, "ids", list)
                    for s in ids:
                        check_split_id(s)
                    if len(set(ids)) != len(ids):
                        raise ProtocolError(f"{p}: duplicate split ids")
                    nc = len(ids)
                    n_cts = math.ceil(nc / k) if P.compress else nc * units
                    try:
                        cts = pub.deserialize(require(nd, "cts", np.ndarray), n_cts)
                    except CiphertextError as e:
                        raise ProtocolError(f"{p}: {e}") from None
                    jobs.append((p, nd["nid"], ids, n_cts))
                    self.comm["hist_nodes"] += 1
                    all_cts.extend(cts)
        with _Timer(self.timings, "decrypt"):
            plain = self.kh.decrypt_many(all_cts, P.n_workers)
        out = defaultdict(list)
        with _Timer(self.timings, "unpack"):
            pos = 0
            for p, nid, ids, n_cts in jobs:
                ms = plain[pos:pos + n_cts]
                pos += n_cts
                vecs = []
                try:
                    if P.compress:
                        for j, m in enumerate(ms):
                            vecs.extend(layout.unpack(m, min(k, len(ids) - j * k)))
                    elif P.packing:
                        for m in ms:
                            vecs.extend(layout.unpack(m, 1))
                    else:
                        for j in range(len(ids)):
                            vecs.append([layout.channel_layout(c).unpack(ms[j * units + c], 1)[0][0]
                                         for c in range(units)])
                except SlotOverflowError as e:
                    raise ProtocolError(f"{p}: returned statistics do not decode: {e}") from None
                out[nid].append((p, ids, vecs))
        return out

    def _best_split(self, nid, idx, total, stats, cands):
        cnt, parent = total
        best_gain, best = None, None
        crit = self.crit
        # own features first (party order: active, then passives in order), feature, bin
        for f in range(self.bins.shape[1]):
            nb = len(self.edges[f]) + 1
            if nb < 2:
                continue
            bc, bv = stats.sums(idx, self.bins[idx, f], nb)
            for b, _nl, left in _cum_candidates(bc, bv):
                g = crit.gain(left, parent)
                if g is not None and (best_gain is None or g > best_gain):
                    best_gain, best = g, {"party": self.name, "feature": f, "bin": b}
        for p, ids, vecs in sorted(cands.get(nid, []), key=lambda x: self.passives.index(x[0])):
            for sid, left in zip(ids, vecs):
                try:
                    g = crit.gain(left, parent)
                except ValueError as e:
                    raise ProtocolError(f"{p}: split statistics inconsistent with the node: {e}") from None
                if g is not None and (best_gain is None or g > best_gain):
                    best_gain, best = g, {"party": p, "split_id": sid, "left": left}
        if best is None or not best_gain > 0:
            return None
        best["gain"] = best_gain
        return best

    def _partitions(self, replies, req, best, node_idx):
        by_id = {b["split_id"]: nid for nid, b in best.items() if "split_id" in b}
        masks = {}
        with _Timer(self.timings, "partition"):
            for p, ids in req.items():
                r = self._reply(replies, p, "partition")
                rids = require(r, "ids", list)
                sizes = int_list(r, "sizes", 0, self.n)
                left = int_array(r, "left", None, 0, 1)
                if rids != ids or len(sizes) != len(ids) or sum(sizes) != left.size:
                    raise ProtocolError(f"{p}: partition reply does not match the request")
                pos = 0
                for sid, sz in zip(ids, sizes):
                    nid = by_id[sid]
                    if sz != len(node_idx[nid]):
                        raise ProtocolError(f"{p}: partition of node {nid} has the wrong size")
                    m = left[pos:pos + sz].astype(bool)
                    pos += sz
                    nl = int(m.sum())
                    if nl == 0 or nl == sz:
                        raise ProtocolError(f"{p}: partition of node {nid} leaves a child empty")
                    if self.params.model == "tree" and nl != sum(best[nid]["left"]):
                        raise ProtocolError(f"{p}: partition of node {nid} contradicts its statistics")
                    masks[nid] = m
        return masks

    # ---------------------------------------------------------------- prediction
    def _predict(self):
        nt = len(self.X_test)
        ids = defaultdict(list)
        for tree in self.trees:
            for nd in tree["nodes"]:
                if not nd["leaf"] and nd["owner"] != self.name:
                    ids[nd["owner"]].append(nd["split_id"])
        decisions = {}
        if ids:
            replies = yield {p: {"type": "predict", "ids": v} for p, v in ids.items()}
            for p, v in ids.items():
                r = self._reply(replies, p, "predictions")
                if require(r, "ids", list) != v or require(r, "n_test", int) != nt:
                    raise ProtocolError(f"{p}: prediction reply does not match the request")
                bits = int_array(r, "bits", None, 0, 255).astype(np.uint8)
                per = (nt + 7) // 8
                if bits.size != per * len(v):
                    raise ProtocolError(f"{p}: prediction bits have the wrong size")
                for j, sid in enumerate(v):
                    decisions[sid] = np.unpackbits(bits[j * per:(j + 1) * per])[:nt].astype(bool)
        leaves = [route(tree, self.X_test, decisions, self.name) for tree in self.trees]
        self._finish_predictions(leaves)

    def _finish_predictions(self, leaves):
        if self.params.model == "gbdt":
            F = np.full(len(self.X_test), self.base_score)
            for tree, leaf in zip(self.trees, leaves):
                vals = {nd["nid"]: nd["value"] for nd in tree["nodes"] if nd["leaf"]}
                F += np.array([vals[int(v)] for v in leaf]) if len(leaf) else 0.0
            self.test_score = 1.0 / (1.0 + np.exp(-F))
            self.test_pred = (F > 0).astype(np.int64)
        else:
            tree = self.trees[0]
            counts = {nd["nid"]: nd["value"] for nd in tree["nodes"] if nd["leaf"]}
            prob = np.zeros((len(self.X_test), self.n_classes))
            for i, nid in enumerate(leaves[0]):
                c = np.asarray(counts[int(nid)], dtype=np.float64)
                prob[i] = c / c.sum()
            self.test_score = prob
            self.test_pred = np.array([int(np.argmax(counts[int(nid)])) for nid in leaves[0]],
                                      dtype=np.int64)

    # ---------------------------------------------------------------- outputs
    def model(self) -> dict:
        return {"format": "treeflare.vertical.active/1", "party": self.name, "model": self.params.model,
                "params": self.params.to_dict(), "n_classes": self.n_classes,
                "base_score": self.base_score, "features": self.feature_names,
                "passives": self.passives, "trees": self.trees}

    def ops(self) -> dict:
        ops = Counter(self.kh.ops) if self.kh is not None else Counter()
        for st in self.passive_stats.values():
            for k_, v in (st.get("ops") or {}).items():
                ops[k_] += int(v)
        return dict(ops)


def chan_rows(chan):
    return zip(*chan)


def route(tree, X, decisions, me) -> np.ndarray:
    """Leaf id of every row; own splits evaluated here, passive ones from `decisions`."""
    nodes = {nd["nid"]: nd for nd in tree["nodes"]}
    cur = np.zeros(len(X), dtype=np.int64)
    for nid in sorted(nodes):
        nd = nodes[nid]
        if nd["leaf"]:
            continue
        m = cur == nid
        if not m.any():
            continue
        if nd["owner"] == me:
            with np.errstate(invalid="ignore"):
                go = X[:, nd["feature_index"]] <= nd["threshold"]
        else:
            go = decisions[nd["split_id"]]
        cur[m] = np.where(go[m], nd["left"], nd["right"])
    return cur


# ======================================================================================
# passive party
# ======================================================================================
class PassiveParty:
    def __init__(self, name: str, X_train, X_test, feature_names, ids_train=None, ids_test=None,
                 workers: int = 1, min_key_bits: int = 2048, allow_mock: bool = False):
        self.name = name
        self.X_train = np.asarray(X_train, dtype=np.float64)
        self.X_test = np.asarray(X_test, dtype=np.float64)
        self.n = self.X_train.shape[0]
        self.feature_names = list(feature_names)
        self.ids_train = list(ids_train) if ids_train is not None else list(range(self.n))
        self.ids_test = list(ids_test) if ids_test is not None else list(range(len(self.X_test)))
        self.workers = max(1, int(workers or 1))
        self.min_key_bits = int(min_key_bits)
        self.allow_mock = bool(allow_mock)
        self.pub = None
        self.edges = None
        self.bins = None
        self.splits: dict = {}        # split id -> {feature, feature_index, bin, threshold}
        self._pending: dict = {}      # ids offered in the current layer
        self._grad = None
        self._cache: dict = {}
        self._assign = None
        self.timings = defaultdict(float)
        self.ops = Counter()

    def handle(self, msg: dict) -> dict:
        kind = require(msg, "type", str)
        fn = {"setup": self._setup, "layer": self._layer, "split": self._split,
              "predict": self._predict, "finish": self._finish}.get(kind)
        if fn is None:
            raise ProtocolError(f"unknown message type {kind!r}")
        if kind != "setup" and self.pub is None:
            raise ProtocolError("protocol not set up")
        return fn(msg)

    # ----------------------------------------------------------------
    def _setup(self, msg):
        if require(msg, "version", int) != PROTOCOL_VERSION:
            raise ProtocolError("protocol version mismatch")
        pk = require(msg, "pk", dict)
        try:
            pub = public_from_message(pk)
        except (CiphertextError, ValueError) as e:
            raise ProtocolError(f"bad public key: {e}") from None
        if pub.scheme == "mock" and not self.allow_mock:
            raise ProtocolError("refusing the mock (plaintext) scheme: real encryption required")
        if pub.key_bits < self.min_key_bits:
            raise ProtocolError(f"key of {pub.key_bits} bits is below this site's minimum "
                                f"{self.min_key_bits}")
        if require(msg, "n_train", int) != self.n or require(msg, "n_test", int) != len(self.X_test):
            raise ProtocolError("row counts differ from the active party's")
        if require(msg, "ids_train", str) != ids_digest(self.ids_train) or \
                require(msg, "ids_test", str) != ids_digest(self.ids_test):
            raise ProtocolError("sample ids are not aligned with the active party's")
        bins = require(msg, "bins", int)
        if not 2 <= bins <= 1024:
            raise ProtocolError("bins out of range")
        self.pub = pub
        t = time.perf_counter()
        self.edges = fit_bins(self.X_train, bins)
        self.bins = apply_bins(self.X_train, self.edges)
        self.timings["binning"] += time.perf_counter() - t
        return {"type": "setup_ok", "n_features": len(self.feature_names)}

    def _load_gradients(self, g):
        if not isinstance(g, dict):
            raise ProtocolError("gradients must be a dict")
        try:
            layout = SlotLayout.from_message(require(g, "layout", dict))
        except (ValueError, SlotOverflowError) as e:
            raise ProtocolError(f"bad slot layout: {e}") from None
        if layout.n_max < self.n:
            raise ProtocolError("slot layout too small for the number of rows")
        packing = require(g, "packing", bool)
        k = require(g, "compress", int)
        units = require(g, "units", int)
        if units != (1 if packing else layout.n_channels):
            raise ProtocolError("unit count inconsistent with packing")
        if k < 1 or k * layout.total_width > self.pub.usable_bits:
            raise ProtocolError("compression factor exceeds the plaintext capacity")
        t = time.perf_counter()
        try:
            flat = self.pub.deserialize(require(g, "cts", np.ndarray), self.n * units)
        except CiphertextError as e:
            raise ProtocolError(str(e)) from None
        self.timings["deserialize"] += time.perf_counter() - t
        C = [flat[u::units] for u in range(units)]
        widths = [layout.total_width] if packing else list(layout.widths)
        self._grad = {"C": C, "k": k, "units": units, "widths": widths}
        self._cache = {}

    def _layer(self, msg):
        if "gradients" in msg:
            self._load_gradients(msg["gradients"])
        if self._grad is None:
            raise ProtocolError("layer request before any gradients")
        assign = int_array(msg, "assign", self.n, -1, 2**31 - 1)
        open_ = int_list(msg, "open", 0, 2**31 - 1)
        if len(set(open_)) != len(open_) or not open_:
            raise ProtocolError("open node list empty or duplicated")
        G = self._grad
        units = G["units"]
        pub = self.pub
        idx_of = {}

        def idx(nid):
            if nid not in idx_of:
                idx_of[nid] = np.flatnonzero(assign == nid)
            return idx_of[nid]

        for nid in open_:
            if idx(nid).size < 2:
                raise ProtocolError(f"open node {nid} has fewer than 2 rows")
        direct = {}
        hists = {}
        t = time.perf_counter()
        for nid in open_:
            hists[nid] = self._node_hist(nid, idx, direct)
        self.timings["histogram"] += time.perf_counter() - t

        self._pending = {}
        out = []
        t = time.perf_counter()
        for nid in open_:
            ii = idx(nid)
            h = hists[nid]
            entries = []
            ids = []
            for f in range(self.bins.shape[1]):
                nb = len(self.edges[f]) + 1
                if nb < 2:
                    continue
                cnt = np.bincount(self.bins[ii, f], minlength=nb)
                n_all = int(cnt.sum())
                left = [pub.one()] * units
                nl = 0
                for b in range(nb - 1):
                    nl += int(cnt[b])
                    if cnt[b]:
                        left = [pub.add(a, c) for a, c in zip(left, h[f][b])]
                        self.ops["additions"] += units
                    if cnt[b] > 0 and 0 < nl < n_all:
                        sid = secrets.token_hex(8)
                        self._pending[sid] = (nid, f, b)
                        ids.append(sid)
                        entries.append(list(left))
            cts = self._compress(entries)
            out.append({"nid": int(nid), "ids": ids, "cts": pub.serialize(cts)})
        self.timings["cumulate_compress"] += time.perf_counter() - t
        self._cache = hists
        self._assign = assign
        self._idx = idx_of
        return {"type": "hist", "nodes": out}

    def _node_hist(self, nid, idx, direct):
        """Encrypted per-feature per-bin sums: hist[f][b] = [unit cts]."""
        par = (nid - 1) // 2
        if nid > 0 and par in self._cache:
            sib = nid + 1 if nid % 2 == 1 else nid - 1
            ns, nn = idx(sib).size, idx(nid).size
            if ns < nn or (ns == nn and sib < nid):
                if sib not in direct:
                    direct[sib] = self._direct(idx(sib))
                ph, sh = self._cache[par], direct[sib]
                out = [[[self.pub.sub(a, b) for a, b in zip(pu, su)] for pu, su in zip(pf, sf)]
                       for pf, sf in zip(ph, sh)]
                n_ops = sum(len(b) for f in out for b in f)
                self.ops["additions"] += n_ops
                self.ops["subtractions"] += n_ops
                return out
        if nid not in direct:
            direct[nid] = self._direct(idx(nid))
        return direct[nid]

    def _direct(self, ii):
        G = self._grad
        res, n_add = histo.node_histograms(self.pub, G["C"], self.bins, ii,
                                           [len(e) + 1 for e in self.edges], self.workers)
        self.ops["additions"] += n_add
        return res

    def _compress(self, entries):
        """entries: per candidate a list of unit ciphertexts -> ciphertexts to return."""
        G = self._grad
        pub = self.pub
        widths, k = G["widths"], G["k"]
        if k <= 1:
            return [c for e in entries for c in e]
        out = []
        for s in range(0, len(entries), k):
            group = entries[s:s + k]
            flat = [(c, widths[u]) for e in group for u, c in enumerate(e)]
            acc = flat[-1][0]
            for c, w in reversed(flat[:-1]):
                acc = pub.add(pub.shift(acc, w), c)
            self.ops["shifts"] += len(flat) - 1
            self.ops["additions"] += len(flat) - 1
            out.append(acc)
        return out

    def _split(self, msg):
        ids = require(msg, "ids", list)
        if not ids or len(set(ids)) != len(ids):
            raise ProtocolError("split request empty or duplicated")
        sizes, parts = [], []
        t = time.perf_counter()
        for sid in ids:
            check_split_id(sid)
            if sid not in self._pending:
                raise ProtocolError(f"unknown split id {sid!r}")
            nid, f, b = self._pending[sid]
            ii = self._idx[nid]
            m = (self.bins[ii, f] <= b).astype(np.uint8)
            sizes.append(int(ii.size))
            parts.append(m)
            self.splits[sid] = {"feature": self.feature_names[f], "feature_index": int(f),
                                "bin": int(b), "threshold": float(self.edges[f][b])}
        self.timings["partition"] += time.perf_counter() - t
        return {"type": "partition", "ids": list(ids), "sizes": sizes,
                "left": np.concatenate(parts) if parts else np.zeros(0, np.uint8)}

    def _predict(self, msg):
        ids = require(msg, "ids", list)
        t = time.perf_counter()
        rows = []
        for sid in ids:
            check_split_id(sid)
            if sid not in self.splits:
                raise ProtocolError(f"unknown split id {sid!r}")
            s = self.splits[sid]
            with np.errstate(invalid="ignore"):
                go = self.X_test[:, s["feature_index"]] <= s["threshold"]
            rows.append(np.packbits(go.astype(np.uint8)))
        self.timings["predict"] += time.perf_counter() - t
        return {"type": "predictions", "ids": list(ids), "n_test": int(len(self.X_test)),
                "bits": np.concatenate(rows) if rows else np.zeros(0, np.uint8)}

    def _finish(self, msg):
        self._grad = None
        self._cache = {}
        return {"type": "done", "stats": {"ops": {k: int(v) for k, v in self.ops.items()},
                                          "timings_s": {k: float(v) for k, v in self.timings.items()}}}

    def model(self) -> dict:
        return {"format": "treeflare.vertical.passive/1", "party": self.name,
                "features": self.feature_names, "splits": self.splits}
