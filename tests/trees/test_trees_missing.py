"""Missing values end to end: the learners' routing of NaN is kept by the shared tree, its JSON, the rules, the
merge, the rebuild, the refinement and the global model's text; an honest site with missing cells is never refused."""

import json

import numpy as np
import pytest
from sklearn.tree import DecisionTreeClassifier

from treeflare.flare.icdta4fl.inprocess import run_in_process
from treeflare.icdta4fl import GlobalTree
from treeflare.icdta4fl.encoding import FLOAT32_MAX
from treeflare.icdta4fl.export import explain_row, export_text, plot_tree
from treeflare.icdta4fl.merge import compatible_pairs, merge_rule_sets
from treeflare.icdta4fl.rebuild import grow_tree
from treeflare.icdta4fl.refine import _best_split, candidates_from_trees, count_vector, plan_round, refine_tree
from treeflare.icdta4fl.refine_counts import SplitCandidates
from treeflare.icdta4fl.rules import MISSING_ALLOWED, MISSING_ONLY, MISSING_REFUSED, RuleSet, extract_rules
from treeflare.icdta4fl.simplify import collapse_same_class
from treeflare.trees import LEAF, NUMERIC, Tree, TreePayloadError, fit_id3, tree_from_sklearn, validate_tree_dict


def _data_with_missing(seed, n=400, d=4, rate=0.1):
    """Missing cells in every column but the last; NaN in column 1 means class 2 (sklearn splits it off)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = ((X[:, 0] + X[:, 1]) > 0).astype(int)
    mask = rng.random(X.shape) < rate
    mask[:, -1] = False
    X[mask] = np.nan
    y[np.isnan(X[:, 1])] = 2
    return X, y


def test_converted_cart_predicts_like_sklearn_on_every_row_with_missing_values():
    inf_splits = 0
    for seed in range(8):
        X, y = _data_with_missing(seed)
        clf = DecisionTreeClassifier(max_depth=5, random_state=0).fit(X, y)
        inf_splits += int(np.isposinf(clf.tree_.threshold).sum())
        payload = tree_from_sklearn(clf, n_classes=3).to_dict()
        # the site's own check (finite thresholds within the schema's range) accepts its tree
        validate_tree_dict(payload, threshold_bounds=[(-FLOAT32_MAX, FLOAT32_MAX)] * 4)
        tree = Tree.from_dict(json.loads(json.dumps(payload, allow_nan=False)))
        rng = np.random.default_rng(100 + seed)
        new = rng.normal(size=(2000, 4))
        new[rng.random(new.shape) < 0.25] = np.nan
        for rows in (X, new):
            assert np.array_equal(tree.predict(rows), clf.predict(rows))
            assert np.array_equal(tree.apply(rows), clf.apply(rows))
            assert np.allclose(tree.predict_proba(rows), clf.predict_proba(rows))
        row = new[np.isnan(new[:, 1])][0]
        assert tree.decision_path(row) == list(clf.decision_path(row[None, :]).indices)
    assert inf_splits > 0  # the "missing vs not missing" split was exercised


def test_tree_json_version_2_checks_missing_and_version_1_still_loads():
    X, y = _data_with_missing(3)
    tree = tree_from_sklearn(DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y), n_classes=3)
    payload = tree.to_dict()
    assert payload["version"] == 2 and all("missing" in n for n in payload["nodes"] if n["kind"] != "leaf")
    old = json.loads(json.dumps(payload))
    old["version"] = 1
    for node in old["nodes"]:
        node.pop("missing", None)
    old["nodes"] = [n if n["kind"] == "leaf" or n["thresholds"] else {**n, "thresholds": [0.0]} for n in old["nodes"]]
    v1 = Tree.from_dict(old)
    assert (v1.missing == -1).all()
    nan_row = np.array([[np.nan, 0.0, 0.0, 0.0]])
    assert v1.kind[v1.apply(nan_row)[0]] != LEAF  # version 1: a NaN stops at the node
    internal = next(i for i, n in enumerate(payload["nodes"]) if n["kind"] != "leaf")
    only = next(i for i, n in enumerate(payload["nodes"]) if n["kind"] == "numeric" and not n["thresholds"])
    bad_cases = [
        (1, lambda p: p["nodes"][internal].update(missing=0), "version 1 has no missing"),
        (2, lambda p: p["nodes"][internal].update(missing=2), "above"),
        (2, lambda p: p["nodes"][internal].update(missing=True), "integer"),
        (2, lambda p: p["nodes"][only].update(missing=0), "missing-only child"),
        (2, lambda p: p["nodes"][only].pop("missing"), "missing-only child needs"),
        (2, lambda p: p["nodes"][only].update(children=p["nodes"][only]["children"][:1]), "at least one threshold"),
    ]
    for version, corrupt, message in bad_cases:
        bad = json.loads(json.dumps(payload if version == 2 else old))
        corrupt(bad)
        with pytest.raises(TreePayloadError, match=message):
            Tree.from_dict(bad)


def test_rules_say_whether_nan_satisfies_them_and_partition_like_the_tree():
    X, y = _data_with_missing(5)
    tree = tree_from_sklearn(DecisionTreeClassifier(max_depth=5, random_state=0).fit(X, y), n_classes=3)
    rules = RuleSet.from_dict(json.loads(json.dumps(extract_rules(tree).to_dict(), allow_nan=False)))
    assert (rules.missing == MISSING_ONLY).any() and (rules.missing == MISSING_ALLOWED).any()
    rng = np.random.default_rng(0)
    new = rng.normal(size=(3000, 4))
    new[rng.random(new.shape) < 0.3] = np.nan
    cover = rules.covers(new)
    assert (cover.sum(axis=1) == 1).all()  # every row, NaN or not, meets exactly one leaf's rule
    assert np.array_equal(np.argmax(rules.dist[np.argmax(cover, axis=1)], axis=1), tree.predict(new))
    # ID3 stops NaN at the node: those rows meet no rule, the others exactly one
    id3 = fit_id3(X, y, n_classes=3, feature_kinds=["numeric"] * 4)
    cover = extract_rules(id3).covers(new)
    stops = id3.kind[id3.apply(new)] != LEAF
    assert stops.any() and np.array_equal(cover.sum(axis=1), np.where(stops, 0, 1))
    # a version-1 rule set (no "missing") reads as before: NaN fails every tested condition
    v1 = rules.to_dict()
    v1["version"] = 1
    del v1["missing"]
    back = RuleSet.from_dict(v1)
    tested = np.isfinite(back.lower) | np.isfinite(back.upper)
    assert np.array_equal(back.missing, np.where(tested, MISSING_REFUSED, MISSING_ALLOWED))


def _rules(lower, upper, missing, mass):
    n = len(lower)
    return RuleSet(np.array(lower, float)[:, None], np.array(upper, float)[:, None], -np.ones((n, 1), int),
                   np.array(mass, float), np.ones(n), np.ones(n, int), ["numeric"], np.array(missing)[:, None])


def test_merge_meets_at_nan_only_through_a_missing_only_rule():
    inf = np.inf
    a = _rules([-inf, 1.0, -inf], [1.0, inf, inf], [MISSING_ALLOWED, MISSING_REFUSED, MISSING_ONLY],
               [[5, 0], [0, 5], [1, 1]])
    b = _rules([-inf, 2.0, -inf], [0.5, inf, inf], [MISSING_REFUSED, MISSING_ALLOWED, MISSING_ONLY],
               [[4, 0], [0, 4], [2, 0]])
    ia, ib = compatible_pairs(a, b)
    pairs = set(zip(ia.tolist(), ib.tolist()))
    # a0 (x <= 1 or NaN) and b1 (x > 2 or NaN) meet only at NaN: not formed; missing-only a2 meets b1 and b2,
    # never b0 (which refuses NaN); b2 meets a0 (admits NaN), not a1
    assert pairs == {(0, 0), (1, 1), (0, 2), (2, 1), (2, 2)}
    merged, _ = merge_rule_sets([a, b])
    by_box = {(m, lo, up) for m, lo, up in zip(merged.missing[:, 0], merged.lower[:, 0], merged.upper[:, 0])}
    assert (MISSING_REFUSED, -inf, 0.5) in by_box and (MISSING_REFUSED, 2.0, inf) in by_box
    assert (MISSING_ONLY, -inf, inf) in by_box  # its value condition dropped
    nan = np.array([[np.nan]])
    # (a0, b2), (a2, b1), (a2, b2) became one missing-only rule (deduplicated): NaN meets it only
    assert merged.n_rules == 3 and merged.covers(nan).sum() == 1


def test_collapse_rebuild_and_refinement_keep_a_missing_direction():
    X, y = _data_with_missing(7)
    tree = tree_from_sklearn(DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y), n_classes=3)
    collapsed = collapse_same_class(tree)
    assert np.array_equal(collapsed.predict(X), tree.predict(X))
    grown, _ = grow_tree(extract_rules(tree), max_leaves=16)
    assert (grown.missing[grown.kind == NUMERIC] >= 0).any()
    id3_grown, _ = grow_tree(extract_rules(fit_id3(X, y, n_classes=3, feature_kinds=["numeric"] * 4)))
    assert (id3_grown.missing == -1).all()  # no local tree sent NaN anywhere: it stops, as in ID3

    # one feature, thresholds [0, 1]: cells (<=0, (0,1], >1, missing); classes 2
    cands = SplitCandidates((np.array([0.0, 1.0]),), (None,))
    hist = np.array([[30.0, 0.0], [0.0, 30.0], [0.0, 30.0], [10.0, 0.0]])
    gain, j, kind, point, groups, rest, nan_child = _best_split(hist, cands, [False], 1.0)
    assert (kind, point, nan_child) == (NUMERIC, 0, 0)  # the missing rows look like the left side's
    assert np.allclose(groups[0], [40, 0]) and np.allclose(rest, 0)
    hist[3] = [0.0, 10.0]
    assert _best_split(hist, cands, [False], 1.0)[6] == 1
    # missing rows of their own class, the rest mixed: scikit-learn's "missing vs not missing" split
    hist = np.array([[15.0, 15.0, 0.0], [15.0, 15.0, 0.0], [15.0, 15.0, 0.0], [0.0, 0.0, 20.0]])
    gain, j, kind, point, groups, rest, nan_child = _best_split(hist, cands, [False], 1.0)
    assert (point, nan_child) == (-1, 1) and np.allclose(groups[1], [0, 0, 20])


def _sites_with_missing(seed, n_sites=4, n=500, rate=0.3):
    """Sites 0 and 2 (and the test set) hide x1 in some rows where it is low: a few missing cells, not at random."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_sites + 1):
        m = n if s < n_sites else 3000
        x0, x1, x2, x3 = rng.uniform(0, 10, m), rng.normal(size=m), rng.uniform(0, 1, m), rng.normal(size=m)
        y = np.where(x0 < 4, 0, np.where(x1 > 0, 1, 2))
        y = np.where(x2 < 0.2, np.where(x3 > 0, y, (y + 1) % 3), y)
        X = np.column_stack([x0, x1, x2, x3])
        if s in (0, 2, n_sites):
            X[(rng.random(m) < rate) & (x1 < -0.3), 1] = np.nan
            X[rng.random(m) < 0.02, 0] = np.nan
        cut = int(0.8 * m)
        out.append({"X_train": X[:cut], "y_train": y[:cut], "X_test": X[cut:], "y_test": y[cut:]})
    return out[:-1], out[-1]


