"""A malicious active party against the passive party's checks (each rule it enforces on the active party's
requests): one test per check.

Each test runs the honest protocol up to some point, then hands the passive party a request an honest
active party would never send, and expects a ProtocolError that names the broken rule."""
from __future__ import annotations

import numpy as np
import pytest

from treeflare.vertical import (PassivePolicy, ProtocolError, VerticalData, VerticalParams, close_parties,
                                make_parties)

BITS = 512


def _data(owner="passive", n=300, n_test=60, seed=0) -> VerticalData:
    """Labels driven by the passive's two columns (owner='passive': the passive makes the root split and
    those below it) or by the active's column (owner='active')."""
    rng = np.random.default_rng(seed)
    m = n + n_test
    Xa, Xp = rng.normal(size=(m, 2)), rng.normal(size=(m, 2))
    if owner == "passive":
        y = ((Xp[:, 0] > 0) ^ (Xp[:, 1] > 0.5)).astype(np.int64)
    else:
        y = (Xa[:, 0] + 0.1 * Xp[:, 0] > 0).astype(np.int64)
    tr, te = slice(0, n), slice(n, m)
    return VerticalData(X_active=Xa[tr], y=y[tr], X_passive=[Xp[tr]], X_active_test=Xa[te], y_test=y[te],
                        X_passive_test=[Xp[te]], names_active=["a0", "a1"], names_passive=[["p0", "p1"]],
                        n_classes=2, ids_train=list(range(n)), ids_test=list(range(n, m)))


class Run:
    """The protocol, one passive party, stepped by hand."""

    def __init__(self, owner="passive", min_rows=10, max_depth=3, policy=None, **kw):
        self.P = VerticalParams(model="tree", key_bits=BITS, allow_insecure_key=True, workers=1, bins=8,
                                max_depth=max_depth, min_rows_node=min_rows, obfuscation="djn", **kw)
        self.a, ps = make_parties(_data(owner), self.P, policy=policy)
        (self.name, self.p), = ps.items()
        self.out = self.a.step(None)

    def msg(self):
        return self.out[self.name]

    def step(self, msg=None):
        r = self.p.handle(self.msg() if msg is None else msg)
        self.out = self.a.step({self.name: r})
        return r

    def until(self, kind, depth=None):
        """Answer honestly until the next message to the passive is of this kind (and depth)."""
        while True:
            m = self.msg()
            if m["type"] == kind and (depth is None or m.get("depth") == depth):
                return dict(m)
            self.step()

    def close(self):
        close_parties(self.a, {self.name: self.p})


@pytest.fixture
def run():
    r = Run()
    yield r
    r.close()


def _reject(p, msg, match):
    with pytest.raises(ProtocolError, match=match):
        p.handle(msg)


def test_node_ids_must_match_depth(run):
    m = run.until("layer", 1)
    bad = m["assign"].copy()
    bad[bad == 1] = 3                                      # a depth-2 id at depth 1
    _reject(run.p, {**m, "assign": bad, "open": [3, 2]}, "inconsistent with depth 1")


def test_children_must_follow_this_partys_split(run):
    m = run.until("layer", 1)
    assert run.a.trees == [] and run.p.splits               # the passive made the root split
    bad = m["assign"].copy()
    i = int(np.flatnonzero(bad == 1)[0])
    bad[i] = 2                                             # one row crosses to the other child
    _reject(run.p, {**m, "assign": bad}, "differ from the partition this party returned")


def test_rows_must_stay_below_their_node(run):
    m = run.until("layer", 2)
    bad = m["assign"].copy()
    i = int(np.flatnonzero((bad == 3) | (bad == 4))[0])
    bad[i] = 5                                             # node 5 is a child of node 2, the row came from node 1
    _reject(run.p, {**m, "assign": bad}, "not a child of its node")


def test_rows_of_a_closed_node_stay_out():
    r = Run()
    try:
        m = r.until("layer", 1)
        r.p.handle({**m, "open": [1]})                     # node 2 closed at depth 1
        bad = m["assign"].copy()
        bad[bad == 2] = 5
        bad[bad == 1] = 3
        bad[np.flatnonzero(m["assign"] == 1)[:5]] = 4
        _reject(r.p, {**m, "depth": 2, "assign": bad, "open": [3, 4, 5]}, "outside the previous layer's open nodes")
    finally:
        r.close()


