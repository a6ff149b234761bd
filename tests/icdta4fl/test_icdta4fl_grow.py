"""Growth from the root on summed histograms (``icdta4fl/grow.py``, ``--refine-from root``, issue 35): the public
lattice and the quantile thresholds, sums that are the union's, the tree at the centralized limit on training rows,
the budget on honest data with missing values, rare categories and skewed classes, and a deviating server's
questions refused by every site."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from sklearn.tree import DecisionTreeClassifier

from treeflare.flare.icdta4fl.inprocess import fobs_wire, run_in_process
from treeflare.icdta4fl import grow, refine
from treeflare.icdta4fl.refine_counts import RefinePlan, count_vector, plan_round
from treeflare.icdta4fl.server import check_refine_params
from treeflare.icdta4fl.tasks import REFINE_COUNTS
from treeflare.trees import LEAF, NUMERIC, Tree


# ----------------------------------------------------------------------------------------------- the pure core
def test_the_lattice_is_public_increasing_and_symmetric():
    grid = grow.lattice()
    assert np.all(np.diff(grid) > 0) and 0.0 in grid and np.allclose(grid, -grid[::-1])
    assert grid[-1] == pytest.approx(1e9) and grid[grid > 0][0] == pytest.approx(1e-3)
    # every integer up to a thousand in a cell of its own (ages, hours, counts), and beyond, cells 3.7% wide
    cells = np.searchsorted(grid, np.arange(-1000, 1001), side="left")
    assert len(np.unique(cells)) == 2001
    big = grid[grid > 1000]
    assert np.all(big[1:] / big[:-1] < 1.04)


def _pooled(sites, tree, candidates, plan):
    return sum(count_vector(tree, candidates, plan, X, y) for X, y in sites).astype(np.float64)


def _mixed_sites(seed, n_sites=3, n=300, rate=0.08):
    """Numeric columns with missing cells, a code column, skewed classes: honest data."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n_sites):
        x0 = rng.normal(s * 0.3, 1, n)
        x1 = rng.integers(0, 40, n).astype(float)
        x2 = rng.integers(0, 2, n).astype(float)  # a one-hot style indicator
        y = ((x0 + 0.05 * x1 + x2) > 1.2).astype(int)
        y[rng.random(n) < 0.05] = 2  # a rare third class
        X = np.column_stack([x0, x1, x2])
        X[rng.random(n) < rate, 0] = np.nan
        out.append((X, y))
    return out


def test_quantile_thresholds_are_lattice_points_that_separate_rows():
    sites = _mixed_sites(0)
    kinds, bounds = ["numeric"] * 3, [None, None, (0.0, 1.0)]
    grid = grow.grid_candidates(kinds, [None] * 3, bounds)
    root = grow.root_tree(kinds, 3, [None] * 3)
    plan = RefinePlan((0,), (), 3, int(grid.offsets[-1]))
    summed = _pooled(sites, root, grid, plan)
    cands = grow.quantile_candidates(grid, summed.reshape(-1, 3), k=15)
    X = np.vstack([X for X, _ in sites])
    for j in (0, 1):
        t = cands.thresholds[j]
        assert 0 < len(t) <= 15 and np.all(np.isin(t, grow.lattice()))
        values = X[:, j][~np.isnan(X[:, j])]
        for v in t:  # rows on both sides of every threshold
            assert (values <= v).any() and (values > v).any()
    assert np.array_equal(cands.thresholds[2], [0.5])  # a code column keeps its cells
    # column 1 has 40 integer values: with room for all, every boundary between them is a candidate
    wide = grow.quantile_candidates(grid, summed.reshape(-1, 3), k=63)
    assert len(wide.thresholds[1]) == len(np.unique(X[:, 1])) - 1


