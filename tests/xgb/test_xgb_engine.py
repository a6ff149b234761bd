"""The treeflare engine (``--engine treeflare``) in process: XGBoost's hist trees exactly, on masked sums only, with
the sites' and the server's checks each tried by a hostile party. Pure: no NVFlare."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treeflare.crypto import secagg
from treeflare.data import DataError
from treeflare.trees.validate import PayloadError
from treeflare.xgb.engine import bins
from treeflare.xgb.engine.driver import route, train
from treeflare.xgb.engine.params import BoostParams
from treeflare.xgb.engine.secure import SecureSite
from treeflare.xgb.engine.server import EngineError, HistServer
from treeflare.xgb.engine.site import HistSite

xgb = pytest.importorskip("xgboost")

OBJECTIVES = ("binary:logistic", "multi:softprob", "reg:squarederror")


def prebinned(objective, n=1500, seed=0, missing=0.1):
    """Integer features (XGBoost's cuts then equal ours), missing values, a label of each objective."""
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 25, (n, 5)).astype(np.float32)
    X[rng.random(X.shape) < missing] = np.nan
    z = np.nan_to_num(X[:, 0]) + 0.5 * np.nan_to_num(X[:, 1]) - 0.3 * np.nan_to_num(X[:, 2]) + rng.normal(0, 3, n)
    if objective == "binary:logistic":
        y = (z > 12).astype(int)
    elif objective == "multi:softprob":
        y = np.digitize(z, [7, 12, 17])
    else:
        y = z.astype(np.float32)
    return X, y


