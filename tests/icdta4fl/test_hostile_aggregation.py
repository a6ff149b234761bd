"""Hostile trees that used to end the whole ICDTA4FL job, now checked against the
server's own schema, bounded before aggregation, and, if still unusable, dropping only their site."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from treeflare.data import load_dataset
from treeflare.icdta4fl import merge, pipeline
from treeflare.icdta4fl.encoding import HARD_MAX_TREE_NODES, encode, max_tree_nodes, tree_limits
from treeflare.icdta4fl.payloads import check_train_reply
from treeflare.icdta4fl.rules import count_rules, extract_rules
from treeflare.trees.tree import Tree
from treeflare.trees.validate import PayloadError


@pytest.fixture(scope="module")
def adult():
    """ID3 trees on a sample of adult (its categorical columns give categorical splits)."""
    table = load_dataset("adult")
    table = table.subset(np.random.default_rng(1).choice(len(table), 6000, replace=False))
    X, y = encode(table, "id3"), table.y_codes()
    limits = tree_limits(table.schema, "id3", max_depth=5)
    rng = np.random.default_rng(0)
    parts = np.array_split(rng.permutation(len(y)), 4)
    trees = [pipeline.train_local_tree(X[p], y[p], algorithm="id3", n_classes=len(table.schema.classes),
                                       feature_kinds=limits["feature_kinds"], n_categories=limits["n_categories"],
                                       params={"max_depth": 5}) for p in parts]
    return SimpleNamespace(schema=table.schema, X=X, y=y, limits=limits, trees=trees)


def reply(tree):
    # the declared rows are the tree's root count (the server checks it)
    return {"tree": tree, "n_train": round(sum(tree["nodes"][0]["counts"])), "n_test": 100,
            "local": {"accuracy": 0.9, "macro_f1": 0.8}}


def test_code_of_2_pow_63_without_declared_counts_is_refused_by_the_server_schema(adult):
    tree = json.loads(json.dumps(adult.trees[0]))
    tree["n_categories"] = None
    node = next(n for n in tree["nodes"] if n["kind"] == "categorical")
    node["values"][-1] = 2 ** 63
    with pytest.raises(PayloadError, match=r"values\[\d+\]: 9223372036854775808 is above \d"):
        check_train_reply(reply(tree), limits=adult.limits)


def test_declared_category_counts_are_ignored_and_rules_stay_bounded(adult):
    honest = check_train_reply(reply(adult.trees[0]), limits=adult.limits)["tree"]
    tree = json.loads(json.dumps(adult.trees[0]))
    tree["n_categories"] = [10_000] * len(tree["n_categories"])
    checked = check_train_reply(reply(tree), limits=adult.limits)["tree"]
    assert checked.n_categories == adult.limits["n_categories"]  # the server's counts, not the payload's
    assert count_rules(checked) == count_rules(honest) == extract_rules(checked).n_rules < 3000
    # what the declaration alone would have cost without the server's schema
    assert count_rules(Tree.from_dict(tree)) > 50 * count_rules(honest)


def test_a_tree_yielding_too_many_rules_is_refused_before_extraction(adult, monkeypatch):
    from treeflare.icdta4fl import payloads
    monkeypatch.setattr(payloads, "MAX_RULE_CELLS", 10)
    with pytest.raises(PayloadError, match="rule cells"):
        check_train_reply(reply(adult.trees[0]), limits=adult.limits)


def test_threshold_outside_the_schema_range_is_refused():
    table = load_dataset("car")
    limits = tree_limits(table.schema, "cart", max_depth=5)
    X, y = encode(table, "cart"), table.y_codes()
    tree = pipeline.train_local_tree(X, y, algorithm="cart", n_classes=len(table.schema.classes), params={"max_depth": 3})
    check_train_reply(reply(tree), limits=limits)
    tree["nodes"][0]["thresholds"] = [1e6]  # every car column is an ordinal code or a 0/1 indicator
    with pytest.raises(PayloadError, match="outside the range"):
        check_train_reply(reply(tree), limits=limits)


def test_an_unusable_tree_drops_its_site_and_the_others_aggregate(adult, monkeypatch):
    from treeflare.icdta4fl.server import ICDTA4FLServer

    server = ICDTA4FLServer(adult.schema, "id3", min_clients=2)  # the protocol the controller and driver both run
    trees = [check_train_reply(reply(t), limits=adult.limits)["tree"] for t in adult.trees]
    sites = ["site-1", "site-2", "site-3", "site-4"]
    rule_counts = [count_rules(t) for t in trees]
    # merging the largest tree is made to exceed the pair bound
    big = int(np.argmax(rule_counts))
    real = merge.compatible_pairs

    def pairs(a, b, eps=0.0, max_pairs=None):
        if b.n_rules == extract_rules(trees[big]).n_rules:
            raise OverflowError("more than 0 compatible rule pairs")
        return real(a, b, eps, max_pairs)

    monkeypatch.setattr(merge, "compatible_pairs", pairs)
    result = {"dropped_sites": {}}
    model, stats = server._aggregate(result, trees, [0, 1, 2, 3], sites)
    assert list(result["dropped_sites"]) == [sites[big]]
    assert "too large" in result["dropped_sites"][sites[big]]
    assert big not in stats["selected"] and len(stats["selected"]) == 3
    assert model.score(adult.X, adult.y) > 0.7


def test_a_bad_budget_is_refused_before_any_task(adult):
    from treeflare.flare.icdta4fl.controller import ICDTA4FLController

    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="max_leaves"):
            ICDTA4FLController(schema=adult.schema.to_dict(), aggregation={"max_leaves": bad})
    with pytest.raises(ValueError, match="criterion"):
        ICDTA4FLController(schema=adult.schema.to_dict(), aggregation={"criterion": "foo"})


class _Workspace:
    def __init__(self, path):
        self.path = path

    def get_run_dir(self, job_id):
        return str(self.path)


def _run_workflow(tmp_path, error):
    from treeflare.flare.workflow import ResultWorkflow

    class Broken(ResultWorkflow):
        JOB, RESULT_FILE = "broken", "broken_result.json"

        def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
            result["step"] = "aggregation"
            raise error

    wf = Broken()
    panics = []
    wf.log_error = lambda *a, **k: None
    wf.system_panic = lambda reason, fl_ctx: panics.append(reason)
    engine = SimpleNamespace(get_workspace=lambda: _Workspace(tmp_path))
    fl_ctx = SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job")
    wf.control_flow(None, fl_ctx)
    return json.loads((tmp_path / "broken_result.json").read_text()), panics


def test_any_exception_after_the_replies_ends_the_job_as_failed_with_the_real_error(tmp_path):
    result, panics = _run_workflow(tmp_path, OverflowError("Python int too large to convert to C long"))
    assert result["status"] == "failed"
    assert result["error"] == "OverflowError: Python int too large to convert to C long"
    assert panics == [result["error"]]


def test_a_result_left_running_is_reported_as_failed_never_none(tmp_path, capsys):
    from treeflare.flare.runner import read_server_result

    (tmp_path / "r.json").write_text(json.dumps({"job": "icdta4fl", "status": "running", "timings_s": {}}))
    assert read_server_result(tmp_path, "r.json", tmp_path, "icdta4fl") is None
    err = capsys.readouterr().err
    assert "None" not in err and "status 'running'" in err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed" and "running" in report["error"]


def test_node_limit_follows_depth_and_schema():
    table = load_dataset("car")
    assert max_tree_nodes(table.schema, "cart", 5) == 63
    # honest ID3 trees at depth 7 reach ~24,000 nodes on 600k rows; the old fixed cap was 20,000
    adult = load_dataset("adult")
    assert max_tree_nodes(adult.schema, "id3", 7) == HARD_MAX_TREE_NODES > 24_000
    assert max_tree_nodes(adult.schema, "id3", 1) > 2


def test_a_site_claiming_2_pow_62_rows_is_refused_not_the_round(adult):
    """Row counts size every site's refinement slots: an absurd claim drops its sender at training time."""
    from treeflare.icdta4fl.payloads import MAX_SITE_ROWS

    for field in ("n_train", "n_test"):
        bad = {**reply(adult.trees[0]), field: 2 ** 62}
        with pytest.raises(PayloadError, match=rf"{field}: {2 ** 62} is above {MAX_SITE_ROWS}"):
            check_train_reply(bad, limits=adult.limits)
