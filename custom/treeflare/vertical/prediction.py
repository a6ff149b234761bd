"""Prediction-only runs of a trained vertical model: each party loads only its own part of the model.

* The active party (:class:`ActivePredictor`) holds the tree structure, leaf values, its own splits and which
  party owns each other split (by opaque id): its ``vertical_active_model.json``.
* A passive party (:class:`PassivePredictor`) holds the thresholds of its own splits: its
  ``vertical_passive_model.json``.  They never leave it; it answers one bit per row per split reached.

New rows are joined on the id column: every party holds the same ids (in any row order), each sorts its rows by
id, and the protocol numbers rows by their place in that order.  At setup the active party sends the number of
rows; a party with another count refuses (naming both counts, not the ids).  No digest of the ids is sent (the
server could confirm a guessed id list with it, and there is no Paillier key here to hide one under).  Instead
the active party sends each passive party a fresh nonce and :func:`.messages.ids_mac` of its sorted ids: an
HMAC under the *link* key that passive party chose in training and sent to the active party only under its
Paillier key (both model parts keep it).  The server never saw the link, so it learns nothing from the MAC, not
even whether two runs scored the same rows; the passive party recomputes it over its own ids and refuses on a
difference (same rows, same order, or no answer).  A model part from before links (no ``link``) is checked by
counts only; they suffice after the PSI phase every prediction run starts with (``treeflare.flare.psi``): each
party keeps exactly the intersection of the new rows' ids and the phase checks every party kept the same number,
and equal sets sorted by id are the same rows in the same order (see SECURITY.md).  The active party also
sends, to each passive party, a digest of the split ids it expects that party to hold (random tokens, no row
ids), so a model part from another training run is refused before any row is asked about.  Then the rows go
through the trees by the very code training uses for its test rows (:mod:`.inference`), and the passive party
checks every request the same way.
No key is needed: the answers are bits, which the server sees in training too (SECURITY.md).

Messages: ``predict_setup`` -> ``predict_ok``; ``predict`` -> ``predictions`` (as in training); ``finish`` -> ``done``.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import Counter

import numpy as np

from .inference import PredictionAnswers, leaf_outputs, route_layers
from .messages import (ACTIVE_FORMAT, PASSIVE_FORMAT, PROTOCOL_VERSION, Exchanges, ProtocolError, check_split_id,
                       count_traffic, expect_reply, ids_digest, ids_mac, is_link, new_nonce, require, same_mac)
from .objectives import OBJECTIVES, make_objective
from .passive import PassivePolicy



class ModelPartError(ValueError):
    """A model part that is not what this party trained (wrong file, damaged, another party's)."""


def model_id(model: dict) -> str:
    """A short fingerprint of a model part (the report names the model a prediction used)."""
    return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:16]


def _split_ids_digest(ids) -> str:
    return ids_digest(sorted(ids))


def _sorted_rows(X, ids, who: str):
    """(X, ids) sorted by id, and the order that did it; duplicate or missing ids are refused."""
    ids = np.asarray([str(v) for v in ids], dtype=object)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] != ids.size:
        raise ValueError(f"{who}: {X.shape[0] if X.ndim == 2 else '?'} rows of features for {ids.size} ids")
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    if s.size and (np.any(s[1:] == s[:-1]) or any(not v for v in s)):
        raise ValueError(f"{who}: row ids must be distinct and non-empty")
    return X[order], list(s), order


# What the parties and the executor write in a model part; any other field is a damaged or padded file.
ACTIVE_KEYS = ("format", "party", "model", "objective", "params", "n_classes", "base_score", "features", "passives",
               "links", "trees", "schema")
PASSIVE_KEYS = ("format", "party", "features", "splits", "link", "schema")


def _check_keys(model: dict, known, bad) -> None:
    unknown = [k for k in model if k not in known]
    if unknown:
        raise bad(f"unknown field {str(unknown[0])[:80]!r} (a part holds only {', '.join(known)})")


