"""Imbalanced classes: the global tree's size budget comes from every valid local tree, not only the selected ones
(one weak selected tree no longer caps the global tree at a handful of leaves), and the refinement's objective
can weigh classes (``balanced``), so an imbalanced set does not collapse to the majority class."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from sklearn.utils.class_weight import compute_class_weight

from icdta4fl_inprocess import InProcessRun
from treeflare.data import load_dataset, prepare_federation, write_federation
from treeflare.flare.icdta4fl.controller import ICDTA4FLController
from treeflare.flare.icdta4fl.inprocess import run_in_process
from treeflare.icdta4fl.server import DEFAULT_REFINE
from treeflare.icdta4fl.server import check_refine_params as _check_refine_params
from treeflare.flare.icdta4fl.protocol import SCORE_TREES
from treeflare.icdta4fl import aggregate, refine
from treeflare.trees.cart import fit_cart
from treeflare.trees.tree import leaf_tree


def _imbalanced(n, seed):
    """One feature; the minority class (1) is 10% of rows below 0.5 and 40% above: 25% overall, never a leaf's
    majority, so a tree that counts misclassified rows predicts class 0 everywhere."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, size=(n, 2))
    y = (rng.uniform(size=n) < np.where(X[:, 0] < 0.5, 0.10, 0.40)).astype(np.int64)
    return X, y


def test_one_weak_selected_tree_gets_a_budget_from_all_local_trees():
    X, y = _imbalanced(2000, 0)
    rng = np.random.default_rng(1)
    X = np.column_stack([X, rng.normal(size=(len(y), 3))])
    y = np.where(rng.uniform(size=len(y)) < 0.3, 1 - y, y)  # noise, so that deep trees have many leaves
    weak = fit_cart(X[:200], y[:200], n_classes=2, max_depth=1)
    strong = [fit_cart(X[i:i + 600], y[i:i + 600], n_classes=2, max_depth=5) for i in (200, 800, 1400)]
    trees = [weak, *strong]
    leaves = sorted(t.n_leaves for t in trees)
    assert weak.n_leaves == 2 and leaves[1] >= 8
    _, stats = aggregate(trees, [0], classes=["0", "1"], params={"max_leaves": "auto"})
    # the old budget was 2 x the selected tree's 2 leaves and its depth 1 + 2
    assert stats["max_leaves"] >= 2 * int(np.median(leaves)) > 4
    assert stats["max_depth"] >= int(np.median([t.depth for t in trees])) + 2 > 3
    # a malformed tree that is not selected is no site's evidence: skipped, not a crash
    bad = {**strong[0].to_dict(), "counts": [[float("nan"), 1.0]] * strong[0].n_nodes}
    _, stats_bad = aggregate([weak, bad, *strong[1:]], [0], classes=["0", "1"], params={"max_leaves": "auto"})
    assert stats_bad["max_leaves"] >= 4
    # an explicit budget still wins
    _, fixed = aggregate(trees, [0], classes=["0", "1"], params={"max_leaves": 3, "max_depth": 2})
    assert (fixed["max_leaves"], fixed["max_depth"]) == (3, 2)


def _round(objective, n_sites=3):
    """One refinement round from a single leaf, on three sites' imbalanced rows."""
    parts = [_imbalanced(1500, seed) for seed in range(n_sites)]
    local = fit_cart(*parts[0], n_classes=2, max_depth=3)
    start = leaf_tree(["numeric", "numeric"], np.bincount(parts[0][1], minlength=2).astype(float))
    cands = refine.candidates_from_trees([local], feature_kinds=["numeric", "numeric"], n_categories=[0, 0],
                                         bounds=None)
    plan = refine.plan_round(start, cands, 4)
    summed = np.sum([refine.count_vector(start, cands, plan, X, y) for X, y in parts], axis=0)
    tree, stats = refine.refine_tree(start, cands, plan, summed, max_leaves=8, max_depth=4, objective=objective)
    return tree, stats, np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def test_balanced_objective_predicts_the_minority_where_accuracy_collapses():
    flat, acc_stats, X, y = _round("accuracy")
    assert np.all(flat.predict(X) == 0)  # every leaf's majority is class 0: the tree says "majority" everywhere
    assert acc_stats["objective"] == "accuracy"
    tree, stats, X, y = _round("balanced")
    pred = tree.predict(X)
    upper = X[:, 0] >= 0.5
    assert stats["objective"] == "balanced" and tree.n_leaves >= 2
    assert np.mean(pred[upper] == 1) > 0.8 and np.mean(pred[~upper] == 0) > 0.8
    recall = np.mean(pred[y == 1] == 1)
    assert recall > 0.6
    # counts are class-weighted rows: the pooled classes weigh the same and the pooled rows keep their number
    root = tree.counts[0]
    assert root.sum() == pytest.approx(len(y)) and root[0] == pytest.approx(root[1])


