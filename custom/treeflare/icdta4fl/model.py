"""The global ICDTA4FL tree as a scikit-learn classifier, with JSON save/load.

``GlobalTree`` wraps a ``Tree`` with the shared schema (class names, feature names and kinds,
category names). No pickle: ``save_json``/``load_json`` write and read a versioned JSON document
that is validated on load. Text, explanations in words and the picture are in ``export``, which reads
this estimator (as scikit-learn keeps ``export_text``/``plot_tree`` apart from its trees).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..base import ClassCodesClassifier
from ..files import json_safe
from ..trees.learners import ENCODINGS, encoding_of
from ..trees.tree import LEAF, Tree
from ..trees.validate import PayloadError, check_list

__all__ = ["GlobalTree", "MODEL_SCHEMA", "MODEL_SCHEMA_VERSION", "ModelPayloadError"]

MODEL_SCHEMA = "treeflare.icdta4fl.global_tree"
# 2: "encoding" names the encoding ("one_hot", "category_codes"); version 1 files named the learner ("cart", "id3")
# and are still read. A reader of version 1 refuses a version 2 file by its version, not by an unknown encoding.
MODEL_SCHEMA_VERSION = 2
READ_VERSIONS = (1, 2)
_MAX_NAME = 1000
# A global_tree.json bigger than this is refused before it is read (parsing holds several times its size): a job's
# tree (a budget of 32 leaves by default) is kilobytes, a 10,000-leaf tree of 20 classes 7 MB, and a schema at
# discovery's bounds (100,000 category values of up to 200 characters, written twice) adds at most ~40 MB.
MAX_MODEL_BYTES = 64 << 20
_MODEL_KEYS = ("schema", "version", "classes", "feature_names", "category_names", "tree", "info", "data_schema",
               "encoding")


class ModelPayloadError(PayloadError):
    """A global-model document is malformed."""


class GlobalTree(ClassCodesClassifier):
    """The federation's decision tree as a fitted scikit-learn classifier over the shared schema.

    Fitted attributes follow ``DecisionTreeClassifier``: ``classes_`` (class names), ``n_classes_``,
    ``n_outputs_``, ``tree_`` (the underlying ``Tree``); ``n_features_in_`` and ``feature_names_in_`` describe the
    encoded matrix (``x0``, ``x1`` ... when no names are given), while a DataFrame is read by the schema's raw
    columns (``data_schema.feature_names``).

    The constructor parameters are the fitted model (tree, class and feature names, schema), checked when given,
    so ``clone`` builds an equal model (a deep copy) that predicts the same, and ``set_params`` can swap the tree.
    ``fit`` raises: the federation trained the model, it is not refitted here. ``ClassCodesClassifier`` lists the
    ``check_estimator`` checks that cannot apply to such a model.
    """

    def __init__(self, tree: Tree, classes, feature_names=None, category_names=None, info=None,
                 data_schema=None, encoding=None):
        """``data_schema`` (a ``Schema``, or its dict, read into a ``Schema``) and ``encoding`` ("one_hot" or
        "category_codes", ``trees.learners``; a learner's name means its encoding) let the model take raw rows (a
        pandas DataFrame named as in the schema) as well as encoded arrays."""
        self.tree = tree
        self.classes = classes
        self.feature_names = feature_names
        self.category_names = category_names
        self.info = info
        self.data_schema = data_schema
        self.encoding = encoding
        self._set_fitted()

    def _set_fitted(self) -> None:
        """The fitted attributes, from the parameters. A parameter already in its checked form is kept as the same
        object (``clone`` checks that the constructor keeps what it is given)."""
        tree = self.tree
        if not isinstance(tree, Tree):
            raise TypeError(f"tree must be a treeflare Tree, got {type(tree).__name__}")
        classes = np.asarray([str(c) for c in self.classes], dtype=object)
        if len(classes) != tree.n_classes:
            raise ValueError(f"{len(classes)} class names for {tree.n_classes} classes")
        names = self.feature_names
        if names is None:
            names = [f"x{j}" for j in range(tree.n_features)]
        if len(names) != tree.n_features:
            raise ValueError(f"{len(names)} feature names for {tree.n_features} features")
        self.tree_ = tree
        self.classes_ = classes
        self.n_classes_ = len(classes)
        self.n_outputs_ = 1
        self.feature_names_in_ = np.asarray([str(n) for n in names], dtype=object)
        self.n_features_in_ = tree.n_features
        self.category_names = _checked_category_names(self.category_names)
        if self.info is not None and not isinstance(self.info, dict):
            self.info = dict(self.info)
        if self.data_schema is not None:
            self.set_data_schema(self.data_schema, self.encoding)

    def set_data_schema(self, data_schema, encoding):
        """Attach the schema (and encoding) that raw rows are read with."""
        from ..data import Schema
        from .encoding import feature_space

        schema = data_schema if isinstance(data_schema, Schema) else Schema.from_dict(data_schema)
        names = feature_space(schema, encoding)[0]
        if list(names) != list(self.feature_names_in_):
            raise ModelPayloadError("data_schema", f"its {encoding} columns do not match the model's feature names")
        if list(schema.classes) != list(self.classes_):
            raise ModelPayloadError("data_schema", "its classes do not match the model's classes")
        self.data_schema, self.encoding = schema, encoding

    def _matrix(self, X):
        """Encoded rows: a DataFrame of raw values is encoded with the model's schema; arrays pass as they are."""
        import pandas as pd

        return self.encode_rows(X) if isinstance(X, pd.DataFrame) else X

    def encode_rows(self, frame, file="input"):
        """A DataFrame of raw values (named as in the schema) as the encoded matrix the tree reads; errors name
        ``file``, the column and the line. The label and id columns, if present, are not read."""
        if self.data_schema is None:
            raise ValueError("this model carries no data schema: pass rows encoded as in training")
        from ..data.csv_io import features_table
        from .encoding import encode

        return encode(features_table(frame, self.data_schema, file=file), self.encoding)

    # ------------------------------------------------------------------ estimator API
    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities; ``X`` is encoded rows or (with a data schema) a DataFrame of raw values, in
        which unknown categories and missing values behave as in training and a missing column is an error."""
        return self.tree_.predict_proba(self._matrix(X))

    def predict_codes(self, X) -> np.ndarray:
        """Class indices into ``classes_``."""
        return self.tree_.predict(self._matrix(X))

    def apply(self, X) -> np.ndarray:
        return self.tree_.apply(self._matrix(X))

    def decision_path(self, X):
        """scikit-learn's node indicator: a CSR matrix of shape (n_samples, n_nodes) whose row i is 1 at the nodes
        row i passes, from the root to the node ``apply`` gives (a leaf, or the node that stops the row); each
        row's ``indices`` run from the root down."""
        import heapq

        from scipy.sparse import csr_matrix

        tree = self.tree_
        X = np.asarray(self._matrix(X), dtype=np.float64)
        tree._check_X(X)
        rows_at, nodes_at = [], []
        # routed as Tree.apply routes, nodes taken in increasing id (a child's id is larger than its parent's), so
        # a stable sort by row keeps each row's nodes root first
        heap = [(0, np.arange(len(X)))]
        while heap:
            node, rows = heapq.heappop(heap)
            rows_at.append(rows)
            nodes_at.append(np.full(len(rows), node, dtype=np.int64))
            if tree.kind[node] == LEAF:
                continue
            pos = tree._route(node, X[rows, tree.feature[node]])
            for i, child in enumerate(tree.children[node]):
                if (pos == i).any():
                    heapq.heappush(heap, (int(child), rows[pos == i]))
        rows, nodes = np.concatenate(rows_at), np.concatenate(nodes_at)
        order = np.argsort(rows, kind="stable")
        indptr = np.zeros(len(X) + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=len(X)), out=indptr[1:])
        return csr_matrix((np.ones(len(rows), dtype=np.int64), nodes[order], indptr), shape=(len(X), tree.n_nodes))

    def get_depth(self) -> int:
        return self.tree_.depth

    def get_n_leaves(self) -> int:
        return self.tree_.n_leaves

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return json_safe({
            "schema": MODEL_SCHEMA,
            "version": MODEL_SCHEMA_VERSION,
            "classes": list(self.classes_),
            "feature_names": list(self.feature_names_in_),
            "category_names": self.category_names,
            "tree": self.tree_.to_dict(),
            "info": self.info or {},
            # optional (older files lack them): what raw rows mean, so predict() takes a DataFrame
            "data_schema": None if self.data_schema is None else self.data_schema.to_dict(),
            # the encoding's own name (a model built with a learner's name, "cart" or "id3", records its encoding)
            "encoding": None if self.encoding is None else encoding_of(self.encoding),
        })

    @classmethod
    def from_dict(cls, payload, **limits) -> "GlobalTree":
        err = ModelPayloadError
        if not isinstance(payload, dict):
            raise err("model", f"expected a dict, got {type(payload).__name__}")
        if payload.get("schema") != MODEL_SCHEMA:
            raise err("schema", f"expected {MODEL_SCHEMA!r}, got {payload.get('schema')!r}")
        if payload.get("version") not in READ_VERSIONS or isinstance(payload.get("version"), bool):
            raise err("version", f"unsupported version {payload.get('version')!r}")
        unknown = [k for k in payload if k not in _MODEL_KEYS]
        if unknown:  # to_dict writes no other field: one more is a damaged or padded file
            raise err(str(unknown[0])[:80], f"unknown field (a global tree holds only {', '.join(_MODEL_KEYS)})")
        tree = Tree.from_dict(payload.get("tree"), **limits)
        classes = check_list(payload.get("classes"), "classes", length=tree.n_classes, error=err)
        names = check_list(payload.get("feature_names"), "feature_names", length=tree.n_features, error=err)
        for field, values in (("classes", classes), ("feature_names", names)):
            for i, v in enumerate(values):
                if not isinstance(v, str) or len(v) > _MAX_NAME:
                    raise err(f"{field}[{i}]", "expected a string of at most 1000 characters")
        cats = payload.get("category_names")
        if cats is not None:
            check_list(cats, "category_names", length=tree.n_features, error=err)
            for j, c in enumerate(cats):
                if c is None:
                    continue
                check_list(c, f"category_names[{j}]", max_len=10_000, error=err)
                if not all(isinstance(v, str) for v in c):
                    raise err(f"category_names[{j}]", "expected strings")
        info = payload.get("info", {})
        if not isinstance(info, dict):
            raise err("info", "expected a dict")
        data_schema, encoding = payload.get("data_schema"), payload.get("encoding")
        if data_schema is not None:
            try:  # an encoding's name, or a learner's in files written before encodings had names
                encoding_of(encoding)
            except ValueError:
                raise err("encoding", f"expected one of {ENCODINGS} or a learner's name, got {encoding!r}") from None
        try:
            return cls(tree, classes, names, cats, info, data_schema=data_schema, encoding=encoding)
        except (ValueError, TypeError, KeyError) as exc:
            if isinstance(exc, ModelPayloadError):
                raise
            raise err("data_schema", str(exc)) from None

    def save_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False))

    @classmethod
    def load_json(cls, path, **limits) -> "GlobalTree":
        check_model_size(path)
        try:
            payload = json.loads(Path(path).read_text())
        except RecursionError as exc:  # deeply nested JSON
            raise ModelPayloadError("model", "JSON nested too deeply") from exc
        except json.JSONDecodeError as exc:
            raise ModelPayloadError("model", f"not JSON: {exc}") from exc
        return cls.from_dict(payload, **limits)

    def __repr__(self) -> str:
        return (f"GlobalTree(n_leaves={self.get_n_leaves()}, depth={self.get_depth()}, "
                f"classes={list(self.classes_)})")


def _checked_category_names(names):
    """Per encoded column, None or its category names as strings; the very list when it is already so."""
    if names is None:
        return None
    if isinstance(names, list) and all(c is None or isinstance(c, list) and all(isinstance(v, str) for v in c)
                                       for c in names):
        return names
    return [None if c is None else [str(v) for v in c] for c in names]


def check_model_size(path) -> None:
    """ModelPayloadError naming the file unless it holds at most MAX_MODEL_BYTES, checked before it is read."""
    size = Path(path).stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ModelPayloadError("model", f"{Path(path).name} is {size:,} bytes, more than the {MAX_MODEL_BYTES:,} "
                                         "(64 MiB) a global tree's file may hold")
