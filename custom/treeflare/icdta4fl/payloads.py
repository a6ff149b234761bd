"""Checks of what sites send the ICDTA4FL server. A payload that fails is dropped with a reason.

Payloads are plain dicts (see the controller for their shapes). Trees are checked by
``Tree.from_dict``; here we check the envelopes: sizes, finite scores in [0, 1], lengths.
"""

from __future__ import annotations

from ..trees.tree import Tree
from ..trees.validate import PayloadError, check_int, check_list, check_number

MAX_TREE_NODES = 20_000  # a depth-10 binary tree has 2,047 nodes; far beyond any sane local tree
MAX_TREE_DEPTH = 40


def check_score(value, field) -> float:
    v = check_number(value, field)
    if not 0.0 <= v <= 1.0:
        raise PayloadError(field, f"{v} is outside [0, 1]")
    return v


def check_train_reply(reply: dict, *, n_features: int, n_classes: int, feature_kinds: list[str]) -> dict:
    """{tree, n_train, n_test, local: {accuracy, macro_f1}} → the same, with a parsed Tree."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    tree = Tree.from_dict(reply.get("tree"), max_nodes=MAX_TREE_NODES, max_depth=MAX_TREE_DEPTH)
    if tree.n_features != n_features or list(tree.feature_kinds) != list(feature_kinds):
        raise PayloadError("tree.feature_kinds", "the tree was not built on the shared schema's features")
    if tree.n_classes != n_classes:
        raise PayloadError("tree.n_classes", f"{tree.n_classes} classes, the schema has {n_classes}")
    local = reply.get("local")
    if not isinstance(local, dict):
        raise PayloadError("local", "expected a dict of local metrics")
    return {
        "tree": tree,
        "n_train": check_int(reply.get("n_train"), "n_train", lo=1),
        "n_test": check_int(reply.get("n_test"), "n_test", lo=1),
        "local": {k: check_score(local.get(k), f"local.{k}") for k in ("accuracy", "macro_f1")},
    }


def check_scores_reply(reply: dict, n_trees: int) -> dict:
    """{accuracy: [n_trees floats], macro_f1: [n_trees floats]}."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    out = {}
    for key in ("accuracy", "macro_f1"):
        values = check_list(reply.get(key), key, length=n_trees)
        out[key] = [check_score(v, f"{key}[{i}]") for i, v in enumerate(values)]
    return out


def check_global_reply(reply: dict) -> dict:
    """{accuracy, macro_f1, n_test} of the global tree on a site's local test set."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    return {"accuracy": check_score(reply.get("accuracy"), "accuracy"),
            "macro_f1": check_score(reply.get("macro_f1"), "macro_f1"),
            "n_test": check_int(reply.get("n_test"), "n_test", lo=1)}
