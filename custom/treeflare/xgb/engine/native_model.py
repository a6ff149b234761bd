"""The engine's trees written as a native XGBoost ``model.json`` that every XGBoost from 2.0 to 3.4 loads.

The document follows XGBoost 2.0's JSON layout, the one every later version still reads (checked by running 2.0.3
to 3.2.0, ``scripts/check_xgb_versions.py``; 3.3 and 3.4 by reading their loaders). Where versions differ, what is
written is the spelling all of them read the same way:

- ``base_score`` is one number in XGBoost's own float text ("4E-1"). 3.1+ write a list ("[4E-1]") and broadcast a
  single number to every class; 2.x parse the text with a float32 reader that silently keeps 0.5 on a "[" or on a
  mantissa of more than 9 digits (so never ``repr`` of a double).
- ``version`` is [2, 0, 0], the layout written: XGBoost reads it only to warn about pre-1.6 files, and a later
  compatibility shim keyed on it would then treat the file as what it is.
- ``boost_from_average`` is "0": the base score is given, never to be re-estimated (XGBoost writes the same when a
  user sets ``base_score``).
- no ``cats`` block (3.1+ write an empty one, and read its absence as no categories; 2.x do not know it).
- ``size_leaf_vector`` "1" (what 2.0+ write; a single-target tree, as "0" in 1.x files).
- tree arrays are JSON numbers: the float ones always with a point or exponent (XGBoost's reader takes "0" for an
  integer and refuses it in a float array), each the exact value of a float32, so whatever parser reads it gets the
  same float32 back.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..model_file import ModelError, check_model, float32_text

OBJECTIVES = ("binary:logistic", "multi:softprob", "reg:squarederror")
LAYOUT_VERSION = [2, 0, 0]
ROOT_PARENT = 2147483647  # XGBoost's invalid node id, the root's parent
_INTS = ("left_children", "right_children", "split_indices", "default_left")
_FLOATS = ("split_conditions", "base_weights", "loss_changes", "sum_hessian")
_TREE_KEYS = frozenset((*_INTS, *_FLOATS, "parents"))
FEATURE_TYPES = ("q", "float", "int", "i")  # numeric splits only: no categorical ("c") features


def model_document(trees: list[dict], tree_info: list[int], *, n_features: int, objective: str, num_class: int,
                   base_score: float, feature_names: list[str] | None = None,
                   feature_types: list[str] | None = None, iteration_indptr: list[int] | None = None,
                   attributes: dict[str, str] | None = None) -> dict:
    """XGBoost's JSON model of ``trees`` (per-node arrays as XGBoost names them, node 0 the root; ``parents`` derived
    when omitted). ``tree_info[i]`` is tree i's output group (class); ``num_class`` is 0 for binary:logistic and
    reg:squarederror, K for multi:softprob; ``base_score`` is in XGBoost's user space (a probability for
    binary:logistic; a margin added to every class for multi:softprob); ``iteration_indptr`` the cumulative tree
    count per boosting round (default: one tree per output group per round). ValueError on anything XGBoost or
    ``model_file.check_model`` would refuse or misread."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "multi:softprob" and (type(num_class) is not int or num_class < 2):  # noqa: E721
        raise ValueError(f"multi:softprob needs num_class >= 2, got {num_class!r}")
    if objective != "multi:softprob" and num_class != 0:
        raise ValueError(f"num_class is 0 for {objective} (XGBoost's convention), got {num_class!r}")
    if type(n_features) is not int or n_features < 1:  # noqa: E721
        raise ValueError(f"n_features must be a positive int, got {n_features!r}")
    base = float(np.float32(base_score))
    if not np.isfinite(base) or objective == "binary:logistic" and not 0.0 < base < 1.0:
        raise ValueError(f"base_score {base_score!r} is not a {'probability' if objective[0] == 'b' else 'finite'} "
                         "float32")
    groups = max(num_class, 1)
    info = [int(g) for g in tree_info]
    if len(info) != len(trees):
        raise ValueError(f"{len(info)} tree_info entries for {len(trees)} trees")
    if iteration_indptr is None:
        if len(trees) % groups:
            raise ValueError(f"{len(trees)} trees are not whole rounds of {groups}; pass iteration_indptr")
        iteration_indptr = list(range(0, len(trees) + 1, groups))
    learner = {
        "attributes": dict(attributes or {}),
        "feature_names": list(feature_names or []),
        "feature_types": _types(feature_types),
        "gradient_booster": {"model": {
            "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(len(trees))},
            "iteration_indptr": [int(v) for v in iteration_indptr],
            "tree_info": info,
            "trees": [_tree(t, i, n_features) for i, t in enumerate(trees)],
        }, "name": "gbtree"},
        "learner_model_param": {"base_score": float32_text(base), "boost_from_average": "0",
                                "num_class": str(num_class), "num_feature": str(n_features), "num_target": "1"},
        "objective": {"name": objective, **(
            {"softmax_multiclass_param": {"num_class": str(num_class)}} if objective == "multi:softprob"
            else {"reg_loss_param": {"scale_pos_weight": "1"}})},
    }
    doc = {"learner": learner, "version": list(LAYOUT_VERSION)}
    try:  # the validator the predict path runs: what it refuses is never written (on a copy: it normalises)
        check_model(json.loads(model_bytes(doc)), "model_document")
    except ModelError as exc:
        raise ValueError(str(exc)) from None
    return doc