def test_a_node_is_split_whole_or_closed_whole(run):
    m = run.until("layer", 2)
    prev = run.p._prev_assign
    bad = m["assign"].copy()
    rows1 = np.flatnonzero(prev == 1)
    bad[rows1[:3]] = -1                                    # part of node 1 leaves, the rest goes to its children
    _reject(run.p, {**m, "assign": bad}, "some rows left the tree")
    bad = m["assign"].copy()
    bad[rows1] = 3                                         # node 1 "split" with an empty right child
    _reject(run.p, {**m, "assign": bad}, "empty child")


def test_at_most_two_to_the_depth_open_nodes(run):
    m = run.until("layer", 1)
    _reject(run.p, {**m, "open": [1, 2, 3]}, "more than 2\\^1")


def test_layers_capped_at_the_agreed_depth():
    r = Run(max_depth=2)
    try:
        m = r.until("layer", 1)
        r.step()
        assign = np.where(m["assign"] == 1, 3, 5).astype(np.int32)
        _reject(r.p, {**m, "depth": 2, "assign": assign, "open": [3, 5]}, "beyond the maximum depth 2")
    finally:
        r.close()


def test_trees_capped_at_the_agreed_count(run):
    m0 = run.until("layer", 0)
    g = m0["gradients"]
    run.until("predict")
    _reject(run.p, {**m0, "tree": 1, "gradients": g}, "beyond the 1 trees agreed")


def test_layers_come_in_order(run):
    m0 = run.until("layer", 0)
    run.step()
    m1 = run.until("layer", 1)
    _reject(run.p, {**m1, "depth": 2}, "out of order")                       # depth skipped
    _reject(run.p, {**m0, "tree": 0}, "gradients must start a new tree")  # gradients again, same tree
    no_grad = {k: v for k, v in m0.items() if k != "gradients"}
    _reject(run.p, {**no_grad, "tree": 1}, "out of order")                   # a new tree without gradients


def test_no_answer_below_the_agreed_rows_per_node():
    r = Run(owner="active")
    try:
        m = r.until("layer", 1)
        assert not r.p.splits                               # the active party made the root split
        bad = m["assign"].copy()
        ones = np.flatnonzero(bad == 1)
        bad[ones[3:]] = 2                                   # node 1 keeps 3 rows (still inside the root)
        _reject(r.p, {**m, "assign": bad, "open": [1, 2]}, "fewer than the 10 agreed at setup: no answer")
    finally:
        r.close()


def test_setup_below_the_sites_floor_refused():
    r = Run(min_rows=4, policy=PassivePolicy(min_key_bits=BITS, min_rows_node=10))
    try:
        _reject(r.p, r.msg(), "requires at least 10")
    finally:
        r.close()
    r = Run(policy=PassivePolicy(min_key_bits=BITS, max_depth=2))
    try:
        _reject(r.p, r.msg(), "allows at most 2")
    finally:
        r.close()


def test_split_requests_checked(run):
    run.until("layer", 1)
    first = run.p._pending
    m = run.until("layer", 1)
    r = run.p.handle(m)
    ids_by_node = {}
    for sid, (nid, _f, _b) in run.p._pending.items():
        ids_by_node.setdefault(nid, []).append(sid)
    _reject(run.p, {"type": "split", "ids": [[ids_by_node[1][0], ids_by_node[2][0]]]}, "different nodes")
    _reject(run.p, {"type": "split", "ids": [next(iter(first))]}, "unknown split id")      # an old layer's id
    run.p.handle({"type": "split", "ids": [ids_by_node[1][0]]})
    _reject(run.p, {"type": "split", "ids": [ids_by_node[2][0]]}, "one split request per layer")
    assert r["type"] == "hist"


def test_prediction_requests_checked():
    r = Run()
    try:
        r.until("layer", 1)
        root = next(iter(r.p.splits))
        allrows = np.arange(r.p.n_test, dtype=np.int32)
        pm = r.until("predict", 0)
        assert [e["id"] for e in pm["nodes"]] == [root]
        _reject(r.p, {**pm, "nodes": [{"id": root, "rows": allrows[:-1]}]}, "every row reaches the root")
        r.step()                                            # honest root answer
        _reject(r.p, pm, "already asked")
        pm1 = r.until("predict", 1)
        e = pm1["nodes"][0]
        s = r.p.splits[e["id"]]
        other = np.setdiff1d(allrows, e["rows"]).astype(np.int32)
        _reject(r.p, {**pm1, "nodes": [{"id": e["id"], "rows": other}]}, "rows differ from those this party sent down")
        _reject(r.p, {**pm1, "depth": 2}, "not at depth 2")
        assert len(pm1["nodes"]) == 2  # both children of the root hold test rows (this seed)
        e2 = pm1["nodes"][1]
        dup = np.concatenate([e2["rows"], e["rows"][:1]]).astype(np.int32)
        _reject(r.p, {**pm1, "nodes": [e, {"id": e2["id"], "rows": dup}]}, "rows differ|two nodes")
        assert s["depth"] == 1
    finally:
        r.close()