def test_a_round_on_the_sum_is_the_round_on_the_union():
    """Counts add up: the grid round and a growth round on the sites' summed vectors give the tree the union's rows
    give as one site (what the masked sum lets the server compute, nothing more is needed)."""
    sites = _mixed_sites(1)
    union = [(np.vstack([X for X, _ in sites]), np.concatenate([y for _, y in sites]))]
    kinds = ["numeric"] * 3
    grid = grow.grid_candidates(kinds, [None] * 3, [None, None, (0.0, 1.0)])
    root = grow.root_tree(kinds, 3, [None] * 3)
    plan = RefinePlan((0,), (), 3, int(grid.offsets[-1]))
    a, b = _pooled(sites, root, grid, plan), _pooled(union, root, grid, plan)
    assert np.array_equal(a, b)
    t1, _ = grow.grow_round(root, grid, plan, a, max_depth=4)
    cands = grow.quantile_candidates(grid, a.reshape(-1, 3))
    plan2 = grow.plan_growth(t1, cands, 4)
    t2a, _ = grow.grow_round(t1, cands, plan2, _pooled(sites, t1, cands, plan2), max_depth=4)
    t2b, _ = grow.grow_round(t1, cands, plan2, _pooled(union, t1, cands, plan2), max_depth=4)
    assert t2a.to_dict() == t2b.to_dict() and t2a.n_leaves > t1.n_leaves
    assert grow.extends(t2a, t1, cands) and grow.extends(t1, root, grid) and not grow.extends(t2a, root, grid)


def _grow_on(sites, kinds, bounds, n_classes, rounds, max_leaves):
    """The server's side of growth from the root, on sums taken directly (the protocol's own is tested below)."""
    grid = grow.grid_candidates(kinds, [None] * len(kinds), bounds)
    tree = grow.root_tree(kinds, n_classes, [None] * len(kinds))
    plan = RefinePlan((0,), (), n_classes, int(grid.offsets[-1]))
    summed = _pooled(sites, tree, grid, plan)
    cands = grow.quantile_candidates(grid, summed.reshape(-1, n_classes))
    tree, _ = grow.grow_round(tree, grid, plan, summed, max_depth=rounds, max_grown=4 * max_leaves)
    for _ in range(2, rounds):
        plan = grow.plan_growth(tree, cands, rounds)
        tree, _ = grow.grow_round(tree, cands, plan, _pooled(sites, tree, cands, plan), max_depth=rounds,
                                  max_grown=4 * max_leaves)
    plan = plan_round(tree, cands, rounds, max_values=grow.GROWTH_ROUND_VALUES)
    out, _ = refine.refine_tree(tree, cands, plan, _pooled(sites, tree, cands, plan), max_leaves=max_leaves,
                                max_depth=rounds, min_child_share=0.0)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_grown_tree_makes_no_more_training_errors_than_a_same_size_centralized_cart(seed):
    """The limit: on integer-valued columns every boundary between values is a candidate (as for scikit-learn), and
    the knapsack chooses among the subtrees of the level-wise Gini tree, which holds the best-first CART of that
    size: its training errors are at most that CART's on the pooled rows."""
    rng = np.random.default_rng(seed)
    sites = []
    for s in range(3):
        X = rng.integers(0, 30, size=(150, 4)).astype(float)
        y = (((X[:, 0] > 12) ^ (X[:, 1] > 20)) | (X[:, 2] + X[:, 3] > 45)).astype(int)
        y[rng.random(150) < 0.1] ^= 1
        sites.append((X, y))
    X = np.vstack([X for X, _ in sites])
    y = np.concatenate([y for _, y in sites])
    for leaves, depth in ((8, 5), (16, 6)):
        tree = _grow_on(sites, ["numeric"] * 4, [None] * 4, 2, depth, leaves)
        clf = DecisionTreeClassifier(max_leaf_nodes=leaves, max_depth=depth, random_state=0).fit(X, y)
        assert refine.n_outcomes(tree) <= leaves and tree.depth <= depth
        assert np.sum(tree.predict(X) != y) <= np.sum(clf.predict(X) != y), (leaves, depth)


