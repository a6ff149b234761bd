"""Rule extraction, the conjunction-set merge (spec §3.9 vectors, fixed semantics) and rule JSON."""

import json

import numpy as np
import pytest

from test_icdta4fl_helpers import rules
from treeflare.icdta4fl import RulePayloadError, RuleSet, extract_rules, merge_rule_sets
from treeflare.icdta4fl.merge import compatible_pairs
from treeflare.trees import CATEGORICAL, LEAF, NUMERIC, Tree

NUM2 = ["numeric", "numeric"]
CAT2 = ["categorical", "categorical"]


def test_cart_vectors_sample_weighted_and_reference_compat():
    a = rules(NUM2, [({0: (None, 32.5)}, [0.8, 0.2], 100)])
    b = rules(NUM2, [({0: (20.5, None), 1: (None, 3.5)}, [0.4, 0.6], 25)])
    merged, _ = merge_rule_sets([a, b])
    assert merged.n_rules == 1
    np.testing.assert_allclose(merged.lower[0], [20.5, -np.inf])
    np.testing.assert_allclose(merged.upper[0], [32.5, 3.5])
    np.testing.assert_allclose(merged.dist[0], [0.72, 0.28])  # (100*.8 + 25*.4) / 125
    assert merged.support[0] == pytest.approx(50.0)
    ref, _ = merge_rule_sets([a, b], reference_compat=True)
    np.testing.assert_allclose(ref.dist[0], [0.6, 0.4])  # the reference's unweighted mean
    assert ref.support[0] == 50


def test_cart_compatibility_real_valued():
    a = rules(NUM2, [({0: (None, 32.5)}, [0.8, 0.2], 100)])
    assert compatible_pairs(a, rules(NUM2, [({0: (39.0, None)}, [1, 0], 5)]))[0].size == 0
    tiny = rules(NUM2, [({0: (32.4995, None)}, [1, 0], 5)])  # overlap 0.0005
    assert compatible_pairs(a, tiny, eps=0.001)[0].size == 0
    assert compatible_pairs(a, tiny)[0].size == 1
    lo = rules(NUM2, [({0: (0.05, None)}, [1, 0], 5)])
    hi = rules(NUM2, [({0: (None, 0.08)}, [1, 0], 5)])
    assert compatible_pairs(lo, hi)[0].size == 1  # no 'int' quirk
    touching = rules(NUM2, [({0: (32.5, None)}, [1, 0], 5)])
    assert compatible_pairs(a, touching)[0].size == 0  # (.., 32.5] and (32.5, ..] do not meet


def test_id3_merge_keeps_both_conditions():
    a = rules(CAT2, [({0: 0}, [0.9, 0.1], 100)])
    b = rules(CAT2, [({1: 1}, [0.2, 0.8], 50)])
    merged, _ = merge_rule_sets([a, b])
    assert merged.equals.tolist() == [[0, 1]]
    np.testing.assert_allclose(merged.dist[0], [2 / 3, 1 / 3])
    assert round(merged.support[0]) == 71
    clash = rules(CAT2, [({0: 1}, [0.5, 0.5], 10)])
    assert compatible_pairs(a, clash)[0].size == 0


def test_id3_end_to_end_gives_four_rules():
    A = rules(CAT2, [({0: 0}, [0.9, 0.1], 100), ({0: 1}, [0.2, 0.8], 100)])
    B = rules(CAT2, [({1: 0}, [0.8, 0.2], 80), ({1: 1}, [0.3, 0.7], 120)])
    merged, _ = merge_rule_sets([A, B])
    assert merged.n_rules == 4
    keys = {tuple(row) for row in merged.equals.tolist()}
    assert keys == {(0, 0), (0, 1), (1, 0), (1, 1)}
    r = merged.equals.tolist().index([0, 0])
    np.testing.assert_allclose(merged.dist[r], [(90 + 64) / 180, (10 + 16) / 180])


def test_numeric_and_categorical_features_each_by_kind():
    kinds = ["numeric", "categorical"]
    a = rules(kinds, [({0: (None, 5.0), 1: 2}, [1, 0], 10), ({0: (5.0, None)}, [0, 1], 10)])
    b = rules(kinds, [({1: 2}, [1, 0], 10), ({1: 0, 0: (3.0, None)}, [0, 1], 10)])
    ia, ib = compatible_pairs(a, b)
    assert sorted(zip(ia.tolist(), ib.tolist())) == [(0, 0), (1, 0), (1, 1)]


