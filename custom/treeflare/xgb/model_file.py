"""An XGBoost model file, read and checked here before XGBoost sees it.

XGBoost's loader and predictor trust a model's tree arrays: a child index out of range or pointing back up the
tree, a split on a feature the model does not have, a category segment past the end of its list, a class count
that disagrees with the objective's, all end the process with SIGSEGV inside libxgboost (at load or at the first
prediction) instead of an error. A model file is something people copy and receive, so ``treeflare predict``
reads it here first (JSON, or XGBoost's UBJSON decoded by a small bounded reader), checks every field XGBoost
indexes with, and hands XGBoost the checked document re-serialised as JSON, never the file's own bytes: no
difference between two parsers (a duplicate key, a number's spelling) can show XGBoost something other than what
was checked.

What is accepted is what the project's jobs write (XGBoost >= 2 JSON layout, ``gbtree``, single-target
classifiers, and squared-error regression from the engine's writer ``engine/native_model.py``, no deleted nodes, no
recorded DataFrame category encoding); anything else is refused with the field that is wrong, e.g.
``trees[0].left_children[0]: 0 is not a child of node 0 (expected -1 or 1..6)``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .ubjson import UBJSONError, decode_ubjson

OBJECTIVES = ("binary:logistic", "multi:softprob")  # the classifiers XGBModel predicts with
MODEL_OBJECTIVES = (*OBJECTIVES, "reg:squarederror")  # what a model file may hold
# Refused before it is read: checking holds several times the file in Python objects. XGBoost's JSON takes ~65 bytes
# a node, so this is 8 million nodes (1,000 rounds of 10 classes of 800-node trees; the jobs default to 50 rounds
# of depth-6 trees: a few MB).
MAX_FILE_BYTES = 512 << 20
_TOP_KEYS = ("learner", "version")  # all XGBoost writes at the top of a model (its JSON and UBJSON)
MAX_FEATURES = 1_000_000
MAX_CLASSES = 10_000
MAX_CATEGORY = 1 << 24  # XGBoost reads category codes as float32: larger ones are not exact
MAX_DEPTH = 64  # nesting of the document (an XGBoost model nests about 6 deep)
ROOT_PARENT = 2147483647  # XGBoost writes the root's parent as its invalid node id
FLOAT32_MAX = float(np.finfo(np.float32).max)
FEATURE_TYPES = ("q", "c", "int", "float", "i")
_INT_ARRAYS = ("left_children", "right_children", "parents", "split_indices", "default_left", "split_type")
_FLOAT_ARRAYS = ("split_conditions", "base_weights", "loss_changes", "sum_hessian")


class ModelError(ValueError):
    """A model file that cannot be used for predictions; the message says which file and why."""


class _Bad(Exception):
    """A field of the document is wrong: (field, reason); turned into a ModelError naming the file."""


def load_checked_booster(path):
    """An ``xgboost.Booster`` from a model file (JSON or UBJSON) after :func:`check_model`; ModelError otherwise."""
    import xgboost as xgb

    path = Path(path)
    doc = read_model_document(path)
    check_model(doc, str(path))
    if doc["learner"]["learner_model_param"]["base_score"].startswith("[") and _below_3_1(xgb.__version__):
        raise ModelError(f"{path}: per-class base scores (XGBoost >= 3.1's models) would be read as 0.5 by XGBoost "
                         f"{xgb.__version__}; predict with XGBoost >= 3.1")
    try:
        text = json.dumps(doc, allow_nan=False)
    except (ValueError, RecursionError) as exc:  # NaN or deep nesting in a field XGBoost does not read
        raise ModelError(f"{path}: not a usable model ({exc})") from None
    try:
        booster = xgb.Booster()
        booster.load_model(bytearray(text.encode()))
    except xgb.core.XGBoostError as exc:
        raise ModelError(f"{path}: not an XGBoost model XGBoost can load ({_first_line(exc)})") from None
    return booster


def _below_3_1(version: str) -> bool:
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in (version.split(".") + ["0"])[:2])
    return (major, minor) < (3, 1)


def _first_line(exc) -> str:
    import re

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return re.sub(r"\[\d\d:\d\d:\d\d\]\s*\S+:\d+:\s*", "", first)[:300]  # XGBoost's time and source file


# ---------------------------------------------------------------------------------------------- reading
def read_model_document(path) -> dict:
    """The model file as a dict: JSON text (UTF-8, a BOM allowed) or UBJSON (what ``save_model("*.ubj")`` writes)."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelError(f"{path}: file not found") from None
    if size > MAX_FILE_BYTES:
        raise ModelError(f"{path}: {size:,} bytes is larger than a model file may be ({MAX_FILE_BYTES:,} bytes, "
                         "512 MiB)")
    data = path.read_bytes()
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    stripped = body.lstrip()
    if stripped[:1] == b"{" and stripped[1:2] in (b'"', b"}", b" ", b"\n", b"\r", b"\t"):
        try:
            doc = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
        except UnicodeDecodeError as exc:
            raise ModelError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except RecursionError:
            raise ModelError(f"{path}: JSON nested too deeply") from None
        except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer of thousands of digits
            raise ModelError(f"{path}: not valid JSON ({exc})") from None
    elif stripped[:1] in (b"{", b"["):
        try:
            doc = decode_ubjson(data, max_depth=MAX_DEPTH)
        except UBJSONError as exc:
            raise ModelError(f"{path}: not a valid UBJSON model ({exc})") from None
    else:
        raise ModelError(f"{path}: not an XGBoost model (neither JSON nor UBJSON)")
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: not an XGBoost model (expected an object, got {type(doc).__name__})")
    return doc


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