def test_no_training_after_prediction_started():
    P = VerticalParams(model="gbdt", n_trees=2, key_bits=BITS, allow_insecure_key=True, workers=1, bins=8,
                       max_depth=2, min_rows_node=10, obfuscation="djn")
    a, ps = make_parties(_data(), P)
    (name, p), = ps.items()
    try:
        out = a.step(None)
        while not (out[name]["type"] == "layer" and out[name]["depth"] == 1):
            out = a.step({name: p.handle(out[name])})
        nxt = dict(out[name])
        sid = next(iter(p.splits))
        p.handle({"type": "predict", "depth": 0, "nodes": [{"id": sid, "rows": np.arange(p.n_test, dtype=np.int32)}]})
        _reject(p, nxt, "training request after prediction started")
    finally:
        close_parties(a, ps)


def _one_row_in(m, child, sibling):
    """The layer-1 request ``m`` with one row of the root in ``child`` and every other row in ``sibling``."""
    assign = np.full_like(m["assign"], sibling)
    assign[0] = child
    return assign


@pytest.mark.parametrize("child,sibling", [(1, 2), (2, 1)])
def test_no_answer_for_the_open_sibling_of_a_one_row_child(child, sibling):
    """No answer that would let root minus sibling expose a small child: the active party split the root (its own
    feature) into one row and the rest and asks about the rest only; it holds the root's sums, so root minus
    sibling would be that row's bin on every passive feature.  The request is refused, naming the nodes (no count,
    no value); afterwards the passive still answers the honest case of a closed (say pure) child of exactly the
    minimum beside an open sibling."""
    r = Run(owner="active")
    try:
        m = r.until("layer", 1)
        assert not r.p.splits                               # the active party made the root split
        with pytest.raises(ProtocolError) as e:
            r.p.handle({**m, "assign": _one_row_in(m, child, sibling), "open": [sibling]})
        assert str(e.value) == (f"node {child} is below the 10 rows agreed at setup and its sibling {sibling} is "
                                "open: its sums would follow from the parent's; no answer")
        at_minimum = np.full_like(m["assign"], sibling)
        at_minimum[:10] = child
        assert r.p.handle({**m, "assign": at_minimum, "open": [sibling]})["type"] == "hist"
    finally:
        r.close()


def test_deviating_active_splitting_off_a_small_child_refused(monkeypatch):
    """An active party whose own split search ignores the minimum (the rule before the minimum held for every child) creates small
    children on its own feature; the passive refuses the first layer that would expose one."""
    import treeflare.vertical.active as active_mod
    from treeflare.vertical.stats import cum_candidates
    monkeypatch.setattr(active_mod, "cum_candidates", lambda cnt, vecs, _min_side=1: cum_candidates(cnt, vecs))
    r = Run(max_depth=5)
    try:
        with pytest.raises(ProtocolError, match=r"^node \d+ is below the 10 rows agreed at setup and its sibling "
                                                r"\d+ is open"):
            while r.msg()["type"] != "finish":
                r.step()
    finally:
        r.close()


def test_passive_offers_no_threshold_leaving_a_side_below_the_minimum():
    """The passive's own splits never create a node below the minimum: every candidate it offers, in every layer
    of an honest run, leaves at least the agreed rows on each side."""
    r = Run(max_depth=5)
    checked = 0
    try:
        while r.msg()["type"] != "finish":
            is_layer = r.msg()["type"] == "layer"
            r.step()
            if not is_layer:
                continue
            for nid, f, b in r.p._pending.values():
                rows = r.p._idx[nid]
                n_left = int(np.count_nonzero(r.p.bins[rows, f] <= b))
                assert 10 <= n_left <= rows.size - 10, (nid, n_left, rows.size)
                checked += 1
        assert checked > 0
    finally:
        r.close()