# ------------------------------------------------------------------------------------------------ active
def check_active_model(model: dict, party: str | None = None) -> dict:
    """The active party's model part, checked: a readable tree for every node it routes through."""
    def bad(why):
        return ModelPartError(f"active model part: {why}")

    if not isinstance(model, dict) or model.get("format") != ACTIVE_FORMAT:
        raise bad(f"format is not {ACTIVE_FORMAT!r} (is this the active site's vertical_active_model.json?)")
    _check_keys(model, ACTIVE_KEYS, bad)
    me = model.get("party")
    if party is not None and me != party:
        raise bad(f"it belongs to {me!r}, not to {party!r}")
    passives = model.get("passives")
    feats = model.get("features")
    if not isinstance(passives, list) or not passives or not all(isinstance(p, str) for p in passives):
        raise bad("'passives' must list the passive sites")
    if not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
        raise bad("'features' must list this party's columns")
    links = model.get("links", {})     # absent in parts trained before link keys
    if not isinstance(links, dict) or not set(links) <= set(passives) or not all(map(is_link, links.values())):
        raise bad("'links' must map passive sites to link keys (64 hex digits)")
    kind, obj = model.get("model"), model.get("objective")
    if kind not in ("tree", "gbdt") or (kind == "gbdt" and obj not in OBJECTIVES):
        raise bad(f"unknown model {kind!r} / objective {obj!r}")
    n_out = 1 if kind == "tree" or obj != "softmax" else model.get("n_classes")
    trees = model.get("trees")
    if not isinstance(trees, list) or not trees or (kind == "tree" and len(trees) != 1):
        raise bad("no trees")
    for t, tree in enumerate(trees):
        nodes = tree.get("nodes") if isinstance(tree, dict) else None
        if not isinstance(nodes, list) or not nodes:
            raise bad(f"tree {t} has no nodes")
        by_id = {nd.get("nid"): nd for nd in nodes if isinstance(nd, dict)}
        for nd in nodes:
            nid = nd.get("nid") if isinstance(nd, dict) else None
            if not isinstance(nid, int) or not isinstance(nd.get("depth"), int) or (nid + 1).bit_length() - 1 != \
                    nd["depth"]:
                raise bad(f"tree {t}: a node with a bad id or depth")
            if nd.get("leaf") is True:
                v = np.asarray(nd.get("value"), dtype=np.float64)
                want = (model.get("n_classes"),) if kind == "tree" else (() if n_out == 1 else (n_out,))
                if v.shape != want and not (kind == "gbdt" and n_out == 1 and v.shape == (1,)):
                    raise bad(f"tree {t} node {nid}: leaf value of shape {v.shape}")
                continue
            if nd.get("left") != 2 * nid + 1 or nd.get("right") != 2 * nid + 2 or \
                    not {2 * nid + 1, 2 * nid + 2} <= set(by_id):
                raise bad(f"tree {t} node {nid}: children missing")
            owner = nd.get("owner")
            if owner == me:
                fi = nd.get("feature_index")
                if not isinstance(fi, int) or not 0 <= fi < len(feats) or not isinstance(nd.get("threshold"),
                                                                                         (int, float)):
                    raise bad(f"tree {t} node {nid}: own split without a feature index or threshold")
            elif owner in passives:
                try:
                    check_split_id(nd.get("split_id"))
                except ProtocolError:
                    raise bad(f"tree {t} node {nid}: passive split without a valid split id") from None
            else:
                raise bad(f"tree {t} node {nid}: split owned by unknown party {owner!r}")
        if 0 not in by_id:
            raise bad(f"tree {t} has no root")
    return model