def split(X, y, how, k=3):
    if how == "iid":
        return [(X[i::k], y[i::k]) for i in range(k)]
    order = np.argsort(np.asarray(y, dtype=np.float64), kind="stable")  # label skew: sites hold label ranges
    cuts = [0, len(y) // 5, len(y) // 2, len(y)]
    return [(X[order[a:b]], np.asarray(y)[order[a:b]]) for a, b in zip(cuts, cuts[1:])]


def booster(doc):
    return xgb.Booster(model_file=bytearray(json.dumps(doc).encode()))


def reference(parts, params, base_score, valid=None, **kw):
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return xgb.train({**params.xgb_params(base_score), "nthread": 1}, xgb.DMatrix(X, label=y, missing=np.nan),
                     params.rounds, **kw)


def trees_of(doc):
    return doc["learner"]["gradient_booster"]["model"]["trees"]


EXTRA = {"binary:logistic": {"gamma": 0.5, "reg_alpha": 0.3, "min_child_weight": 3.0},
         "multi:softprob": {"max_delta_step": 0.7, "reg_lambda": 2.0},
         "reg:squarederror": {"gamma": 2.0, "min_child_weight": 20.0, "eta": 0.5}}


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("how", ["iid", "skew"])
@pytest.mark.parametrize("extra", [False, True], ids=["defaults", "regularized"])
def test_same_trees_as_xgboost_hist_on_pooled_rows(objective, how, extra):
    X, y = prebinned(objective)
    params = BoostParams(objective=objective, num_class=4 if objective == "multi:softprob" else 0, rounds=4,
                         max_depth=4, **(EXTRA[objective] if extra else {}))
    parts = split(X, y, how)
    doc, server = train(parts, params)
    ref = reference(parts, params, server.base_score)
    ours, theirs = trees_of(doc), trees_of(json.loads(ref.save_raw("json")))
    assert len(ours) == len(theirs) == 4 * params.groups
    for a, b in zip(ours, theirs):
        for key in ("left_children", "right_children", "split_indices", "default_left"):
            assert a[key] == b[key], key
        leaves = np.asarray(a["left_children"]) == -1
        assert np.allclose(np.asarray(a["split_conditions"])[leaves], np.asarray(b["split_conditions"])[leaves],
                           atol=1e-6)
    d = xgb.DMatrix(X, missing=np.nan)
    assert np.abs(booster(doc).predict(d) - ref.predict(d)).max() <= 1e-5


@pytest.mark.parametrize("workers", [2, "dask-local:2"])
def test_a_site_on_workers_gives_the_same_model(workers):
    """A site's rows spread over worker processes (or its own Dask cluster): the integer histograms add up to the
    same sums, so the model is the same to the bit."""
    pytest.importorskip("distributed") if str(workers).startswith("dask") else None
    X, y = prebinned("multi:softprob", n=900)
    params = BoostParams(objective="multi:softprob", num_class=4, rounds=2, max_depth=3)
    alone, _ = train(split(X, y, "skew"), params)
    spread, _ = train(split(X, y, "skew"), params, workers=workers)
    assert json.dumps(spread) == json.dumps(alone)


def test_early_stopping_as_xgboost():
    X, y = prebinned("binary:logistic", n=2400, seed=3)
    Xv, yv = prebinned("binary:logistic", n=900, seed=4)
    params = BoostParams(rounds=60, max_depth=6, eta=0.6, early_stopping_rounds=3)
    parts = split(X, y, "iid")
    valid = [(Xv[i::3], yv[i::3]) for i in range(3)]
    doc, server = train(parts, params, valid=valid)
    ref = reference(parts, params, server.base_score, evals=[(xgb.DMatrix(Xv, label=yv, missing=np.nan), "v")],
                    early_stopping_rounds=3, verbose_eval=False)
    assert 3 < server.stats["rounds"] < 60
    assert server.best_iteration == ref.best_iteration
    assert len(trees_of(doc)) == ref.num_boosted_rounds()
    assert doc["learner"]["attributes"]["best_iteration"] == str(ref.best_iteration)


def test_the_server_sees_sums_only_and_each_site_vector_is_masked():
    X, y = prebinned("binary:logistic", n=900)
    record = []
    train(split(X, y, "iid"), BoostParams(rounds=2, max_depth=3), record=record)
    summed = [(req, replies, answer) for req, replies, answer in record if req["type"] != "setup"]
    assert {r["type"] for r, _, _ in summed} == {"sketch", "refine", "round", "level", "finish"}
    for req, replies, answer in summed:
        masked = [replies[s]["masked"] for s in sorted(replies)]
        assert np.array_equal(secagg.sum_masked(masked), answer)
        for v in masked:  # a site's vector alone is not its counts: its values fill the whole 64-bit range
            assert v.dtype == np.uint64 and (v.size < 8 or v.max() > 2 ** 62)
        pair = secagg.sum_masked(masked[:2])  # and no two sites' vectors sum to anything readable either
        assert pair.size < 8 or np.abs(pair).max() > 2 ** 60
    setup = next(replies for req, replies, _ in record if req["type"] == "setup")
    assert all(set(r) == {"n_features", "key"} for r in setup.values())


def sites_for(parts, job="j"):
    return {f"site-{i + 1}": SecureSite(HistSite(f"site-{i + 1}", X, y), job) for i, (X, y) in enumerate(parts)}


def first_requests(params=None, n=600):
    """An honest run's requests (with seq and keys), to replay at a fresh site-1 (its same key) with a field
    changed."""
    X, y = prebinned("binary:logistic", n=n)
    record = []
    sites = sites_for(split(X, y, "iid"))
    route(HistServer(params or BoostParams(rounds=2, max_depth=3), 5), sites, record)
    return [req for req, _, _ in record], (split(X, y, "iid")[0], sites["site-1"].keys)


def replay(requests, upto, site_of, change=None):
    part, keys = site_of
    site = SecureSite(HistSite("site-1", *part), "j")
    site.keys = keys
    out = None
    for i, req in enumerate(requests[:upto + 1]):
        req = {**json.loads(json.dumps({k: v for k, v in req.items() if k != "keys"}, default=_plain)),
               **({"keys": [dict(k) for k in req["keys"]]} if "keys" in req else {})}
        if i == upto and change:
            change(req)
        out = site.handle(req)
    return out


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) else v.item()


def _index(requests, kind):
    return next(i for i, r in enumerate(requests) if r["type"] == kind)


def test_an_honest_replay_is_answered():
    requests, part = first_requests()
    assert "masked" in replay(requests, _index(requests, "level"), part)


@pytest.mark.parametrize("change, field", [
    (lambda r: r["cells"].append(list(r["cells"][0])), "cells"),  # a cell counted twice
    (lambda r: r["cells"].append([0, 0]), "cells"),  # the unbounded end cell
    (lambda r: r["cells"].extend([[0, c] for c in range(300, 600)]), "cells"),  # more cells than bins
])
def test_a_site_refuses_a_refinement_the_plan_does_not_allow(change, field):
    requests, part = first_requests()
    with pytest.raises(PayloadError, match=field):
        replay(requests, _index(requests, "refine"), part, change)