def test_growth_is_the_default_and_needs_two_rounds():
    p = check_refine_params({})
    assert p["grow_from"] == "root" and p["rounds"] == grow.DEFAULT_ROUNDS["root"]
    assert check_refine_params({"grow_from": "one_round"})["rounds"] == 1
    with pytest.raises(ValueError, match="at least 2 refinement rounds"):
        check_refine_params({"rounds": 1})
    with pytest.raises(ValueError, match="grow_from must be one of"):
        check_refine_params({"grow_from": "leaves"})
    assert grow.grow_depth(8, "auto") == 8 and grow.grow_depth(8, 5) == 5


# ------------------------------------------------------------------------------------------- the job's protocol
def _federation(seed=3, n_sites=4, n=250):
    """Sites with missing cells, a rare category and skewed classes (ID3 reads the categorical column as codes)."""
    rng = np.random.default_rng(seed)
    sites = []
    for s in range(n_sites + 1):
        x0 = rng.normal(0, 1, n)
        x1 = rng.choice(5, n, p=[0.5, 0.3, 0.15, 0.04, 0.01]).astype(float)  # code 4 is rare
        x2 = rng.exponential(1000, n)
        y = ((x0 > 0.3) & (x1 < 2) | (x2 > 2500)).astype(int)
        if s % 2:
            y[rng.random(n) < 0.1] = 1  # label skew
        X = np.column_stack([x0, x1, x2])
        X[rng.random(n) < 0.1, 0] = np.nan
        X[rng.random(n) < 0.05, 2] = np.nan
        cut = int(0.8 * n)
        sites.append({"X_train": X[:cut], "y_train": y[:cut], "X_test": X[cut:], "y_test": y[cut:]})
    return sites[:-1], sites[-1]


@pytest.mark.parametrize("algorithm", ["cart", "id3"])
def test_the_job_grows_from_the_root_within_budget_and_drops_no_honest_site(algorithm):
    sites, test = _federation()
    kinds = ["numeric", "categorical", "numeric"] if algorithm == "id3" else ["numeric"] * 3
    out = run_in_process(sites, algorithm=algorithm, classes=["no", "yes"], feature_kinds=kinds,
                         n_categories=[None, 5, None] if algorithm == "id3" else None, q=0,
                         local_params={"max_depth": 3}, aggregate_params={"max_leaves": 8},
                         X_global_test=test["X_test"], y_global_test=test["y_test"], refine_rounds=None)
    info = out["result"]["refinement"]
    assert out["result"]["dropped_sites"] == {} and info["status"] == "completed", info
    assert info["grow_from"] == "root" and info["max_depth"] == grow.DEFAULT_ROUNDS["root"]
    assert [e["round"] for e in info["rounds"]] == list(range(1, 9)) and info["cost"]["rounds"] == 8
    assert info["cost"]["bytes_per_site"] == sum(8 * e["n_values"] for e in info["rounds"])
    tree = out["refined"]["tree"]
    assert refine.n_outcomes(tree) <= 8 and tree.depth <= 8
    if info["rounds_done"]:  # adopted: scores at least the start's on the sites' validation rows
        assert info["adoption"][-1]["adopted"] and out["result"]["global"]["accuracy"] >= 0.8
    # every row the sites counted is in every round's sum (none lost at a node)
    n_train = sum(len(s["y_train"]) for s in sites)
    assert all(e["rows"] == n_train for e in info["rounds"]), [e["rows"] for e in info["rounds"]]
    assert not np.isnan(tree.predict_proba(np.full((1, 3), np.nan))).any()