def test_balanced_class_weights_are_scikit_learns():
    y = np.array([0] * 70 + [1] * 25 + [2] * 5)
    totals = np.bincount(y, minlength=4).astype(float)
    w = refine.balanced_class_weights(totals)
    assert np.allclose(w[:3], compute_class_weight("balanced", classes=np.arange(3), y=y))
    assert w[3] == 1.0  # an absent class: no rows to weigh
    assert np.allclose(refine.balanced_class_weights(np.zeros(2)), 1.0)


def test_objective_is_checked_and_reaches_every_round():
    with pytest.raises(ValueError, match="objective"):
        _round("macro_f1")
    assert DEFAULT_REFINE["objective"] == "accuracy" and _check_refine_params({})["objective"] == "accuracy"
    assert _check_refine_params({"objective": "balanced"})["objective"] == "balanced"
    with pytest.raises(ValueError, match="refinement objective must be one of"):
        _check_refine_params({"objective": "f1"})
    sites = []
    for seed in range(4):
        X, y = _imbalanced(800, seed)
        sites.append({"X_train": X[:600], "y_train": y[:600], "X_test": X[600:], "y_test": y[600:]})
    Xg, yg = _imbalanced(1000, 9)
    minority, first_round = {}, {}
    for objective in refine.OBJECTIVES:
        out = run_in_process(sites, algorithm="cart", classes=["0", "1"], local_params={"max_depth": 3},
                                      X_global_test=Xg, y_global_test=yg, refine_rounds=2, refine_from="one_round",
                                      refine_objective=objective)
        history, adoption = out["refined"]["history"], out["refined"]["adoption"]
        # the job's protocol: a round that is not adopted ends the rounds (the next would grow the same tree)
        assert 1 <= len(adoption) <= 2 and len(history) == sum(a["adopted"] for a in adoption)
        if objective == "auto":  # both trees grown each round; the record says which one was adopted
            assert adoption[0]["objective"] == "balanced" and adoption[0]["why"].startswith(
                "robust pooled change of validation accuracy + macro-F1: balanced ")
            assert [h["objective"] for h in history] == [a["objective"] for a in adoption if a["adopted"]]
        else:
            assert [h["objective"] for h in history] == [objective] * len(history)
        minority[objective] = np.mean(out["refined"]["tree"].predict(Xg) == 1)
        first_round[objective] = {m: history[0][m] for m in ("objective", "n_leaves", "depth", "accuracy", "macro_f1")}
    assert minority["balanced"] > minority["accuracy"] + 0.2
    # "auto" grows both trees from the same sum as the single objectives do, and adopts the balanced one first:
    # its first adopted round is the balanced run's tree (a later round may adopt the accuracy tree, which is no
    # worse in accuracy than the tree it replaces with any one site's scores left out, where the balanced tree is
    # not in macro-F1)
    assert first_round["auto"] == first_round["balanced"], first_round


def _scores(a, b):
    """Two sites' validation scores: (accuracy, macro-F1) each."""
    return {"a": {"accuracy": a[0], "macro_f1": a[1]}, "b": {"accuracy": b[0], "macro_f1": b[1]}}