@pytest.mark.parametrize("algorithm", ["cart", "id3"])
def test_sites_with_missing_cells_are_kept_and_nan_rows_predicted(algorithm):
    sites, test = _sites_with_missing(1)
    assert np.isnan(sites[0]["X_train"]).any() and not np.isnan(sites[1]["X_train"]).any()
    out = run_in_process(sites, algorithm=algorithm, classes=["a", "b", "c"], feature_kinds=["numeric"] * 4,
                         feature_names=["x0", "x1", "x2", "x3"], q=0, local_params={"max_depth": 4},
                         X_global_test=test["X_test"], y_global_test=test["y_test"], refine_rounds=2, refine_from="one_round")
    bounds = [(-FLOAT32_MAX, FLOAT32_MAX)] * 4
    for payload in out["trees"]:  # what a site checks before sending, and the server on receipt
        validate_tree_dict(json.loads(json.dumps(payload, allow_nan=False)), threshold_bounds=bounds)
    assert out["selected"] == [0, 1, 2, 3]  # q=0: every valid tree, the sites with missing cells too
    X, y = test["X_test"], test["y_test"]
    nan_rows = np.isnan(X[:, 1])
    refined = out["refined"]["tree"]
    majority = np.mean(y[nan_rows] == np.bincount(y[nan_rows]).argmax())
    model = GlobalTree(refined, ["a", "b", "c"], ["x0", "x1", "x2", "x3"])
    back = GlobalTree.from_dict(json.loads(json.dumps(model.to_dict(), allow_nan=False)))
    pred = back.predict_codes(X)
    assert np.array_equal(pred, refined.predict(X))
    # a round grown from the start tree: its new numeric splits name the child a NaN follows (ID3's own splits
    # still stop it), whether or not the adopt check then keeps the round
    start = out["model"].tree_ if out["refined"]["start"] == "one_round" else Tree.from_dict(
        out["trees"][out["refined"]["start"]])
    cands = candidates_from_trees([Tree.from_dict(t) for t in out["trees"]], feature_kinds=["numeric"] * 4,
                                  n_categories=[None] * 4, bounds=bounds)
    plan = plan_round(start, cands, out["stats"]["max_depth"])
    summed = np.sum([count_vector(start, cands, plan, s["X_train"], s["y_train"]) for s in sites], axis=0)
    grown, st = refine_tree(start, cands, plan, summed, max_leaves=out["stats"]["max_leaves"],
                            max_depth=out["stats"]["max_depth"], collapse=False)
    assert st["leaves_split"] > 0
    if algorithm == "id3":  # the start tree stops every NaN; the new splits do not
        assert (start.missing == -1).all() and (grown.missing[grown.kind == NUMERIC] >= 0).any()
    if algorithm == "cart":  # every NaN row reaches a leaf and does better than the NaN rows' majority class
        assert (refined.kind[refined.apply(X)] == LEAF).all()
        assert np.mean(pred[nan_rows] == y[nan_rows]) > majority
        assert "or missing" in export_text(back) or "is missing" in export_text(back)
    assert np.mean(pred == y) > 0.8


