"""Checks of what sites send the ICDTA4FL server. A payload that fails is dropped with a reason.

Payloads are plain dicts (see the controller for their shapes). Trees are checked by
``Tree.from_dict``; here we check the envelopes: sizes, finite scores in [0, 1], lengths; and what a site may
contribute: its declared training rows are the rows its local tree showed, and a refinement round's summed
counts hold exactly the declared rows (``check_summed_rows``).
"""

from __future__ import annotations

import numpy as np

from ..crypto import secagg
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
    n_train = check_int(reply.get("n_train"), "n_train", lo=1, hi=MAX_SITE_ROWS)
    # the rows a site may later contribute to the refinement's sums: exactly those its tree was grown on
    root_rows = float(tree.counts[0].sum())  # a float sum of the learner's counts: equal up to rounding
    if abs(root_rows - n_train) > 1e-6 * n_train:
        raise PayloadError("n_train", f"{n_train} declared rows, but the site's tree holds {root_rows:g} at its root")
    # ...and no node holds more rows than its parent (a leaf's mass is its weight in the merge): children add up to
    # at most their parent's counts, class by class (ID3's rows that stop at a node count there alone)
    for v in range(tree.n_nodes):
        kids = tree.children[v]
        if kids is not None:
            below = tree.counts[kids].sum(axis=0)
            if np.any(below > tree.counts[v] * (1 + 1e-9) + 1e-9):
                raise PayloadError("tree", f"node {v}'s children hold more rows of some class than the node itself")
    return {
        "tree": tree,
        "n_train": n_train,
        "n_test": check_int(reply.get("n_test"), "n_test", lo=1, hi=MAX_SITE_ROWS),
        "local": {k: check_score(local.get(k), f"local.{k}") for k in ("accuracy", "macro_f1")},
    }


def check_key_reply(record, site: str):
    """The refinement key ``site`` announced with its training reply (None if it sent none): its shape only; the
    certificate and signature are checked by every site against its own root CA (``secagg.verify_key_list``)."""
    if record is None:
        return None
    try:
        secagg.check_key_record(record, site)
    except secagg.SecAggError as exc:
        raise PayloadError("refine_key", str(exc)) from None
    return record


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


def check_counts_reply(reply: dict, *, n_values: int, round_no: int) -> dict:
    """{masked: uint64 array of exactly n_values, round, mask_s, keys_checked: "certificates"|"none"}."""
    if not isinstance(reply, dict):
        raise PayloadError("reply", f"expected a dict, got {type(reply).__name__}")
    if check_int(reply.get("round"), "round") != round_no:
        raise PayloadError("round", f"expected {round_no}")
    masked = reply.get("masked")
    if not isinstance(masked, np.ndarray) or masked.dtype != np.uint64 or masked.shape != (n_values,):
        raise PayloadError("masked", f"expected a uint64 array of {n_values} values")
    checked = reply.get("keys_checked")
    if checked not in ("certificates", "none"):
        raise PayloadError("keys_checked", "expected 'certificates' or 'none'")
    return {"masked": masked, "keys_checked": checked,
            "mask_s": check_number(reply.get("mask_s"), "mask_s", nonnegative=True)}


def feature_totals(values, plan, candidates) -> np.ndarray:
    """Per feature, the rows a count vector (``refine.count_vector``) holds: each feature's cells of a split leaf
    add up to that leaf's rows, and every count-only leaf adds its class counts once."""
    values = np.asarray(values)
    C, cells, k = plan.n_classes, plan.n_cells, len(plan.split_leaves)
    per_cell = values[:k * cells * C].reshape(k, cells, C).sum(axis=(0, 2))
    offsets = candidates.offsets
    rest = values[k * cells * C:plan.n_values].sum()
    if candidates.n_features == 0:
        return np.array([rest])
    return np.array([per_cell[offsets[j]:offsets[j + 1]].sum() for j in range(candidates.n_features)]) + rest


def histograms_agree(values: np.ndarray, plan, candidates) -> bool:
    """Without noise, every feature's histogram of a leaf adds up to the same class counts (``feature_totals``
    checks the rows, this the classes)."""
    if not plan.split_leaves:
        return bool(np.all(values >= 0))
    C, cells = plan.n_classes, plan.n_cells
    hists = values[:len(plan.split_leaves) * cells * C].reshape(len(plan.split_leaves), cells, C)
    offsets = candidates.offsets
    totals = np.stack([hists[:, offsets[j]:offsets[j + 1]].sum(axis=1) for j in range(candidates.n_features)])
    return bool(np.all(values >= 0) and np.all(totals == totals[0]))


def check_summed_rows(values, plan, candidates, *, declared_rows: int, per_value_noise: float = 0.0) -> None:
    """A round's sum holds the declared rows, no more and no fewer, and every value of it is in range.

    Per feature, the rows in the vector plus the last value (rows that stop at an internal node, counted nowhere)
    equal ``declared_rows``, the sum of the sites' checked ``n_train`` (exactly; with noise, within the noise of every
    value in a feature's total). Every value is a count, so none is below 0, and the last is at most the declared
    rows (with noise: within ``per_value_noise``, the most noise the sites together add to one value). A site can
    only be checked through the sum (its own vector is masked): what one site can still do is bounded by the adopt
    check (``refine.adopt_refined``), see SECURITY.md."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (plan.n_values + 1,):
        raise PayloadError("sum", f"expected {plan.n_values + 1} values, got {values.shape}")
    low = int(np.argmin(values))
    if values[low] < -per_value_noise:
        raise PayloadError("sum", f"value {low} is {values[low]:g}, below 0 (allowed noise {per_value_noise:g}): a "
                                  "site sent negative counts")
    if values[-1] > declared_rows + per_value_noise:
        raise PayloadError("sum", f"{values[-1]:g} rows stop at internal nodes, more than the {declared_rows} "
                                  "declared by the sites")
    widest = max([candidates.n_cells(j) for j in range(candidates.n_features)] or [0])
    tolerance = per_value_noise * ((len(plan.split_leaves) * widest + len(plan.count_leaves)) * plan.n_classes + 1)
    rows = feature_totals(values[:-1], plan, candidates) + values[-1]
    worst = float(np.max(np.abs(rows - declared_rows)))
    if worst > tolerance:
        raise PayloadError("sum", f"holds {float(rows[int(np.argmax(np.abs(rows - declared_rows)))]):g} rows on some "
                                  f"feature against {declared_rows} declared by the sites (allowed deviation "
                                  f"{tolerance:g}): a site sent counts its training rows cannot give")
