"""Validation of tree payloads received from other parties.

Payloads are plain JSON-like dicts (see ``Tree.to_dict``). Every check is iterative: the node
list is flat and children must have larger indices than their parent, so a payload cannot make a
validator or a traversal recurse, and cannot describe a cycle or a node with two parents.
Errors are ``PayloadError`` (a ``ValueError``) naming the offending field.
"""

from __future__ import annotations

import math
import numbers

__all__ = [
    "TREE_SCHEMA", "TREE_SCHEMA_VERSION", "SUPPORTED_TREE_VERSIONS",
    "PayloadError", "TreePayloadError", "DEFAULT_MAX_NODES", "DEFAULT_MAX_DEPTH",
    "validate_tree_dict", "check_header", "check_number", "check_int", "check_list",
]

# the tree document these checks accept (``Tree.to_dict`` writes the current version)
TREE_SCHEMA = "treeflare.tree"
TREE_SCHEMA_VERSION = 2
SUPPORTED_TREE_VERSIONS = (1, 2)  # 1: no missing-value routing (every NaN stops at its node)

DEFAULT_MAX_NODES = 100_000
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_CLASSES = 10_000
DEFAULT_MAX_FEATURES = 100_000
DEFAULT_MAX_SPLIT_ARITY = 10_000

_FEATURE_KINDS = ("numeric", "categorical")


