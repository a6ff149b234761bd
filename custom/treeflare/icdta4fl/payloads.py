"""Checks of what sites send the ICDTA4FL server. A payload that fails is dropped with a reason.

Payloads are plain dicts (see the controller for their shapes). Trees are checked by
``Tree.from_dict``; here we check the envelopes: sizes, finite scores in [0, 1], lengths.
"""

from __future__ import annotations

import numpy as np

from ..crypto import secure_sum
from ..trees.tree import Tree
from ..trees.validate import PayloadError, check_int, check_list, check_number
from .rules import MAX_RULE_CELLS, count_rules

MAX_TREE_DEPTH = 40
# A site's row counts size the refinement round's count slots for every site: a site claiming 2^62 rows would
# push them past 64 bits, and every honest site would refuse the round. 2^32 rows per site is far beyond any
# table a site trains on here.
MAX_SITE_ROWS = 2 ** 32


def check_score(value, field) -> float:
    v = check_number(value, field)
    if not 0.0 <= v <= 1.0:
        raise PayloadError(field, f"{v} is outside [0, 1]")
    return v


def check_train_reply(reply: dict, *, limits: dict) -> dict:
    """{tree, n_train, n_test, local: {accuracy, macro_f1}} → the same, with a parsed Tree.

    ``limits`` come from the server's own schema (``encoding.tree_limits``): feature kinds, category
    counts, threshold ranges, node and depth caps. The tree's own ``n_categories`` is ignored, and the
    rules it would yield are bounded before anyone extracts them.
    """
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    limits = {**limits, "max_depth": min(int(limits.get("max_depth", MAX_TREE_DEPTH)), MAX_TREE_DEPTH)}
    tree = Tree.from_dict(reply.get("tree"), **limits)
    n_rules = count_rules(tree)
    if n_rules * max(tree.n_features, 1) > MAX_RULE_CELLS:
        raise PayloadError("tree", f"would yield {n_rules} rules over {tree.n_features} features, "
                                   f"over the limit of {MAX_RULE_CELLS} rule cells")
    local = reply.get("local")
    if not isinstance(local, dict):
        raise PayloadError("local", "expected a dict of local metrics")
    return {
        "tree": tree,
        "n_train": check_int(reply.get("n_train"), "n_train", lo=1, hi=MAX_SITE_ROWS),
        "n_test": check_int(reply.get("n_test"), "n_test", lo=1, hi=MAX_SITE_ROWS),
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


def check_counts_reply(reply: dict, *, pk, n_ciphertexts: int, round_no: int) -> dict:
    """{ciphertexts: uint8 array of exactly n_ciphertexts valid Paillier ciphertexts, round, encrypt_s}; the
    ciphertexts come back parsed (a list), so the server reads each site's once."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    if check_int(reply.get("round"), "round") != round_no:
        raise PayloadError("round", f"expected {round_no}")
    cts = secure_sum.read_ciphertexts(pk, reply.get("ciphertexts"), n_ciphertexts)  # size, range, invertibility
    return {"ciphertexts": cts, "encrypt_s": check_number(reply.get("encrypt_s"), "encrypt_s", nonnegative=True)}


def check_sums_reply(reply: dict, *, n_values: int, slot_bits: int, round_no: int) -> dict:
    """{sums: int64 array of n_values slot values in [0, 2^slot_bits), round}."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    if check_int(reply.get("round"), "round") != round_no:
        raise PayloadError("round", f"expected {round_no}")
    sums = reply.get("sums")
    if not isinstance(sums, np.ndarray) or sums.dtype.kind not in "iu" or sums.shape != (n_values,):
        raise PayloadError("sums", f"expected an integer array of {n_values} values")
    if sums.size and (sums.min() < 0 or int(sums.max()) >= (1 << slot_bits)):
        raise PayloadError("sums", f"values outside [0, 2^{slot_bits})")
    return {"sums": sums.astype(np.int64)}