def test_cap_really_applies_and_empty_merge_skips_the_tree(caplog):
    cuts = np.arange(1.0, 60.0)
    def partition(j, n_cuts):
        edges = [None] + list(cuts[:n_cuts]) + [None]
        return rules(NUM2, [({j: (edges[i], edges[i + 1])}, [i % 2, 1 - i % 2], 10 + i)
                            for i in range(n_cuts + 1)])
    a, b = partition(0, 59), partition(1, 59)  # 60 x 60 = 3600 compatible pairs
    # reference cap: the 1000 lowest-entropy pairs
    merged, stats = merge_rule_sets([a, b], max_rules=1000, cap_by="entropy")
    assert merged.n_rules == 1000 and stats["capped"]
    # default cap: refine only some rules of the first tree, keep the rest whole
    merged, stats = merge_rule_sets([a, b], max_rules=1000)
    assert 900 < merged.n_rules <= 1000 and stats["capped"]
    grid = np.array([[x, y] for x in np.arange(-0.5, 61) for y in np.arange(-0.5, 61)])
    cover = merged.covers(grid).sum(axis=1)
    assert np.all(cover == 1)  # still a partition: no region lost, no overlap
    merged, _ = merge_rule_sets([a, b], max_rules=5000)
    assert merged.n_rules == 3600
    # an incompatible tree: kept set unchanged, tree reported as skipped
    small = rules(CAT2, [({0: 0}, [1, 0], 5), ({0: 1}, [0, 1], 6)])
    c = rules(CAT2, [({0: 2}, [1, 0], 7)])
    merged, stats = merge_rule_sets([small, c])
    # canonical order merges the smaller set first, so the two-rule tree is the one skipped
    assert stats["order"] == [1, 0] and stats["skipped"] == [0]
    assert merged.n_rules == 1 and merged.equals[0, 0] == 2
    assert "skipped" in caplog.text


def test_merge_does_not_depend_on_site_order():
    rng = np.random.default_rng(5)
    sets = []
    for s in range(4):
        cuts = np.sort(rng.uniform(0, 10, 3))
        j = s % 2
        edges = [None, *cuts, None]
        sets.append(rules(NUM2, [({j: (edges[i], edges[i + 1])}, rng.dirichlet([1, 1]),
                                  float(rng.integers(5, 50))) for i in range(4)]))
    ref, _ = merge_rule_sets(sets, max_rules=20)
    for perm in ([3, 2, 1, 0], [1, 3, 0, 2]):
        other, _ = merge_rule_sets([sets[i] for i in perm], max_rules=20)
        for field in ("lower", "upper", "equals", "mass", "support"):
            np.testing.assert_allclose(getattr(other, field), getattr(ref, field))


def test_extract_rules_from_tree_with_fallback_codes():
    t = Tree(["numeric", "categorical"], 2, kind=[CATEGORICAL, NUMERIC, LEAF, LEAF, LEAF],
             feature=[1, 0, -1, -1, -1],
             split_points=[np.array([0.0, 2.0]), np.array([1.5]), None, None, None],
             children=[np.array([1, 4]), np.array([2, 3]), None, None, None],
             counts=[[10, 30], [8, 2], [8, 0], [0, 2], [2, 28]], n_categories=[None, 3])
    r = extract_rules(t)
    assert r.n_rules == 4  # 3 leaves + code 1 unseen at the root
    boxes = {(lo[0], up[0], eq[1]) for lo, up, eq in zip(r.lower, r.upper, r.equals)}
    assert boxes == {(-np.inf, 1.5, 0), (1.5, np.inf, 0), (-np.inf, np.inf, 2), (-np.inf, np.inf, 1)}
    fallback = r.equals[:, 1].tolist().index(1)
    np.testing.assert_allclose(r.dist[fallback], [0.25, 0.75])
    assert r.support[fallback] == 1.0
    assert extract_rules(t, fallback_support=0).n_rules == 3
    X = np.array([[1.0, 0], [2.0, 0], [0.0, 2], [0.0, 1]])
    assert np.all(r.covers(X).sum(axis=1) == 1)  # the rules partition what the tree covers


def test_ruleset_json_round_trip_and_rejections():
    r = rules(["numeric", "categorical"], [({0: (None, 2.5), 1: 1}, [0.3, 0.7], 12),
                                           ({0: (2.5, None)}, [1.0, 0.0], 4)])
    d = json.loads(json.dumps(r.to_dict(), allow_nan=False))
    back = RuleSet.from_dict(d)
    for field in ("lower", "upper", "equals", "mass", "support", "n_sources"):
        np.testing.assert_array_equal(getattr(back, field), getattr(r, field))
    bad = json.loads(json.dumps(d))
    bad["upper"][1][0] = 1.0  # lower 2.5 >= upper 1.0
    with pytest.raises(RulePayloadError, match="upper"):
        RuleSet.from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["mass"][0] = [0.3]
    with pytest.raises(RulePayloadError, match=r"mass\[0\]"):
        RuleSet.from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["equals"][0][0] = 3  # equality on a numeric feature
    with pytest.raises(RulePayloadError, match=r"equals\[0\]\[0\]"):
        RuleSet.from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["lower"][0][0] = float("nan")
    with pytest.raises(RulePayloadError, match="not finite"):
        RuleSet.from_dict(bad)
    with pytest.raises(RulePayloadError, match="support"):
        RuleSet.from_dict(d, max_rules=1)  # over the cap
    with pytest.raises(RulePayloadError, match="n_classes"):
        RuleSet.from_dict(d, n_classes=3)
