"""Prediction-only runs of a vertical model: every party loads only its own model part, rows are joined
on ids, the predictions equal those made at the end of training, passive thresholds never travel, and the passive
party's checks hold for a prediction run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from treeflare.vertical import PassivePolicy, ProtocolError, VerticalParams, run_oracle, synthetic
from treeflare.vertical.prediction import (ActivePredictor, ModelPartError, PassivePredictor, predictions_frame,
                                           run_prediction)


def _train(model, obj, L, seed):
    d = synthetic(n=160, n_test=60, passive_features=(2, 2), n_classes=L, seed=seed)
    kw = dict(model=model, criterion=obj) if model == "tree" else dict(model=model, objective=obj)
    P = VerticalParams(key_bits=512, allow_insecure_key=True, workers=1, max_depth=3, bins=8, min_rows_node=4,
                       n_trees=1 if model == "tree" else 3, **kw)
    a, ps = run_oracle(d, P)              # the same protocol on a mock cipher: a real model, fast
    return d, a, ps


def _parties(d, a, ps, perms, policy=None, ids=None):
    """Prediction parties from the training run's model parts and test rows, each party's rows in its own order."""
    ids = list(map(str, d.ids_test)) if ids is None else ids
    pa = perms["site-1"]
    active = ActivePredictor("site-1", json.loads(json.dumps(a.model())), d.X_active_test[pa],
                             [ids[i] for i in pa])
    passives = {}
    for name, Xt in zip(d.passive_names, d.X_passive_test):
        pp = perms[name]
        passives[name] = PassivePredictor(name, json.loads(json.dumps(ps[name].model())), Xt[pp],
                                          [ids[i] for i in pp], policy=policy)
    return active, passives


# seeds whose models split on both parties (seed 5's tree has no active split since no child may fall below the minimum)
CASES = [("gbdt", "binary", 2, 3), ("gbdt", "softmax", 3, 4), ("tree", "gini", 3, 6)]


@pytest.mark.parametrize("model,obj,L,seed", CASES)
def test_predictions_equal_those_made_at_the_end_of_training(model, obj, L, seed):
    d, a, ps = _train(model, obj, L, seed)
    assert {nd["owner"] for t in a.trees for nd in t["nodes"] if not nd["leaf"]} > {"site-1"}   # passive splits used
    rng = np.random.default_rng(seed)
    perms = {s: rng.permutation(60) for s in ["site-1", *d.passive_names]}     # rows joined on ids, any order
    active, passives = _parties(d, a, ps, perms)
    rec = []
    run_prediction(active, passives, record=rec)
    pa = perms["site-1"]
    assert np.array_equal(active.pred, np.asarray(a.test_pred)[pa])
    assert np.array_equal(active.score, np.asarray(a.test_score)[pa])             # exactly, not approximately

    # passive thresholds (and bin edges) never reach the active party or the server (which routes every message)
    thresholds = {float(s["threshold"]) for p in ps.values() for s in p.splits.values()}
    thresholds |= {float(e) for p in ps.values() for es in p.edges for e in es}
    passive_vals = {float(v) for Xt in d.X_passive_test for v in Xt.ravel()}
    kinds = set()

    def leaves(obj, key=None):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from leaves(v, k)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from leaves(v, key)
        else:
            yield key, obj

    for src, dst, msg in rec:
        kinds.add(msg["type"])
        for key, leaf in leaves(msg):
            assert key not in ("threshold", "feature", "feature_index", "splits", "bin")
            if isinstance(leaf, float):
                assert leaf not in thresholds and leaf not in passive_vals
            if isinstance(leaf, np.ndarray):
                assert leaf.dtype.kind in "ui"                 # row numbers and answer bits only
                assert (key == "rows" and dst != "site-1") or (key == "bits" and dst == "site-1")
        if src != "site-1":
            assert set(msg) <= {"type", "nodes"} and all(set(e) == {"id", "bits"} for e in msg.get("nodes", []))
        else:
            assert set(msg) <= {"type", "version", "n_rows", "nonce", "ids", "model", "depth", "nodes"}
    assert kinds == {"predict_setup", "predict_ok", "predict", "predictions", "finish", "done"}

    frame = predictions_frame(active.row_ids, "uid", active.pred, active.score, a.model(),
                              [f"c{k}" for k in range(L)])
    assert list(frame.columns) == ["uid", "predicted", *[f"p_c{k}" for k in range(L)]]
    assert list(frame["uid"]) == [str(d.ids_test[i]) for i in pa]
    probs = frame[[f"p_c{k}" for k in range(L)]].to_numpy()
    assert np.allclose(probs.sum(axis=1), 1.0)
    assert list(frame["predicted"]) == [f"c{k}" for k in np.asarray(a.test_pred)[pa]]


@pytest.fixture(scope="module")
def trained():
    return _train("gbdt", "binary", 2, 3)


def _ident(n=60):
    return {s: np.arange(n) for s in ["site-1", "site-2", "site-3"]}


def test_ids_missing_at_a_party_are_refused(trained):
    """A party holding other rows than the active party's is refused: by its count, or (same count) by the MAC of
    the ids under the link key the two parties share since training (no id digest crosses the server)."""
    d, a, ps = trained
    ids = list(map(str, d.ids_test))
    active, passives = _parties(d, a, ps, _ident())
    passives["site-3"] = PassivePredictor("site-3", ps["site-3"].model(), d.X_passive_test[1][:-1], ids[:-1])
    with pytest.raises(ProtocolError, match="site-3: 59 new rows here, 60 at the active party: every party must hold"):
        run_prediction(active, passives)
    active, passives = _parties(d, a, ps, _ident())
    other = ids[:-1] + ["someone-else"]                   # site-3 lacks one id and holds another
    passives["site-3"] = PassivePredictor("site-3", ps["site-3"].model(), d.X_passive_test[1], other)
    with pytest.raises(ProtocolError, match="site-3: the new rows' ids differ from the active party's .*every party "
                                            "must hold the same"):
        run_prediction(active, passives)


def test_a_model_part_of_another_run_is_refused(trained):
    d, a, ps = trained
    _d2, _a2, ps2 = _train("gbdt", "binary", 2, 9)
    active, passives = _parties(d, a, ps, _ident())
    passives["site-2"] = PassivePredictor("site-2", ps2["site-2"].model(), d.X_passive_test[0],
                                          list(map(str, d.ids_test)))
    with pytest.raises(ProtocolError, match="does not match this party's model part"):
        run_prediction(active, passives)


def test_passive_caps_rows_per_run(trained):
    d, a, ps = trained
    active, passives = _parties(d, a, ps, _ident(), policy=PassivePolicy(max_predict_rows=59))
    with pytest.raises(ProtocolError, match="at most 59 rows per run"):
        run_prediction(active, passives)


def test_passive_checks_in_a_prediction_run(trained):
    """The training run's checks hold for a prediction run: requests only after setup, only for this party's
    splits, the root with every row, below this party's own split exactly the rows it sent there (and never before
    that split), nothing after the run finished."""
    d, a, ps = trained
    active, passives = _parties(d, a, ps, _ident())
    out = active.step(None)
    setups = dict(out)
    name, p = next((n, q) for n, q in passives.items() if any(s["node"] == 0 for s in q.splits.values()))
    root = next(sid for sid, s in p.splits.items() if s["node"] == 0 and s["tree"] == 0)
    below = [sid for sid, s in p.splits.items() if s["tree"] == 0 and s["node"] in (1, 2)]
    assert below                                          # this model has one (seeded): the checks below run
    with pytest.raises(ProtocolError, match="before the prediction run was set up"):
        p.handle({"type": "predict", "depth": 0, "nodes": [{"id": root, "rows": np.arange(60, dtype=np.int32)}]})
    for n_, q in passives.items():
        q.handle(setups[n_])
    with pytest.raises(ProtocolError, match="already set up"):
        p.handle(setups[name])
    with pytest.raises(ProtocolError, match="asked before node 0 above it"):
        p.handle({"type": "predict", "depth": 1, "nodes": [{"id": below[0], "rows": np.arange(5, dtype=np.int32)}]})
    with pytest.raises(ProtocolError, match="every row reaches the root"):
        p.handle({"type": "predict", "depth": 0, "nodes": [{"id": root, "rows": np.arange(59, dtype=np.int32)}]})
    with pytest.raises(ProtocolError, match="unknown split id"):
        p.handle({"type": "predict", "depth": 0, "nodes": [{"id": "0" * 16, "rows": np.arange(60, dtype=np.int32)}]})
    r = p.handle({"type": "predict", "depth": 0, "nodes": [{"id": root, "rows": np.arange(60, dtype=np.int32)}]})
    left = np.unpackbits(r["nodes"][0]["bits"])[:60].astype(bool)
    s = p.splits[below[0]]
    sent = np.flatnonzero(left if s["node"] == 1 else ~left)
    wrong = np.setdiff1d(np.arange(60), sent)[:5].astype(np.int32)
    with pytest.raises(ProtocolError, match="rows differ from those this party sent down"):
        p.handle({"type": "predict", "depth": 1, "nodes": [{"id": below[0], "rows": wrong}]})
    with pytest.raises(ProtocolError, match="already asked"):
        p.handle({"type": "predict", "depth": 0, "nodes": [{"id": root, "rows": np.arange(60, dtype=np.int32)}]})
    assert p.handle({"type": "finish"}) == {"type": "done"}
    with pytest.raises(ProtocolError, match="has finished"):
        p.handle({"type": "predict_setup"})


def test_model_parts_are_checked(trained):
    d, a, ps = trained
    m = a.model()
    ids = list(map(str, d.ids_test))
    with pytest.raises(ModelPartError, match="belongs to 'site-1', not to 'site-2'"):
        ActivePredictor("site-2", m, d.X_active_test, ids)
    with pytest.raises(ModelPartError, match="format"):
        ActivePredictor("site-1", ps["site-2"].model(), d.X_active_test, ids)        # a passive's part
    broken = json.loads(json.dumps(m))
    nd = next(nd for t in broken["trees"] for nd in t["nodes"] if not nd["leaf"] and nd["owner"] != "site-1")
    nd["owner"] = "site-9"
    with pytest.raises(ModelPartError, match="unknown party 'site-9'"):
        ActivePredictor("site-1", broken, d.X_active_test, ids)
    with pytest.raises(ValueError, match="distinct"):
        ActivePredictor("site-1", m, d.X_active_test, ids[:-1] + ids[:1])
    pm = json.loads(json.dumps(ps["site-2"].model()))
    next(iter(pm["splits"].values()))["feature_index"] = 7
    with pytest.raises(ModelPartError, match="out of range"):
        PassivePredictor("site-2", pm, d.X_passive_test[0], ids)