def test_global_tree_text_and_explanation_name_the_missing_branch():
    X, y = _data_with_missing(3)
    tree = tree_from_sklearn(DecisionTreeClassifier(max_depth=3, random_state=0).fit(X, y), n_classes=3)
    model = GlobalTree(tree, ["a", "b", "c"], ["u", "v", "w", "z"])
    text = export_text(model)
    assert "v is missing" in text and "v is not missing" in text and "or missing" in text
    row = np.array([0.5, np.nan, 0.0, 0.0])
    steps = explain_row(model, row)
    assert steps[-1] == "v is missing" or any("or missing" in s for s in steps)
    id3 = GlobalTree(fit_id3(X, y, n_classes=3, feature_kinds=["numeric"] * 4), ["a", "b", "c"], ["u", "v", "w", "z"])
    assert "otherwise (missing value)" in export_text(id3)


def test_saved_model_predicts_a_csv_with_blank_cells_as_the_tree_does(tmp_path):
    import pandas as pd

    from treeflare.prediction import predict_csv

    X, y = _data_with_missing(4)
    clf = DecisionTreeClassifier(max_depth=4, random_state=0).fit(X, y)
    names = ["u", "v", "w", "z"]
    schema = {"version": 1, "features": [{"name": n, "kind": "numeric"} for n in names], "label": "y",
              "classes": ["a", "b", "c"], "id_column": None}
    model = GlobalTree(tree_from_sklearn(clf, n_classes=3), ["a", "b", "c"], names, data_schema=schema,
                       encoding="cart")
    model.save_json(tmp_path / "global_tree.json")
    plot_tree(model, tmp_path / "tree.png")  # the missing-only child is drawn like any other
    assert (tmp_path / "tree.png").read_bytes()[:4] == b"\x89PNG"
    frame = pd.DataFrame(X[:60], columns=names).astype(object).where(~np.isnan(X[:60]), "")
    frame.to_csv(tmp_path / "new.csv", index=False)
    predict_csv(tmp_path / "global_tree.json", tmp_path / "new.csv", tmp_path / "out.csv", explain=True)
    out = pd.read_csv(tmp_path / "out.csv", dtype=str, keep_default_na=False)
    assert list(out["predicted"]) == [["a", "b", "c"][k] for k in clf.predict(X[:60])]
    assert out["explanation"].str.contains("v is missing").any()