@pytest.mark.parametrize("change, field", [
    (lambda r: r.update(seq=r["seq"] + 1), "seq"),
    (lambda r: r["cuts"][0].insert(1, r["cuts"][0][1] + 0.001), "cuts[0]"),
    (lambda r: r.update(cuts=[[0.0, 1.0]] * 4), "cuts"),
    (lambda r: r.update(grad_bits=60), "grad_bits"),
])
def test_a_site_refuses_a_first_round_the_plan_does_not_allow(change, field):
    requests, part = first_requests()
    with pytest.raises(PayloadError, match=field.replace("[", r"\[").replace("]", r"\]")):
        replay(requests, _index(requests, "round"), part, change)


@pytest.mark.parametrize("change, field", [
    (lambda r: r["splits"][0].update(node=5), "splits"),  # not a node of the level before
    (lambda r: r["splits"].append(dict(r["splits"][0])), "splits"),  # the same node split twice
    (lambda r: r["splits"][0].update(bin=10_000), "splits"),
    (lambda r: r["build"].append({"group": 0, "node": r["build"][0]["node"] ^ 3}), "build"),  # both children
    (lambda r: r.update(depth=5), "depth"),
    (lambda r: r["keys"].pop(), "keys"),  # a sum of two: each would read the other's
])
def test_a_site_refuses_a_level_the_plan_does_not_allow(change, field):
    requests, part = first_requests()
    with pytest.raises((PayloadError, secagg.SecAggError), match=field):
        replay(requests, _index(requests, "level"), part, change)


@pytest.mark.parametrize("change", [
    lambda t: t["left_children"].__setitem__(0, 99),  # no model at all
    lambda t: t["split_conditions"].__setitem__(0, t["split_conditions"][0] + 0.01),  # a cut nobody agreed
    lambda t: t["default_left"].__setitem__(0, 1 - t["default_left"][0]),
], ids=["no model", "other threshold", "other default"])
def test_a_site_refuses_trees_other_than_those_it_grew(change):
    requests, part = first_requests()
    i = next(i for i, r in enumerate(requests) if r["type"] == "round" and r["trees"])
    with pytest.raises(PayloadError, match="trees"):
        replay(requests, i, part, lambda r: change(r["trees"][0]))


class Inflating(HistSite):
    """A hostile site that controls every value it sends: ``how`` rewrites each vector before masking."""

    def __init__(self, *a, how, **kw):
        super().__init__(*a, **kw)
        self.how = how

    def handle(self, req):
        out = super().handle(req)
        if "values" in out:
            out["values"] = self.how(req, out["values"].copy())
        return out


def hostile_run(how, objective="binary:logistic"):
    X, y = prebinned(objective, n=900)
    parts = split(X, y, "iid")
    sites = sites_for(parts)
    sites["site-2"] = SecureSite(Inflating("site-2", *parts[1], how=how), "j")
    params = BoostParams(objective=objective, num_class=4 if objective == "multi:softprob" else 0, rounds=3,
                         max_depth=3)
    return route(HistServer(params, 5), sites), parts


def _gradient_bin(req, v):
    if req["type"] in ("round", "level") and v.size > 10:
        v[-1] += 2 ** 45  # one bin's hessian: far beyond what its rows can give
    return v


def _counts_only(req, v):
    if req["type"] == "level":
        v[0] += 50  # more rows in a bin than the node holds
    return v


def _gradients_scaled(req, v):
    if req["type"] in ("round", "level") and v.size > 10:
        v = v * 3  # counts, gradients and hessians together: rows it does not have
    return v


def _refined_parts(req, v):
    if req["type"] == "refine":
        v[1] += 7  # rows in a part of a cell that the cell's count does not hold
    return v