# ---------------------------------------------------------------------------------------------- checking
def check_model(doc: dict, where: str = "model") -> None:
    """Raise ModelError unless ``doc`` (a decoded model file) is a tree classifier XGBoost can load and predict
    with safely; normalises the numeric arrays it checked (ints as ints, floats as floats) in place."""
    try:
        _check_model(doc)
    except _Bad as exc:
        field, reason = exc.args
        raise ModelError(f"{where}: {field}: {reason}") from None


def _get(d: dict, key: str, kind, field: str):
    if not isinstance(d, dict):
        raise _Bad(field.rsplit(".", 1)[0] or field, "expected an object")
    if key not in d:
        raise _Bad(field, "missing")
    value = d[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise _Bad(field, f"expected {_KIND_WORDS.get(kind, kind)}, got {type(value).__name__}")
    return value


_KIND_WORDS = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def _int_text(d: dict, key: str, field: str, lo: int, hi: int) -> int:
    """XGBoost writes its parameters as strings of integers ("num_feature": "4")."""
    text = _get(d, key, str, field)
    if not (text.isascii() and text.lstrip("-").isdigit()) or len(text) > 12:
        raise _Bad(field, f"expected an integer as text, got {text[:40]!r}")
    value = int(text)
    if not lo <= value <= hi:
        raise _Bad(field, f"{value} is outside {lo}..{hi}")
    return value


def _float_list(text: str, field: str) -> list[float]:
    """XGBoost's base_score: "5E-1" (before 3.0) or "[5.15E-1]" / "[0.2,-0.1,0.3]" (one per class)."""
    body = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        values = [float(v) for v in body.split(",")] if len(body) < 1_000_000 else None
    except ValueError:
        values = None
    if not values or not all(math.isfinite(v) and abs(v) <= FLOAT32_MAX for v in values):
        raise _Bad(field, f"expected finite numbers, got {text[:60]!r}")
    return values


def float32_text(value: float) -> str:
    """A float32 as XGBoost writes it ("4E-1", "1.0800095E0"): 2.x read base_score with a float parser that keeps
    its default 0.5, silently, for a mantissa of more than 9 digits (``repr`` of a double has up to 17)."""
    mantissa, exp = np.format_float_scientific(np.float32(value), unique=True, trim="-", exp_digits=1).split("e")
    return f"{mantissa}E{int(exp)}"


def _ints(tree: dict, key: str, n: int, field: str) -> np.ndarray:
    values = _get(tree, key, list, field)
    if len(values) != n:
        raise _Bad(field, f"{len(values)} items for {n} nodes (num_nodes)")
    for k, v in enumerate(values):
        if type(v) is not int:  # noqa: E721 (bool and float are refused)
            raise _Bad(f"{field}[{k}]", f"expected an integer, got {type(v).__name__}")
        if not -(2 ** 31) <= v < 2 ** 32:
            raise _Bad(f"{field}[{k}]", f"{v} is outside the 32-bit range")
    return np.asarray(values, dtype=np.int64)


def _floats(tree: dict, key: str, n: int, field: str, *, nonnegative=False) -> list[float]:
    values = _get(tree, key, list, field)
    if len(values) != n:
        raise _Bad(field, f"{len(values)} items for {n} nodes (num_nodes)")
    out = []
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad(f"{field}[{k}]", f"expected a number, got {type(v).__name__}")
        v = float(v) if isinstance(v, float) or abs(v) <= FLOAT32_MAX else math.inf  # float(10**400) overflows
        if not math.isfinite(v) or abs(v) > FLOAT32_MAX or (nonnegative and v < 0):
            raise _Bad(f"{field}[{k}]", f"{v} is not a finite{' non-negative' if nonnegative else ''} float32")
        out.append(v)
    return out


def _check_model(doc: dict) -> None:
    if "learner" not in doc:
        raise _Bad("not an XGBoost model", "no 'learner' object")
    unknown = [k for k in doc if k not in _TOP_KEYS]
    if unknown:  # XGBoost ignores it, and it would be handed on to XGBoost re-serialised: refused
        raise _Bad(str(unknown[0])[:80], "unknown field at the top of the model (XGBoost writes only "
                                         "'learner' and 'version')")
    version = _get(doc, "version", list, "version")
    if len(version) != 3 or not all(type(v) is int for v in version) or version[0] < 2:  # noqa: E721
        raise _Bad("version", f"expected XGBoost's [major, minor, patch] of version 2 or later, got {version!r}")
    learner = _get(doc, "learner", dict, "learner")
    attributes = learner.get("attributes", {})
    if not isinstance(attributes, dict) or not all(isinstance(v, str) for v in attributes.values()):
        raise _Bad("learner.attributes", "expected an object of strings")
    param = _get(learner, "learner_model_param", dict, "learner.learner_model_param")
    where = "learner.learner_model_param"
    n_features = _int_text(param, "num_feature", f"{where}.num_feature", 1, MAX_FEATURES)
    n_class = _int_text(param, "num_class", f"{where}.num_class", 0, MAX_CLASSES)
    if "num_target" in param and _int_text(param, "num_target", f"{where}.num_target", 1, 1) != 1:
        raise _Bad(f"{where}.num_target", "expected 1")
    objective = _get(learner, "objective", dict, "learner.objective")
    name = _get(objective, "name", str, "learner.objective.name")
    if name not in MODEL_OBJECTIVES:
        raise _Bad("learner.objective.name", f"{name[:60]!r}; the jobs' models are {', '.join(MODEL_OBJECTIVES)}")
    if name == "binary:logistic" and n_class not in (0, 1):
        raise _Bad(f"{where}.num_class", f"{n_class} classes for a binary:logistic objective")
    if name == "reg:squarederror" and n_class != 0:
        raise _Bad(f"{where}.num_class", f"{n_class} classes for a reg:squarederror objective (XGBoost writes 0)")
    if name == "multi:softprob":
        soft = _get(objective, "softmax_multiclass_param", dict, "learner.objective.softmax_multiclass_param")
        declared = _int_text(soft, "num_class", "learner.objective.softmax_multiclass_param.num_class", 2,
                             MAX_CLASSES)
        if declared != n_class:
            raise _Bad(f"{where}.num_class", f"{n_class}, but the objective says {declared}")
    groups = max(n_class, 1)
    text = _get(param, "base_score", str, f"{where}.base_score")
    base = _float_list(text, f"{where}.base_score")
    if len(base) != groups and (len(base) != 1 or text.startswith("[")):
        raise _Bad(f"{where}.base_score", f"{len(base)} values for {groups} output(s)")
    # XGBoost parses the text again: hand it the values as checked, as float32 text; one number when all are equal,
    # which 3.1+ give every class and 2.x/3.0 read (they take a list, 3.1+'s spelling, for their default 0.5)
    param["base_score"] = float32_text(base[0]) if len(set(base)) == 1 else f"[{','.join(map(float32_text, base))}]"
    if name == "binary:logistic" and not all(0.0 < b < 1.0 for b in base):
        raise _Bad(f"{where}.base_score", "a binary:logistic base score is a probability, strictly between 0 and 1")
    types = _check_names(learner, n_features)

    booster = _get(learner, "gradient_booster", dict, "learner.gradient_booster")
    kind = _get(booster, "name", str, "learner.gradient_booster.name")
    if kind != "gbtree":
        raise _Bad("learner.gradient_booster.name", f"{kind[:40]!r}; only tree models (gbtree) are read")
    model = _get(booster, "model", dict, "learner.gradient_booster.model")
    _check_trees(model, n_features, groups, types)


def _check_names(learner: dict, n_features: int) -> list[str] | None:
    out = None
    for key in ("feature_names", "feature_types"):
        values = learner.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise _Bad(f"learner.{key}", "expected a list of strings")
        if values and len(values) != n_features:
            raise _Bad(f"learner.{key}", f"{len(values)} names for num_feature {n_features}")
        if key == "feature_types" and values:
            bad = [v for v in values if v not in FEATURE_TYPES]
            if bad:
                raise _Bad("learner.feature_types", f"{bad[0][:40]!r} is not one of {FEATURE_TYPES}")
            out = values
    return out


def _check_trees(model: dict, n_features: int, groups: int, types) -> None:
    where = "learner.gradient_booster.model"
    param = _get(model, "gbtree_model_param", dict, f"{where}.gbtree_model_param")
    trees = _get(model, "trees", list, f"{where}.trees")
    n_trees = _int_text(param, "num_trees", f"{where}.gbtree_model_param.num_trees", 0, 10_000_000)
    if n_trees != len(trees):
        raise _Bad(f"{where}.gbtree_model_param.num_trees", f"{n_trees}, but the model holds {len(trees)} trees")
    _int_text(param, "num_parallel_tree", f"{where}.gbtree_model_param.num_parallel_tree", 1, 100_000)
    info = _get(model, "tree_info", list, f"{where}.tree_info")
    if len(info) != n_trees:
        raise _Bad(f"{where}.tree_info", f"{len(info)} entries for {n_trees} trees")
    for i, g in enumerate(info):
        if type(g) is not int or not 0 <= g < groups:  # noqa: E721
            raise _Bad(f"{where}.tree_info[{i}]", f"{g!r} is not an output group 0..{groups - 1}")
    indptr = model.get("iteration_indptr")
    if indptr is not None:
        if not isinstance(indptr, list) or not indptr or indptr[0] != 0 or indptr[-1] != n_trees or not all(
                type(v) is int for v in indptr) or any(b < a for a, b in zip(indptr, indptr[1:])):  # noqa: E721
            raise _Bad(f"{where}.iteration_indptr", f"expected non-decreasing tree offsets from 0 to {n_trees}")
    cats = model.get("cats")
    if cats is not None:
        if not isinstance(cats, dict) or any(v not in ([], None) for v in cats.values()):
            raise _Bad(f"{where}.cats", "the model records its own category encoding (trained on a DataFrame of "
                                        "categorical dtype); treeflare models read the schema's category codes")
    for i, tree in enumerate(trees):
        _check_tree(tree, i, n_features, types, f"trees[{i}]")


def _check_tree(tree, i: int, n_features: int, types, where: str) -> None:
    if not isinstance(tree, dict):
        raise _Bad(where, "expected an object")
    if tree.get("id") != i or isinstance(tree.get("id"), bool):
        raise _Bad(f"{where}.id", f"expected {i}, got {tree.get('id')!r}")
    param = _get(tree, "tree_param", dict, f"{where}.tree_param")
    n = _int_text(param, "num_nodes", f"{where}.tree_param.num_nodes", 1, 2 ** 31 - 2)
    if _int_text(param, "num_feature", f"{where}.tree_param.num_feature", 0, MAX_FEATURES) != n_features:
        raise _Bad(f"{where}.tree_param.num_feature", f"not the model's num_feature {n_features}")
    if _int_text(param, "num_deleted", f"{where}.tree_param.num_deleted", 0, n) != 0:
        raise _Bad(f"{where}.tree_param.num_deleted", "a tree with deleted nodes is not read")
    _int_text(param, "size_leaf_vector", f"{where}.tree_param.size_leaf_vector", 0, 1)  # 1 output per leaf
    a = {key: _ints(tree, key, n, f"{where}.{key}") for key in _INT_ARRAYS}
    for key in _FLOAT_ARRAYS:
        tree[key] = _floats(tree, key, n, f"{where}.{key}", nonnegative=key == "sum_hessian")
    left, right, parents = a["left_children"], a["right_children"], a["parents"]
    leaf = left == -1
    nodes = np.arange(n)
    # a child comes after its parent: no cycle, no path back up, every index in range
    for side, child in (("left_children", left), ("right_children", right)):
        bad = np.flatnonzero(~leaf & ((child <= nodes) | (child >= n)) | leaf & (child != -1))
        if bad.size:
            k = int(bad[0])
            raise _Bad(f"{where}.{side}[{k}]", f"{int(child[k])} is not a child of node {k} (expected -1 for a "
                                               f"leaf, or {k + 1}..{n - 1})")
    if (right[~leaf] == left[~leaf]).any():
        k = int(np.flatnonzero(~leaf & (right == left))[0])
        raise _Bad(f"{where}.right_children[{k}]", "the same node as the left child")
    expect = np.full(n, -1, dtype=np.int64)
    seen = np.zeros(n, dtype=np.int64)
    inner = np.flatnonzero(~leaf)
    for child in (left[inner], right[inner]):
        np.add.at(seen, child, 1)
        expect[child] = inner
    twice = np.flatnonzero(seen > 1)
    if twice.size:
        raise _Bad(f"{where}.left_children", f"node {int(twice[0])} has two parents")
    orphan = np.flatnonzero(seen[1:] == 0)
    if orphan.size:
        raise _Bad(f"{where}", f"node {int(orphan[0]) + 1} is not reachable from the root")
    expect[0] = ROOT_PARENT
    wrong = np.flatnonzero(parents != expect)
    if wrong.size:
        k = int(wrong[0])
        raise _Bad(f"{where}.parents[{k}]", f"{int(parents[k])}, but node {k}'s parent is {int(expect[k])}")
    split = a["split_indices"]
    bad = np.flatnonzero((split < 0) | (split >= n_features))
    if bad.size:
        k = int(bad[0])
        raise _Bad(f"{where}.split_indices[{k}]", f"{int(split[k])} is not a feature 0..{n_features - 1}")
    for key in ("default_left", "split_type"):
        bad = np.flatnonzero((a[key] != 0) & (a[key] != 1))
        if bad.size:
            raise _Bad(f"{where}.{key}[{int(bad[0])}]", f"{int(a[key][bad[0]])}; expected 0 or 1")
    _check_categories(tree, a["split_type"], leaf, split, types, where)


def _check_categories(tree: dict, split_type: np.ndarray, leaf: np.ndarray, split: np.ndarray, types,
                      where: str) -> None:
    categorical = np.flatnonzero(split_type == 1)
    if (leaf[categorical]).any():
        raise _Bad(f"{where}.split_type[{int(categorical[leaf[categorical]][0])}]", "a leaf has no categorical split")
    if types is not None:
        for k in categorical:
            if types[split[k]] != "c":
                raise _Bad(f"{where}.split_type[{int(k)}]",
                           f"a categorical split on feature {int(split[k])} of type {types[split[k]]!r}")
    lists = {}
    for key in ("categories_nodes", "categories_segments", "categories_sizes", "categories"):
        values = _get(tree, key, list, f"{where}.{key}")
        for k, v in enumerate(values):
            hi = MAX_CATEGORY if key == "categories" else 2 ** 31
            if type(v) is not int or not 0 <= v < hi:  # noqa: E721 (bool and float are refused)
                raise _Bad(f"{where}.{key}[{k}]", f"{v!r} is not an integer 0..{hi - 1}")
        lists[key] = values
    nodes, segments, sizes = lists["categories_nodes"], lists["categories_segments"], lists["categories_sizes"]
    if not len(nodes) == len(segments) == len(sizes):
        raise _Bad(f"{where}.categories_nodes", f"{len(nodes)} nodes, {len(segments)} segments, {len(sizes)} sizes")
    if nodes != [int(k) for k in categorical]:
        raise _Bad(f"{where}.categories_nodes", "must list exactly the nodes whose split_type is 1, in order")
    for k, (seg, size) in enumerate(zip(segments, sizes)):
        if seg + size > len(lists["categories"]):
            raise _Bad(f"{where}.categories_segments[{k}]", f"segment {seg}..{seg + size} runs past the "
                                                            f"{len(lists['categories'])} categories")