def _tampered_run(round_no, change, max_leaves=8, wire=None):
    """The job's protocol in process, with the server's REFINE_COUNTS task of ``round_no`` changed by ``change`` (the
    same change for every site: a deviating server, consistent across sites so that the masks would cancel)."""
    sites, test = _federation(seed=5)
    record = []

    def tamper(message):
        message = fobs_wire(message)
        if isinstance(message, dict) and "plan" in message and message.get("round") == round_no:
            message = copy.deepcopy(message)
            change(message)
        return message

    out = run_in_process(sites, algorithm="cart", classes=["no", "yes"], q=0, local_params={"max_depth": 3},
                         aggregate_params={"max_leaves": max_leaves}, X_global_test=test["X_test"],
                         y_global_test=test["y_test"], refine_rounds=None, wire=wire or tamper, record=record)
    errors = [m if isinstance(m, str) else str(m.get("error", m)) for d, s, t, m in record
              if d == "to_server" and t == REFINE_COUNTS and not (isinstance(m, dict) and "masked" in m)]
    return out["result"], errors


def _split_root(message):
    tree = Tree.from_dict(message["tree"])
    two = Tree(tree.feature_kinds, tree.n_classes, [NUMERIC, LEAF, LEAF], [0, -1, -1], [np.array([0.0]), None, None],
               [np.array([1, 2]), None, None], np.zeros((3, tree.n_classes)), tree.n_categories)
    message["tree"] = two.to_dict()
    message["plan"] = {"split_leaves": [1, 2], "count_leaves": []}


def _own_thresholds(message):
    message["candidates"]["thresholds"][0] = [-0.0123, 0.0123]  # cut around a few rows: no lattice points


def _off_candidates(message):
    tree = Tree.from_dict(message["tree"])
    leaf = int(np.flatnonzero(tree.kind == LEAF)[0])
    d = tree.to_dict()
    # a leaf split on a point of no round's candidates
    nodes = d["nodes"]
    nodes[leaf] = {**nodes[leaf], "kind": "numeric", "feature": 0, "thresholds": [0.0123], "missing": 0,
                   "children": [len(nodes), len(nodes) + 1]}
    nodes += [{"kind": "leaf", "counts": [0.0, 0.0]}, {"kind": "leaf", "counts": [0.0, 0.0]}]
    message["tree"] = d
    leaves = [int(v) for v in np.flatnonzero(Tree.from_dict(d).kind == LEAF)]
    message["plan"] = {"split_leaves": [], "count_leaves": leaves}


def _moved_candidates(message):
    t = message["candidates"]["thresholds"][0]
    message["candidates"]["thresholds"][0] = [float(v) for v in grow.lattice()[::97]][:len(t) or 1]