class Wrapping(HistSite):
    """Four counts of 2^62 add up to 0 mod 2^64, and 2^40 x 2^62 wraps to 0: checked in int64, such bins could carry
    the gradients of thousands of rows with the pooled rows unchanged; the additions are split between the two
    children so that the sibling the server derives passes too (the hostile review's attack)."""

    def _add(self, v, off, part):
        B = int(self.ptr[-1])
        C, G = v[off:off + B], v[off + B:off + 2 * B]
        for f in range(len(self.ptr) - 1):
            lo = int(self.ptr[f])
            if int(self.ptr[f + 1]) - lo >= 8:
                if part in ("root", "left"):
                    C[lo:lo + 4] += np.int64(2 ** 62)
                    G[lo + 3] += np.int64(2 ** 61)
                if part in ("root", "right"):
                    C[lo + 4:lo + 8] += np.int64(2 ** 62)
                    G[lo + 4] -= np.int64(2 ** 61)

    def handle(self, req):
        out = super().handle(req)
        if "values" in out:
            v = out["values"].copy()
            with np.errstate(over="ignore"):
                if req["type"] == "round" and req["round"] == 0:
                    self._add(v, 4, "root")
                elif req["type"] == "level" and req["round"] == 0 and req["depth"] == 1:
                    self._add(v, 0, "left" if req["build"][0]["node"] == 1 else "right")
            out["values"] = v
        return out


def test_counts_that_wrap_around_int64_do_not_pass_the_checks():
    X, y = prebinned("binary:logistic", n=900)
    parts = split(X, y, "iid")
    sites = sites_for(parts)
    sites["site-3"] = SecureSite(Wrapping("site-3", *parts[2]), "j")
    with pytest.raises(EngineError, match="a site sent"):
        route(HistServer(BoostParams(rounds=2, max_depth=2), 5), sites)


def _wrapped_sketch(req, v):
    if req["type"] == "sketch":
        v[10:14] += 2 ** 62
    return v


def _label_cells(req, v):
    if req["type"] == "sketch":  # regression: -M in a label cell, +M in another: the cells still add up
        v[4], v[5] = v[4] - 10 ** 6, v[5] + 10 ** 6
    return v


@pytest.mark.parametrize("how, objective", [(_gradient_bin, "binary:logistic"), (_counts_only, "binary:logistic"),
                                            (_gradients_scaled, "binary:logistic"),
                                            (_refined_parts, "binary:logistic"),
                                            (_wrapped_sketch, "multi:softprob"),
                                            (_label_cells, "reg:squarederror")])
def test_a_site_sending_what_its_rows_cannot_give_ends_the_job(how, objective):
    with pytest.raises(EngineError, match="a site sent|not what the sites' rows can give"):
        hostile_run(how, objective)


def test_a_site_cannot_steer_early_stopping_past_what_its_validation_rows_can_give():
    X, y = prebinned("binary:logistic", n=900)
    Xv, yv = prebinned("binary:logistic", n=300, seed=5)
    parts = split(X, y, "iid")
    sites = {f"site-{i + 1}": SecureSite(HistSite(f"site-{i + 1}", *p, Xv[i::3], yv[i::3]), "j")
             for i, p in enumerate(parts)}

    def inflate(req, v):
        if req["type"] == "round" and req["round"] > 0:
            v[0] += 2 ** 24 * 10 ** 5  # a validation loss no 100 rows can give
        return v

    sites["site-2"] = SecureSite(Inflating("site-2", *parts[1], Xv[1::3], yv[1::3], how=inflate), "j")
    with pytest.raises(EngineError, match="validation loss"):
        route(HistServer(BoostParams(rounds=3, max_depth=3, early_stopping_rounds=1), 5), sites)


def _duplicated(req, v):
    """Every field doubled consistently from the sketch on: as if the site held each of its rows twice."""
    if req["type"] == "sketch":
        v = v * 2
    elif req["type"] in ("round", "level", "refine"):
        v = v * 2
        if req["type"] == "round":
            v[0] //= 2  # (its eval sum stays; no validation rows here)
    return v


def test_what_a_hostile_site_can_still_do_is_weigh_its_rows_as_copies():
    """The bound the server's checks hold: a site that declares each of its rows twice, in every field at once, is
    not detected, and its model is exactly the one trained with that site's rows duplicated (per-row gradients
    stay within the objective's bounds: it weighs its rows, it cannot send others)."""
    doc, parts = hostile_run(_duplicated)
    X2, y2 = parts[1]
    twice = [parts[0], (np.concatenate([X2, X2]), np.concatenate([y2, y2])), parts[2]]
    honest, _ = train(twice, BoostParams(rounds=3, max_depth=3))
    d = xgb.DMatrix(np.concatenate([p[0] for p in parts]), missing=np.nan)
    assert np.abs(booster(doc).predict(d) - booster(honest).predict(d)).max() < 1e-6