def test_auto_adopts_the_tree_that_validates_best():
    prev, weights = _scores((0.80, 0.50), (0.80, 0.50)), {"a": 100, "b": 300}
    acc_tree, bal_tree = _scores((0.82, 0.52), (0.82, 0.52)), _scores((0.78, 0.70), (0.78, 0.60))
    won, why = refine.adopt_refined({"accuracy": acc_tree, "balanced": bal_tree}, prev, weights, "auto")
    assert won == "balanced" and why.startswith("robust pooled change of validation accuracy + macro-F1: balanced "
                                                "+0.1050, accuracy +0.0400; balanced tree adopted")
    # more macro-F1 but not as much as the accuracy it loses: accuracy
    more_f1 = _scores((0.70, 0.55), (0.70, 0.55))
    assert refine.adopt_refined({"accuracy": acc_tree, "balanced": more_f1}, prev, weights, "auto")[0] == "accuracy"
    # the accuracy tree validates better, or ties: accuracy
    won, why = refine.adopt_refined({"accuracy": _scores((0.82, 0.70), (0.82, 0.61)), "balanced": bal_tree}, prev,
                                    weights, "auto")
    assert won == "accuracy" and "accuracy tree adopted: pooled change of validation accuracy +0.0200" in why
    tie = {"accuracy": acc_tree, "balanced": acc_tree}
    assert refine.adopt_refined(tie, prev, weights, "auto")[0] == "accuracy"
    # the balanced tree leads in macro-F1 but is below the previous tree's: the accuracy tree, no worse in accuracy
    prev_f1 = _scores((0.80, 0.65), (0.80, 0.65))
    won, why = refine.adopt_refined({"accuracy": acc_tree, "balanced": bal_tree}, prev_f1, weights, "auto")
    assert won == "accuracy" and "balanced tree not adopted: pooled change of validation macro_f1 -0.0250" in why
    # both worse than the tree they replace: neither (as after one site's relabelled counts)
    won, why = refine.adopt_refined({"accuracy": _scores((0.7, 0.5), (0.7, 0.5)), "balanced": _scores((0.7, 0.4),
                                                                                                     (0.7, 0.4))},
                                    prev_f1, weights, "auto")
    assert won is None and why.count("not adopted") == 2
    # only the sites that scored every tree count
    won, why = refine.adopt_refined({"accuracy": acc_tree, "balanced": {"a": _scores((0.78, 0.7), (0, 0))["a"]}}, prev,
                                    weights, "auto")
    assert won == "balanced" and why.endswith("over 1 sites")
    with pytest.raises(ValueError, match="expects its own trees"):  # auto needs both trees' scores
        refine.adopt_refined({"accuracy": acc_tree}, prev, weights, "auto")


def test_job_script_takes_the_objective(tmp_path, capsys):


    job = importlib.import_module("treeflare.jobs.icdta4fl")
    base = ["--dataset", "car", "--workspace", str(tmp_path)]
    assert job.parse_args(base).refine_objective == "accuracy"
    assert job.parse_args([*base, "--refine-objective", "balanced"]).refine_objective == "balanced"
    assert job.parse_args([*base, "--refine-objective", "auto"]).refine_objective == "auto"
    with pytest.raises(SystemExit) as e:
        job.parse_args([*base, "--refine-objective", "f1"])
    assert e.value.code == 2 and "--refine-objective" in capsys.readouterr().err


def test_the_controller_grows_both_trees_and_scores_them_in_one_task(tmp_path):
    """``auto`` through the controller (in process): each round's two trees, grown from the one masked sum, go to
    every site in one scoring task; report.json's adoption names the objective adopted and the history its tree."""
    fed = prepare_federation(load_dataset("car"), n_sites=4, kind="label", alpha=0.5, seed=3)
    root = write_federation(fed, tmp_path / "data")
    run = InProcessRun(root, fed.site_names)
    controller = ICDTA4FLController(schema=fed.schema.to_dict(), algorithm="cart", local_params={"max_depth": 4},
                                    min_clients=2, server_test=str(root / "server" / "test.csv"),
                                    refine_params={"rounds": 2, "grow_from": "one_round", "objective": "auto"})
    result = run.run(controller, tmp_path / "run")
    assert result["status"] == "completed", result.get("error")
    info = result["refinement"]
    assert info["objective"] == "auto" and info["adoption"], info
    scoring = [m for d, s, n, m in run.messages if d == "to_site" and n == SCORE_TREES and s == "site-1"]
    assert [len(m["trees"]) for m in scoring[1:]] == [2] * len(info["adoption"])  # after the peer scoring
    for a, h in zip(info["adoption"], info["history"]):
        assert a["objective"] in refine.GROWN and a["why"].startswith("robust pooled change of validation accuracy + macro-F1: ") and h["objective"] == a["objective"]