class PayloadError(ValueError):
    """A received payload is malformed; ``field`` names where."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class TreePayloadError(PayloadError):
    """A tree payload is malformed."""


def check_int(value, field, *, lo=None, hi=None, error=PayloadError) -> int:
    # bool is an int subclass; a JSON true must not pass as 1
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(field, f"expected an integer, got {type(value).__name__}")
    value = int(value)
    if lo is not None and value < lo:
        raise error(field, f"{value} is below {lo}")
    if hi is not None and value > hi:
        raise error(field, f"{value} is above {hi}")
    return value


def check_number(value, field, *, finite=True, nonnegative=False, error=PayloadError) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(field, f"expected a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise error(field, "is too large for a float") from None
    if finite and not math.isfinite(value):
        raise error(field, f"{value} is not finite")
    if nonnegative and value < 0:
        raise error(field, f"{value} is negative")
    return value


def check_list(value, field, *, max_len=None, length=None, error=PayloadError) -> list:
    if not isinstance(value, (list, tuple)):
        raise error(field, f"expected a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise error(field, f"expected {length} items, got {len(value)}")
    if max_len is not None and len(value) > max_len:
        raise error(field, f"{len(value)} items exceed the limit of {max_len}")
    return value


def check_header(payload: dict, schema: str, version: int, *, n_features=None, n_classes=None,
                 error=PayloadError) -> tuple[int, int, list]:
    """The envelope every model payload shares: schema name and version, sizes, feature kinds.

    ``version`` is the supported version or a tuple of them. Returns (n_features, n_classes,
    feature_kinds); ``n_features``/``n_classes``, when given, must match.
    """
    err = error
    if payload.get("schema") != schema:
        raise err("schema", f"expected {schema!r}, got {payload.get('schema')!r}")
    got = check_int(payload.get("version"), "version", error=err)
    supported = tuple(version) if isinstance(version, (tuple, list)) else (version,)
    if got not in supported:
        raise err("version", f"unsupported version {got} (supported: {', '.join(map(str, supported))})")
    d = check_int(payload.get("n_features"), "n_features", lo=1, hi=DEFAULT_MAX_FEATURES, error=err)
    C = check_int(payload.get("n_classes"), "n_classes", lo=1, hi=DEFAULT_MAX_CLASSES, error=err)
    if n_features is not None and d != n_features:
        raise err("n_features", f"expected {n_features}, got {d}")
    if n_classes is not None and C != n_classes:
        raise err("n_classes", f"expected {n_classes}, got {C}")
    kinds = check_list(payload.get("feature_kinds"), "feature_kinds", length=d, error=err)
    for j, kind in enumerate(kinds):
        if kind not in _FEATURE_KINDS:
            raise err(f"feature_kinds[{j}]", f"expected one of {_FEATURE_KINDS}, got {kind!r}")
    return d, C, kinds


def validate_tree_dict(payload, *, max_nodes=DEFAULT_MAX_NODES, max_depth=DEFAULT_MAX_DEPTH,
                       n_features=None, n_classes=None, feature_kinds=None, n_categories=None,
                       threshold_bounds=None) -> None:
    """Raise ``TreePayloadError`` unless ``payload`` is a well-formed tree dict.

    ``n_features``, ``n_classes`` and ``feature_kinds``, when given, must match the payload (the
    receiver knows the shared schema and checks the sender used it). ``n_categories`` (the
    receiver's own category counts) bounds every categorical code in place of what the payload
    declares; ``threshold_bounds`` gives per feature ``(lo, hi)`` (or None) that every numeric
    threshold must lie in.
    """
    err = TreePayloadError
    if not isinstance(payload, dict):
        raise err("tree", f"expected a dict, got {type(payload).__name__}")
    d, C, kinds = check_header(payload, TREE_SCHEMA, SUPPORTED_TREE_VERSIONS, n_features=n_features,
                               n_classes=n_classes, error=err)
    routes_missing = payload["version"] >= 2  # version 1 has no missing-value routing
    if feature_kinds is not None and list(kinds) != list(feature_kinds):
        raise err("feature_kinds", "do not match the shared schema")
    n_cats = payload.get("n_categories")
    if n_categories is not None:  # the receiver's schema decides, whatever the payload declares
        n_cats = check_list(list(n_categories), "n_categories (receiver)", length=d, error=err)
    elif n_cats is not None:
        check_list(n_cats, "n_categories", length=d, error=err)
        for j, k in enumerate(n_cats):
            if k is not None:
                check_int(k, f"n_categories[{j}]", lo=1, hi=DEFAULT_MAX_SPLIT_ARITY, error=err)
    else:
        n_cats = [None] * d

    nodes = check_list(payload.get("nodes"), "nodes", max_len=max_nodes, error=err)
    if not nodes:
        raise err("nodes", "a tree needs at least one node")
    n = len(nodes)
    depth = [0] * n
    has_parent = [False] * n
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, dict):
            raise err(where, f"expected a dict, got {type(node).__name__}")
        counts = check_list(node.get("counts"), f"{where}.counts", length=C, error=err)
        for c, value in enumerate(counts):
            check_number(value, f"{where}.counts[{c}]", nonnegative=True, error=err)
        kind = node.get("kind")
        if kind == "leaf":
            extra = {"feature", "thresholds", "values", "children", "missing"} & set(node)
            if extra:
                raise err(where, f"a leaf has no {sorted(extra)}")
            continue
        if kind not in ("numeric", "categorical"):
            raise err(f"{where}.kind", f"expected 'leaf', 'numeric' or 'categorical', got {kind!r}")
        f = check_int(node.get("feature"), f"{where}.feature", lo=0, hi=d - 1, error=err)
        if kinds[f] != kind:
            raise err(f"{where}.feature", f"a {kind} split on {kinds[f]} feature {f}")
        children = check_list(node.get("children"), f"{where}.children",
                              max_len=DEFAULT_MAX_SPLIT_ARITY, error=err)
        if kind == "numeric":
            points = check_list(node.get("thresholds"), f"{where}.thresholds",
                                max_len=DEFAULT_MAX_SPLIT_ARITY, error=err)
            if not points and not (routes_missing and len(children) == 2):
                raise err(f"{where}.thresholds", "a numeric split needs at least one threshold "
                          "(or none, with a missing-only child)")
            values = [check_number(t, f"{where}.thresholds[{k}]", error=err) for k, t in enumerate(points)]
            bounds = None if threshold_bounds is None else threshold_bounds[f]
            if bounds is not None and not all(bounds[0] <= v <= bounds[1] for v in values):
                raise err(f"{where}.thresholds", f"outside the range [{bounds[0]}, {bounds[1]}] of feature {f}")
            branches = len(values) + 1
        else:
            points = check_list(node.get("values"), f"{where}.values",
                                max_len=DEFAULT_MAX_SPLIT_ARITY, error=err)
            if not points:
                raise err(f"{where}.values", "a categorical split needs at least one value")
            hi = None if n_cats[f] is None else n_cats[f] - 1
            values = [check_int(v, f"{where}.values[{k}]", lo=0, hi=hi, error=err) for k, v in enumerate(points)]
            branches = len(values)
        _check_missing(node, where, branches, len(children), routes_missing)
        if any(b <= a for a, b in zip(values, values[1:])):
            raise err(f"{where}.{'thresholds' if kind == 'numeric' else 'values'}",
                      "must be strictly increasing")
        for k, child in enumerate(children):
            child = check_int(child, f"{where}.children[{k}]", lo=i + 1, hi=n - 1, error=err)
            if has_parent[child]:
                raise err(f"{where}.children[{k}]", f"node {child} has two parents")
            has_parent[child] = True
            depth[child] = depth[i] + 1
            if depth[child] > max_depth:
                raise err(f"{where}.children[{k}]", f"depth exceeds the limit of {max_depth}")
    orphans = [i for i in range(1, n) if not has_parent[i]]
    if orphans:
        raise err(f"nodes[{orphans[0]}]", "unreachable from the root")


def _check_missing(node: dict, where: str, branches: int, n_children: int, routes_missing: bool) -> None:
    """``missing`` (version 2): a child position; a child beyond the branches is reached by NaN only."""
    err = TreePayloadError
    if not routes_missing:
        if "missing" in node:
            raise err(f"{where}.missing", "version 1 has no missing-value routing")
        if n_children != branches:
            raise err(f"{where}.children", f"expected {branches} children, got {n_children}")
        return
    missing = node.get("missing")
    if n_children not in (branches, branches + 1):
        raise err(f"{where}.children", f"expected {branches} children (or {branches + 1} with a missing-only "
                  f"child), got {n_children}")
    if missing is None:
        if n_children != branches:
            raise err(f"{where}.missing", "a missing-only child needs missing to name it")
        return
    missing = check_int(missing, f"{where}.missing", lo=0, hi=n_children - 1, error=err)
    if n_children == branches + 1 and missing != branches:
        raise err(f"{where}.missing", f"must be {branches}, the missing-only child")