def test_a_regression_site_whose_gradients_pass_the_agreed_bound_says_so():
    X, y = prebinned("reg:squarederror", n=900)
    parts = split(X, y, "iid")
    sites = sites_for(parts)
    site = sites["site-3"].site
    site._start_original = site._start

    def outlier_after_start(req):  # labels that moved after the sketch: the bound no longer holds
        site._start_original(req)
        site.y = site.y * 1000
    site._start = outlier_after_start
    with pytest.raises(DataError, match="agreed bound"):
        route(HistServer(BoostParams(objective="reg:squarederror", rounds=2, max_depth=2), 5), sites)


def test_lattice_keeps_small_integers_apart_and_cuts_are_lattice_edges():
    edges = bins.lattice()
    assert np.all(np.diff(edges) > 0) and np.all(edges == edges.astype(np.float32))
    cells = bins.cell_of(np.arange(-999, 1000, dtype=np.float32))
    assert len(np.unique(cells)) == 1999
    counts = bins.sketch_counts(np.array([[0.0], [1.0], [1.0], [7.0], [np.nan]], dtype=np.float32))
    cuts = bins.cuts_from_counts(counts, 1, 256)[0]
    assert len(cuts) == 4 and cuts[0] <= 0 < cuts[1] <= 1 < cuts[2] <= 7 < cuts[3]
    b = bins.bin_matrix(np.array([[0.0], [1.0], [7.0], [np.nan]], dtype=np.float32), [np.asarray(cuts)])
    assert b.ravel().tolist() == [0, 1, 2, -1]
    many = bins.sketch_counts(np.random.default_rng(0).normal(size=(5000, 1)).astype(np.float32))
    assert len(bins.cuts_from_counts(many, 1, 64)[0]) - 1 <= 64


def test_a_narrow_peak_is_refined_into_bins_of_its_own():
    """Half the rows between 0.973 and 0.99 fill two lattice cells; their parts give the peak bins of its own, as
    XGBoost's quantiles would, and only there."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0.973, 0.99, 2000), rng.uniform(0.5, 3.0, 2000)]).astype(np.float32)[:, None]
    counts = bins.sketch_counts(x)
    heavy = bins.heavy_cells(counts, 1, 64)
    assert 1 <= len(heavy) <= 4 and all(f == 0 for f, _ in heavy)
    parts = bins.refine_counts(x, heavy)
    assert parts.sum() == sum(int(counts[c]) for _, c in heavy)
    coarse = np.asarray(bins.cuts_from_counts(counts, 1, 64)[0])
    fine = np.asarray(bins.cuts_from_counts(counts, 1, 64, {(0, c): parts[i * 64:(i + 1) * 64]
                                                              for i, (_, c) in enumerate(heavy)})[0])
    inside = lambda c: int(np.sum((c > 0.973) & (c < 0.99)))  # noqa: E731
    assert inside(coarse) <= 2 and inside(fine) >= 16
    assert len(fine) - 1 <= 64
    assert bins.check_cuts([fine.tolist()], 1, 64, PayloadError, refined=heavy)[0].tolist() == fine.tolist()
    with pytest.raises(PayloadError, match="lattice"):  # without having refined them, a site refuses those edges
        bins.check_cuts([fine.tolist()], 1, 64, PayloadError)


def test_equal_gains_go_where_xgboost_scans_first():
    """Rows whose gradient and hessian round to 0 (saturated predictions) make neighbouring candidates tie. XGBoost
    keeps the first it meets: forward from the lowest bin, backward from the highest, the lower feature before a
    higher one. Feature 1 repeats feature 0: feature 0 wins. The middle bin adds nothing to either side: backward,
    bin 2 is met first, so bins 0-1 and the missing rows go left."""
    from treeflare.xgb.engine import formulas

    bits = 20
    one = 2 ** bits
    C = np.array([10, 5, 10] * 2)
    G = np.array([-8 * one, 0, 8 * one] * 2)
    H = np.array([4 * one, 0, 4 * one] * 2)
    total = (30, -8 * one, 10 * one)  # and 5 rows without either feature: G -8, H 2
    r = formulas.Regularization(reg_lambda=1.0, reg_alpha=0.0, min_child_weight=0.0, max_delta_step=0.0,
                                gamma=0.0, eta=0.3)
    split = formulas.best_split(C, G, H, total, [0, 3, 6], r, bits)
    assert (split.feature, split.bin, split.default_left) == (0, 1, True)
    assert split.left == (20, -16 * one, 6 * one) and split.right == (10, 8 * one, 4 * one)


class DeviatingRouter:
    """A deviating server's transport: each site may get a request of its own."""

    def __init__(self, sites):
        self.sites, self.seq, self.keys = sites, 0, None

    def setup(self, req):
        replies = {n: s.handle({**req, "seq": self.seq}) for n, s in self.sites.items()}
        self.keys = [replies[n]["key"] for n in sorted(replies)]
        self.seq += 1
        return replies

    def ask(self, reqs):
        if "type" in reqs:
            reqs = {n: reqs for n in self.sites}
        out = [self.sites[n].handle({**json.loads(json.dumps(reqs[n])), "seq": self.seq, "keys": self.keys})["masked"]
               for n in sorted(self.sites)]
        self.seq += 1
        return secagg.sum_masked(out)