def model_bytes(doc: dict) -> bytes:
    """The document as JSON text (UTF-8); NaN or infinity is refused rather than written as XGBoost-only tokens."""
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def base_margin(doc: dict) -> np.float32:
    """The margin XGBoost starts every row from: logit(base_score) for binary:logistic (float32, as XGBoost's
    ``-logf(1/p - 1)``), base_score itself for reg:squarederror and for each class of multi:softprob."""
    learner = doc["learner"]
    base = np.float32(float(learner["learner_model_param"]["base_score"].strip("[]").split(",")[0]))
    if learner["objective"]["name"] == "binary:logistic":  # logf as libm's, not numpy's float32 log (1 ulp apart)
        return np.float32(-math.log(float(np.float32(np.float32(1.0) / base - np.float32(1.0)))))
    return base


def margins(doc: dict, X, *, start: np.float32 | float | None = None) -> np.ndarray:
    """A reference of XGBoost's ``predict(output_margin=True)`` (rows x output groups, float32): each row walks each
    tree (missing -> default direction, else ``x < condition`` goes left) and the leaves are added in tree order to
    ``start`` (default :func:`base_margin`) in float32, as XGBoost's CPU predictor adds them."""
    X = np.asarray(X, dtype=np.float32)
    model = doc["learner"]["gradient_booster"]["model"]
    groups = max(int(doc["learner"]["learner_model_param"]["num_class"]), 1)
    out = np.full((len(X), groups), base_margin(doc) if start is None else np.float32(start), dtype=np.float32)
    rows = np.arange(len(X))
    for tree, group in zip(model["trees"], model["tree_info"]):
        left, right = np.asarray(tree["left_children"]), np.asarray(tree["right_children"])
        feature, cond = np.asarray(tree["split_indices"]), np.asarray(tree["split_conditions"], dtype=np.float32)
        dleft = np.asarray(tree["default_left"]).astype(bool)
        node = np.zeros(len(X), dtype=np.int64)
        while True:
            inner = left[node] != -1
            if not inner.any():
                break
            x = X[rows, feature[node]]
            go_left = np.where(np.isnan(x), dleft[node], x < cond[node])
            node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        out[:, group] += cond[node]
    return out


def _types(types) -> list[str]:
    types = list(types or [])
    bad = [t for t in types if t not in FEATURE_TYPES]
    if bad:
        raise ValueError(f"feature type {bad[0]!r}: the engine writes numeric splits only {FEATURE_TYPES}")
    return types


def _tree(t: dict, i: int, n_features: int) -> dict:
    unknown = sorted(set(t) - _TREE_KEYS)
    if unknown:  # a misspelt array would otherwise be dropped and XGBoost told the tree has none
        raise ValueError(f"trees[{i}]: unknown key {unknown[0]!r}")
    a = {k: _int_array(t, k, i) for k in _INTS}
    n = len(a["left_children"])
    parents = _parents(a["left_children"], a["right_children"]) if t.get("parents") is None \
        else _int_array(t, "parents", i)
    f = {k: _float_array(t, k, i) for k in _FLOATS}
    for k, v in (*a.items(), *f.items(), ("parents", parents)):
        if len(v) != n:
            raise ValueError(f"trees[{i}].{k}: {len(v)} items for {n} nodes")
    if not set(a["default_left"].tolist()) <= {0, 1}:
        raise ValueError(f"trees[{i}].default_left: expected 0 or 1")
    return {
        "base_weights": f["base_weights"], "categories": [], "categories_nodes": [], "categories_segments": [],
        "categories_sizes": [], "default_left": a["default_left"].tolist(), "id": i,
        "left_children": a["left_children"].tolist(), "loss_changes": f["loss_changes"],
        "parents": parents.tolist(), "right_children": a["right_children"].tolist(),
        "split_conditions": f["split_conditions"], "split_indices": a["split_indices"].tolist(),
        "split_type": [0] * n, "sum_hessian": f["sum_hessian"],
        "tree_param": {"num_deleted": "0", "num_feature": str(n_features), "num_nodes": str(n),
                       "size_leaf_vector": "1"},
    }


def _int_array(t: dict, key: str, i: int) -> np.ndarray:
    if key not in t:
        raise ValueError(f"trees[{i}]: no {key!r}")
    v = np.asarray(t[key])
    if v.ndim != 1 or v.size and not (np.issubdtype(v.dtype, np.integer) or v.dtype == bool):
        raise ValueError(f"trees[{i}].{key}: expected a list of integers")
    return v.astype(np.int64)


def _float_array(t: dict, key: str, i: int) -> list[float]:
    if key not in t:
        raise ValueError(f"trees[{i}]: no {key!r}")
    v = np.asarray(t[key], dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"trees[{i}].{key}: expected a list of numbers")
    with np.errstate(over="ignore"):
        v32 = v.astype(np.float32)
    if not np.isfinite(v32).all():
        raise ValueError(f"trees[{i}].{key}: {v[~np.isfinite(v32)][0]} is not a finite float32")
    # the float32 value as a Python float: json writes its exact double repr, which any reader rounds back to it
    return v32.astype(np.float64).tolist()


def _parents(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    parents = np.full(len(left), ROOT_PARENT, dtype=np.int64)
    for side in (left, right):
        inner = np.flatnonzero((side >= 0) & (side < len(left)))
        parents[side[inner]] = inner
    if len(left):
        parents[0] = ROOT_PARENT  # a child index of 0 is refused by the validator, not hidden here
    return parents
