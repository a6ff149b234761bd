"""The peer-score filter: thresholds, ties, the 0.989 relaxation and the never-empty fallback."""

import numpy as np
import pytest

from treeflare.icdta4fl import select_trees
from treeflare.icdta4fl.selection import select_trees as select_with_keys


def test_percentile_thresholds_keep_trees_reaching_both():
    acc = [[0.70, 0.80, 0.90, 0.85], [0.72, 0.82, 0.88, 0.95]]
    f1 = [[0.60, 0.70, 0.50, 0.80], [0.62, 0.72, 0.52, 0.84]]
    selected, report = select_trees(acc, f1, statistic="percentile", q=50)
    mean_acc = np.mean(acc, axis=0)
    assert report["accuracy"] == pytest.approx(np.percentile(mean_acc, 50))
    assert selected == [3]  # tree 2 has the accuracy but not the F1
    assert report["how"] == "thresholds"
    assert select_trees(acc, f1, statistic="mean")[0] == [3]
    assert select_trees(acc, f1, statistic="percentile", q=0)[0] == [0, 1, 2, 3]


def test_ties_at_the_threshold_are_broken_deterministically():
    acc = [[0.8, 0.8, 0.7, 0.8]]
    f1 = [[0.6, 0.6, 0.5, 0.6]]
    # q=75 of 4 trees means the best one: three tie, the lowest index wins without keys
    selected, report = select_trees(acc, f1, statistic="percentile", q=75)
    assert selected == [0] and "1 of 3 kept" in report["how"]
    assert select_trees(acc, f1, statistic="percentile", q=50)[0] == [0, 1]
    # with content keys the choice follows the trees, not their positions
    keys = ["c", "b", "z", "a"]
    assert select_with_keys(acc, f1, statistic="percentile", q=75, tie_keys=keys)[0] == [3]
    perm = [3, 2, 1, 0]
    permuted = select_with_keys([[acc[0][i] for i in perm]], [[f1[0][i] for i in perm]], statistic="percentile",
                            q=75, tie_keys=[keys[i] for i in perm])[0]
    assert [perm[i] for i in permuted] == [3]
    # a better F1 outranks the key; the mean statistic keeps ties
    assert select_with_keys([[0.8, 0.8]], [[0.6, 0.7]], statistic="percentile", q=75, tie_keys=["a", "b"])[0] == [1]
    assert select_trees(acc, f1, statistic="mean")[0] == [0, 1, 3]


def test_relaxation_then_best_tree_fallback_never_empty():
    # the best accuracy and the best F1 belong to different trees: nothing passes q=100
    acc = [[0.90, 0.80]]
    f1 = [[0.50, 0.60]]
    selected, report = select_trees(acc, f1, statistic="percentile", q=100)
    assert selected == [0] and report["how"] == "best_tree"
    # within 1.1% of both thresholds: the relaxed test lets tree 1 in
    acc = [[0.900, 0.895]]
    f1 = [[0.600, 0.605]]
    selected, report = select_trees(acc, f1, statistic="percentile", q=100)
    assert report["how"] == "relaxed" and selected == [0, 1]
    # full tie on accuracy and F1: lowest index
    selected, report = select_trees([[0.5, 0.9, 0.9]], [[0.9, 0.5, 0.5]], statistic="percentile", q=100)
    assert report["how"] == "best_tree" and selected == [1]


def test_missing_scores_are_ignored_and_report_is_json_safe():
    import json
    acc = [[0.9, None], [0.7, None]]
    f1 = [[0.8, None], [0.6, None]]
    selected, report = select_trees(acc, f1)
    assert selected == [0]
    json.dumps(report, allow_nan=False)
    with pytest.raises(ValueError):
        select_trees([[0.5]], [[0.5]], statistic="mode")