def test_sites_told_different_things_once_never_sum_to_one_sites_histogram_again():
    """A server sends one site a split that sends all its rows right and the others one that sends all theirs left
    (that sum is noise), then the same next level to every site: node 5 would hold the victim's rows alone. The
    masks are bound to everything each site was asked, so that sum is noise too."""
    X, y = prebinned("binary:logistic", n=900)
    sites = sites_for(split(X, y, "iid"))
    server = HistServer(BoostParams(rounds=3, max_depth=4), 5)
    gen, router = server.run(), DeviatingRouter(sites)
    answer = router.setup(next(gen))
    while (req := gen.send(answer))["type"] != "level":
        answer = router.ask(req)
    last = len(server.cuts[0]) - 2
    one = lambda b, left: {"group": 0, "node": 0, "feature": 0, "bin": b, "default_left": left}  # noqa: E731
    router.ask({n: {"type": "level", "round": 0, "depth": 1, "build": [{"group": 0, "node": 1}],
                    "splits": [one(-1, False) if n == "site-2" else one(last, True)]} for n in sites})
    left = lambda node: {"group": 0, "node": node, "feature": 0, "bin": last, "default_left": True}  # noqa: E731
    v = router.ask({"type": "level", "round": 0, "depth": 2, "splits": [left(1), left(2)],
                    "build": [{"group": 0, "node": 3}, {"group": 0, "node": 5}]})
    B = int(server.ptr[-1])
    counts = v[3 * B:4 * B]
    assert np.abs(counts).max() > 2 ** 40  # not the victim's row counts (at most 300): the masks did not cancel


def test_a_refused_request_changes_nothing_at_the_site():
    """Refused (a tree on a threshold nobody agreed), then asked again as grown: answered as if never refused."""
    requests, (part, keys) = first_requests()
    i = next(i for i, r in enumerate(requests) if r["type"] == "round" and r["trees"])
    site = SecureSite(HistSite("site-1", *part), "j")
    site.keys = keys
    for j, req in enumerate(requests[:i + 1]):
        req = {**json.loads(json.dumps({k: v for k, v in req.items() if k != "keys"}, default=_plain)),
               **({"keys": [dict(k) for k in req["keys"]]} if "keys" in req else {})}
        if j == i:
            bad = json.loads(json.dumps(req, default=_plain))
            bad["keys"] = req["keys"]
            bad["trees"][0]["split_conditions"][0] += 0.01
            with pytest.raises(PayloadError, match="trees"):
                site.site.handle(bad)  # the site itself: the masking layer's digest chain is not under test here
        out = site.site.handle(req)
    assert "values" in out and out["values"].size > 4


@pytest.mark.parametrize("tamper, message", [
    (lambda out: {**out, "masked": out["masked"][:-1]}, "another site's"),
    (lambda out: {**out, "seq": out["seq"] + 1}, "not one masked vector"),
    (lambda out: {**out, "masked": out["masked"].astype(np.int64)}, "not one masked vector"),
])
def test_the_router_names_a_site_whose_reply_is_not_the_protocols(tamper, message):
    """The router that FLARE's controller runs too: a malformed reply ends the run naming the site."""
    from treeflare.xgb.engine.driver import ReplyError

    X, y = prebinned("binary:logistic", n=600)
    sites = sites_for(split(X, y, "iid"))
    honest = sites["site-3"].handle
    sites["site-3"].handle = lambda req: tamper(honest(req)) if req["type"] == "sketch" else honest(req)
    with pytest.raises(ReplyError, match=f"site-3: .*{message}"):
        route(HistServer(BoostParams(rounds=1, max_depth=2), 5), sites)