class _DoublingServer:
    """A wire that keeps each round's counts task and, in ``round_no``, sends the tree counted in the round before with
    every leaf split once on that round's candidates: a tree ``grow.extends`` accepts, with more leaves than growth
    allows."""

    def __init__(self, round_no):
        self.round_no, self.before, self.made = round_no, {}, None

    def __call__(self, message):
        message = fobs_wire(message)
        if not (isinstance(message, dict) and "plan" in message):
            return message
        if message["round"] != self.round_no:
            self.before[message["round"]] = message
            return message
        prev = self.before[self.round_no - 1]
        tree = Tree.from_dict(prev["tree"])
        cands = refine.SplitCandidates.from_dict(prev["candidates"], feature_kinds=tree.feature_kinds,
                                                 max_thresholds=len(grow.lattice()))
        d = tree.to_dict()
        nodes = d["nodes"]
        t = float(cands.thresholds[0][len(cands.thresholds[0]) // 2])
        for v in [i for i, n in enumerate(nodes) if n["kind"] == "leaf"]:
            nodes[v] = {**nodes[v], "kind": "numeric", "feature": 0, "thresholds": [t], "missing": 0,
                        "children": [len(nodes), len(nodes) + 1]}
            nodes += [{"kind": "leaf", "counts": [0.0, 0.0]}, {"kind": "leaf", "counts": [0.0, 0.0]}]
        self.made = (Tree.from_dict(d), tree, cands)
        message = copy.deepcopy(message)
        message["tree"] = d
        message["plan"] = {"split_leaves": [], "count_leaves": [int(v) for v in
                                                                np.flatnonzero(self.made[0].kind == LEAF)]}
        return message


def test_a_server_asking_for_more_leaves_than_growth_allows_gets_nothing():
    """Budget 2: the sites count on trees of at most 4 x 2 leaves (``grow.GROWN_LEAVES_FACTOR``), whoever asks, even
    for a tree that extends the last one as growth does."""
    sites, test = _federation(seed=5)
    wire, record = _DoublingServer(round_no=6), []
    out = run_in_process(sites, algorithm="cart", classes=["no", "yes"], q=0, local_params={"max_depth": 3},
                         aggregate_params={"max_leaves": 2}, X_global_test=test["X_test"],
                         y_global_test=test["y_test"], refine_rounds=None, wire=wire, record=record)
    made, before, cands = wire.made
    assert grow.extends(made, before, cands) and made.n_leaves > 8  # the question is a growth step, too large
    errors = [str(m) for d, s, t, m in record if d == "to_server" and t == REFINE_COUNTS
              and not (isinstance(m, dict) and "masked" in m)]
    assert len(errors) == 4 and all("over 4 x the 2 announced" in e for e in errors), errors
    assert out["result"]["refinement"]["rounds_done"] == 0


def test_extends_takes_only_the_splits_growth_makes():
    """One level, binary, on the candidates: a split into many codes, a column split again below itself, three
    children, two levels at once or a threshold off the candidates are refused."""
    kinds = ["numeric", "categorical"]
    cands = refine.SplitCandidates((np.array([0.5, 1.5]), None), (None, 6))
    leaf = lambda: {"kind": "leaf", "counts": [1.0, 1.0]}  # noqa: E731
    base = Tree.from_dict({"schema": "treeflare.tree", "version": 2, "n_features": 2, "n_classes": 2,
                           "feature_kinds": kinds, "n_categories": [None, 6],
                           "nodes": [{"kind": "categorical", "feature": 1, "values": [2], "children": [1],
                                      "counts": [2.0, 2.0]}, leaf()]})

    def grown(node):
        d = base.to_dict()
        d["nodes"][1] = {**node, "counts": [1.0, 1.0], "children": [2 + i for i in range(len(node["children"]))]}
        d["nodes"] += [leaf() for _ in node["children"]]
        return Tree.from_dict(d)

    assert grow.extends(grown({"kind": "numeric", "feature": 0, "thresholds": [0.5], "children": [0, 0]}), base, cands)
    refused = {
        "off candidates": {"kind": "numeric", "feature": 0, "thresholds": [0.7], "children": [0, 0]},
        "three children": {"kind": "numeric", "feature": 0, "thresholds": [0.5, 1.5], "children": [0, 0, 0]},
        "many codes": {"kind": "categorical", "feature": 1, "values": [0, 1, 3], "children": [0, 0, 0]},
        "column used above": {"kind": "categorical", "feature": 1, "values": [2], "children": [0]},
    }
    for why, node in refused.items():
        assert not grow.extends(grown(node), base, cands), why
    assert grow.extends(base, grow.root_tree(kinds, 2, [None, 6]), cands)  # one code against the rest: one level
    two = grown({"kind": "numeric", "feature": 0, "thresholds": [0.5], "children": [0, 0]})
    assert not grow.extends(two, grow.root_tree(kinds, 2, [None, 6]), cands)  # two levels at once


def test_growth_refuses_a_budget_it_cannot_bound_and_noise_it_would_drown_in():
    from treeflare.icdta4fl.server import ICDTA4FLServer
    from treeflare.icdta4fl.driver import schema_for_arrays

    schema = schema_for_arrays(classes=["a", "b"], feature_kinds=["numeric"])
    for budget in ("auto", None, grow.MAX_LEAF_BUDGET + 1):
        with pytest.raises(ValueError, match="needs a leaf budget of at most"):
            ICDTA4FLServer(schema, "cart", aggregation={"max_leaves": budget})
        ICDTA4FLServer(schema, "cart", aggregation={"max_leaves": budget}, refine_params={"grow_from": "one_round"})
    with pytest.raises(ValueError, match="does not take --refine-epsilon"):
        ICDTA4FLServer(schema, "cart", refine_params={"epsilon": 1.0})


def test_a_site_counts_on_no_growth_without_an_announced_budget():
    """A server that leaves the budget out of the training task (so that no bound holds) gets no growth counts."""
    def wire(message):
        message = fobs_wire(message)
        if isinstance(message, dict) and isinstance(message.get("refine"), dict):
            message = copy.deepcopy(message)
            message["refine"].pop("max_leaves", None)
        return message

    result, errors = _tampered_run(0, lambda m: None, wire=wire)
    assert result["refinement"]["status"].startswith("stopped at round 2"), result["refinement"]["status"]
    assert len(errors) == 4 and all("needs a leaf budget announced" in e for e in errors), errors


def test_no_leaf_a_site_sees_holds_fewer_than_five_rows_and_counting_trees_carry_no_counts():
    """Every split of growth leaves at least ``GROW_MIN_CHILD_ROWS`` pooled rows on each side; the trees the sites
    count on carry the splits only (a leaf's pooled counts, less a site's own, would be the others' rows there)."""
    sites, test = _federation(seed=11, n=120)
    rng = np.random.default_rng(0)
    for site in sites:  # noisy labels: greedy growth would cut leaves down to single rows
        flip = rng.random(len(site["y_train"])) < 0.3
        site["y_train"] = np.where(flip, 1 - site["y_train"], site["y_train"])
    record = []
    out = run_in_process(sites, algorithm="cart", classes=["no", "yes"], q=0, local_params={"max_depth": 3},
                         aggregate_params={"max_leaves": 32}, X_global_test=test["X_test"],
                         y_global_test=test["y_test"], refine_rounds=None, record=record)
    X = np.vstack([s["X_train"] for s in sites])
    counted = [Tree.from_dict(m["tree"]) for d, s, t, m in record if d == "to_site" and t == REFINE_COUNTS]
    assert counted and all(not t.counts.any() for t in counted)
    final = out["refined"]["tree"]
    for tree in counted[-1:] + ([final] if out["result"]["refinement"]["rounds_done"] else []):
        rows = np.bincount(tree.apply(X), minlength=tree.n_nodes)
        leaves = np.flatnonzero(tree.kind == LEAF)
        assert rows[leaves].min() >= 5, rows[leaves]  # the promise in SECURITY.md, not the constant


def test_growth_ends_early_when_nothing_is_left_to_split():
    sites, test = _federation(seed=3)
    out = run_in_process(sites, algorithm="cart", classes=["no", "yes"], q=0, local_params={"max_depth": 3},
                         aggregate_params={"max_leaves": 8, "max_depth": 2}, X_global_test=test["X_test"],
                         y_global_test=test["y_test"], refine_rounds=None)
    info = out["result"]["refinement"]
    # round 1 splits the root, round 2 the level below, round 3 (of 8) is the last: nothing above depth 2 is left
    assert [e["round"] for e in info["rounds"]] == [1, 2, 3] and info["cost"]["rounds"] == 3, info["rounds"]
    assert info["max_depth"] == 2 and out["refined"]["tree"].depth <= 2


def test_the_server_reads_only_the_sum_of_every_round():
    """Growth from the root, through the job's protocol: every masked vector differs from what that site counted, and
    the sum over the sites is the sum of their count vectors (the grid round's pooled histogram included)."""
    from treeflare.crypto import secagg
    from treeflare.icdta4fl.payloads import feature_totals

    sites, test = _federation(seed=7)
    record = []
    out = run_in_process(sites, algorithm="cart", classes=["no", "yes"], q=0, local_params={"max_depth": 3},
                         aggregate_params={"max_leaves": 8}, X_global_test=test["X_test"],
                         y_global_test=test["y_test"], refine_rounds=None, record=record)
    assert out["result"]["refinement"]["cost"]["rounds"] == 8  # adopted or not, every round was summed
    tasks = {m["round"]: m for d, s, t, m in record if d == "to_site" and t == REFINE_COUNTS and s == "site-1"}
    assert sorted(tasks) == list(range(1, 9))
    for r, task in tasks.items():
        tree = Tree.from_dict(task["tree"])
        cands = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=tree.feature_kinds,
                                                 max_thresholds=len(grow.lattice()))
        plan = refine.RefinePlan.from_dict(task["plan"], tree=tree, candidates=cands)
        own = []
        for site in sites:
            v = count_vector(tree, cands, plan, site["X_train"], site["y_train"])
            own.append(np.append(v, len(site["y_train"]) - feature_totals(v, plan, cands)[0]).astype(np.uint64))
        masked = [np.asarray(m["masked"], dtype=np.uint64) for d, s, t, m in record
                  if d == "to_server" and t == REFINE_COUNTS and m.get("round") == r]
        assert len(masked) == 4
        assert all(np.mean(m == o) < 0.05 for m, o in zip(masked, own))  # each alone looks random
        assert np.array_equal(secagg.sum_masked(masked), np.sum(own, axis=0, dtype=np.uint64))


@pytest.mark.parametrize("round_no, change, refusal", [
    (1, _split_root, "starts with a single leaf"),
    (1, _own_thresholds, "public lattice only"),
    (3, _off_candidates, "not the tree of the round before"),
    (3, _own_thresholds, "lattice points"),
    (4, _moved_candidates, "differ from the round before"),
], ids=["round1-tree", "round1-thresholds", "off-candidate-split", "own-thresholds", "moved-thresholds"])
def test_a_deviating_server_gets_no_counts_and_the_start_stays(round_no, change, refusal):
    result, errors = _tampered_run(round_no, change)
    info = result["refinement"]
    assert info["status"].startswith(f"stopped at round {round_no}: "), info["status"]
    assert info["rounds_done"] == 0 and len(errors) == 4 and all(refusal in e for e in errors), errors
    # each site refused, said why, and the job went on with the start tree (the one-round tree or best local tree)
    assert sorted(result["dropped_sites"]) == ["site-1", "site-2", "site-3", "site-4"]
    assert all(refusal in r for r in result["dropped_sites"].values()) and result["global"]["accuracy"] > 0.5


def test_the_command_refuses_what_growth_cannot_take_before_writing_anything(tmp_path):
    from treeflare.data import DataError
    from treeflare.jobs.icdta4fl import parse_args

    base = ["--dataset", "car", "--sites", "3", "--workspace", str(tmp_path / "ws")]
    with pytest.raises(DataError, match="--refine-rounds 1 cannot grow from the root"):
        parse_args(base + ["--refine-rounds", "1"])
    assert parse_args(base + ["--refine-rounds", "1", "--refine-from", "one_round"]).refine_rounds == 1
    assert parse_args(base).refine_rounds is None and parse_args(base).refine_from == "root"
    with pytest.raises(DataError, match="growth from the root takes at most 256 leaves"):
        parse_args(base + ["--max-leaves", "300"])
    with pytest.raises(DataError, match="growth from the root takes no noise"):
        parse_args(base + ["--refine-epsilon", "2"])
    for fine in (["--max-leaves", "300", "--refine-rounds", "0"], ["--refine-epsilon", "2", "--refine-from", "one_round"]):
        parse_args(base + fine)
    assert not (tmp_path / "ws").exists()