class ActivePredictor:
    """The active party of a prediction run: ``step(inbox) -> outbox`` as :class:`.ActiveParty` (``None`` when
    finished); then ``pred``/``score`` hold the predictions in the order of the rows given."""

    def __init__(self, name: str, model: dict, X, ids):
        self.model = check_active_model(model, name)
        self.name = name
        self.passives = list(model["passives"])
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(model["features"]):
            raise ValueError(f"{name}: new rows have {X.shape[-1]} columns, the model part {len(model['features'])}")
        self.row_ids = [str(v) for v in ids]              # as given: the order of pred/score
        self.X, self.ids, self._order = _sorted_rows(X, ids, name)
        self.n = len(self.ids)
        self.trees = model["trees"]
        self.n_classes = int(model.get("n_classes") or 0)
        self.objective = make_objective(model["objective"], self.n_classes) if model["model"] == "gbdt" else None
        self.base_score = model.get("base_score", 0.0)
        self.pred = self.score = None
        self.comm = Counter()
        self.timings: dict = {}
        self._exchanges = Exchanges(self._protocol)
        self._t0 = None

    def step(self, inbox):
        count_traffic(self.comm, (inbox or {}).values(), "active")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        out = self._exchanges.send(inbox)
        if out is None:
            self.timings["predict"] = time.perf_counter() - self._t0
            return None
        count_traffic(self.comm, out.values(), "passive")
        return out

    def _protocol(self):
        owned = {p: [] for p in self.passives}
        for tree in self.trees:
            for nd in tree["nodes"]:
                if not nd.get("leaf") and nd["owner"] != self.name:
                    owned[nd["owner"]].append(nd["split_id"])
        setup = {"type": "predict_setup", "version": PROTOCOL_VERSION, "n_rows": int(self.n)}
        links = self.model.get("links", {})
        out = {}
        for p in self.passives:
            out[p] = {**setup, "model": _split_ids_digest(owned[p])}
            if p in links:
                nonce = new_nonce()
                out[p].update(nonce=nonce, ids=ids_mac(links[p], nonce, self.ids))
        replies = yield out
        for p in self.passives:
            expect_reply(replies, p, "predict_ok")
        leaves = yield from route_layers(self.trees, self.X, self.name)
        pred, score = leaf_outputs(self.trees, leaves, self.objective, self.base_score, self.n_classes)
        back = np.empty_like(self._order)
        back[self._order] = np.arange(self.n)               # sorted position of each row as given
        self.pred, self.score = np.asarray(pred)[back], np.asarray(score)[back]
        replies = yield {p: {"type": "finish"} for p in self.passives}
        for p in self.passives:
            expect_reply(replies, p, "done")

    def close(self) -> None:
        """Nothing to stop (no key, no worker processes); for the executor's uniform cleanup."""


# ----------------------------------------------------------------------------------------------- passive
def check_passive_model(model: dict, party: str | None = None) -> dict:
    """A passive party's model part, checked: every split names one of its columns and a threshold."""
    def bad(why):
        return ModelPartError(f"passive model part: {why}")

    if not isinstance(model, dict) or model.get("format") != PASSIVE_FORMAT:
        raise bad(f"format is not {PASSIVE_FORMAT!r} (is this a passive site's vertical_passive_model.json?)")
    _check_keys(model, PASSIVE_KEYS, bad)
    if party is not None and model.get("party") != party:
        raise bad(f"it belongs to {model.get('party')!r}, not to {party!r}")
    feats, splits = model.get("features"), model.get("splits")
    if not isinstance(feats, list) or not isinstance(splits, dict):
        raise bad("'features' and 'splits' missing")
    if "link" in model and not is_link(model["link"]):
        raise bad("'link' must be a link key (64 hex digits)")
    for sid, s in splits.items():
        try:
            check_split_id(sid)
        except ProtocolError:
            raise bad("a malformed split id") from None
        if not isinstance(s, dict) or not isinstance(s.get("feature_index"), int) or \
                not 0 <= s["feature_index"] < len(feats) or not isinstance(s.get("threshold"), (int, float)) or \
                not all(isinstance(s.get(k), int) and s[k] >= 0 for k in ("tree", "node", "depth")):
            raise bad(f"split {sid}: feature index, threshold, tree, node or depth missing or out of range")
    return model


class PassivePredictor:
    """A passive party of a prediction run: ``handle(msg) -> reply``.  Its thresholds stay here."""

    def __init__(self, name: str, model: dict, X, ids, policy: PassivePolicy | None = None):
        self.model = check_passive_model(model, name)
        self.name = name
        self.policy = policy or PassivePolicy()
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(model["features"]):
            raise ValueError(f"{name}: new rows have {X.shape[-1]} columns, the model part {len(model['features'])}")
        self.X, self.ids, _ = _sorted_rows(X, ids, name)
        self.n = len(self.ids)
        self.splits = model["splits"]
        self._answers: PredictionAnswers | None = None
        self._finished = False

    def handle(self, msg: dict) -> dict:
        kind = require(msg, "type", str)
        if self._finished:
            raise ProtocolError("the prediction run has finished")
        if kind == "predict_setup":
            return self._setup(msg)
        if self._answers is None:
            raise ProtocolError(f"{kind!r} before the prediction run was set up")
        if kind == "predict":
            return self._answers.answer(msg)
        if kind == "finish":
            self._finished = True
            return {"type": "done"}
        raise ProtocolError(f"unknown message type {kind!r} in a prediction run")

    def _setup(self, msg):
        if self._answers is not None:
            raise ProtocolError("prediction run already set up")
        if require(msg, "version", int) != PROTOCOL_VERSION:
            raise ProtocolError("protocol version mismatch")
        if self.n > self.policy.max_predict_rows:
            raise ProtocolError(f"{self.n} new rows here; this site answers prediction requests about at most "
                                f"{self.policy.max_predict_rows} rows per run")
        n_active = require(msg, "n_rows", int)
        if n_active != self.n:
            raise ProtocolError(f"{self.name}: {self.n} new rows here, {n_active} at the active party: every party "
                                "must hold the same ids (the rows the PSI phase kept)")
        if require(msg, "model", str) != _split_ids_digest(self.splits):
            raise ProtocolError("the active party's model does not match this party's model part "
                                "(parts of different training runs?)")
        link = self.model.get("link")
        if link is not None:
            if "ids" not in msg:
                raise ProtocolError(f"{self.name}: the active party sent no check of the new rows' ids, though "
                                    "this party's model part has a link key")
            if not same_mac(require(msg, "ids", str), ids_mac(link, require(msg, "nonce", str), self.ids)):
                raise ProtocolError(f"{self.name}: the new rows' ids differ from the active party's ({self.n} rows "
                                    "on both sides): every party must hold the same ids (the rows the PSI phase kept)")
        self._answers = PredictionAnswers(self.splits, self.X)
        return {"type": "predict_ok"}

    def close(self) -> None:
        """Nothing to stop; for the executor's uniform cleanup."""


# ---------------------------------------------------------------------------------------------- outputs
def predictions_frame(ids, id_column: str, pred, score, model: dict, classes):
    """The predictions as ``treeflare predict`` writes them: the id column, ``predicted`` (the class, or the
    value of a regression) and ``p_<class>`` per class."""
    import pandas as pd

    from ..prediction import PREDICTED

    out = pd.DataFrame({id_column: list(ids)})
    if model.get("objective") == "squared_error" and model.get("model") == "gbdt":
        out[PREDICTED] = np.asarray(pred, dtype=np.float64)
        return out
    classes = [str(c) for c in classes]
    score = np.asarray(score, dtype=np.float64)
    if score.ndim == 1:                                       # binary: the probability of the second class
        score = np.column_stack([1.0 - score, score])
    if score.shape[1] != len(classes):
        raise ModelPartError(f"the model predicts {score.shape[1]} classes, its schema lists {len(classes)}")
    names = [f"p_{c}" for c in classes]
    if id_column in (PREDICTED, *names):
        raise ModelPartError(f"the id column {id_column!r} clashes with an output column")
    out[PREDICTED] = np.asarray(classes, dtype=object)[np.asarray(pred, dtype=np.int64)]
    for j, name in enumerate(names):
        out[name] = score[:, j]
    return out


def run_prediction(active: ActivePredictor, passives: dict, record: list | None = None) -> ActivePredictor:
    """In process: route the messages of a prediction run (as the FLARE controller does between sites)."""
    from .driver import run_protocol

    return run_protocol(active, passives, record)
