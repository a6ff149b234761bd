"""The global ICDTA4FL tree as a scikit-learn-like classifier, with JSON save/load.

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
from ..reporting import json_safe
from ..trees.tree import Tree
from ..trees.validate import PayloadError, check_list

__all__ = ["GlobalTree", "MODEL_SCHEMA", "MODEL_SCHEMA_VERSION", "ModelPayloadError"]

MODEL_SCHEMA = "treeflare.icdta4fl.global_tree"
MODEL_SCHEMA_VERSION = 1
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
    """Decision tree classifier over the shared schema.

    Attributes follow scikit-learn: ``classes_`` (class names), ``n_features_in_``,
    ``feature_names_in_``; ``tree_`` is the underlying ``Tree``.
    """

    def __init__(self, tree: Tree, classes, feature_names=None, category_names=None, info=None,
                 data_schema=None, encoding=None):
        """``data_schema`` (a ``Schema`` or its dict) and ``encoding`` ("cart" one-hot / "id3" codes) let the
        model take raw rows (a pandas DataFrame named as in the schema) as well as encoded arrays."""
        self.tree_ = tree
        self.classes_ = np.asarray([str(c) for c in classes], dtype=object)
        if len(self.classes_) != tree.n_classes:
            raise ValueError(f"{len(self.classes_)} class names for {tree.n_classes} classes")
        if feature_names is None:
            feature_names = [f"x{j}" for j in range(tree.n_features)]
        if len(feature_names) != tree.n_features:
            raise ValueError(f"{len(feature_names)} feature names for {tree.n_features} features")
        self.feature_names_in_ = np.asarray([str(n) for n in feature_names], dtype=object)
        self.n_features_in_ = tree.n_features
        self.category_names = (None if category_names is None else
                               [None if c is None else [str(v) for v in c] for c in category_names])
        self.info = dict(info or {})
        self.data_schema, self.encoding = None, None
        if data_schema is not None:
            self.set_data_schema(data_schema, encoding)

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

    def decision_path(self, x) -> list[int]:
        import pandas as pd

        if isinstance(x, pd.DataFrame):
            x = self._matrix(x)[0]
        return self.tree_.decision_path(x)

    def get_depth(self) -> int:
        return self.tree_.depth

    def get_n_leaves(self) -> int:
        return self.tree_.n_leaves

    def to_sklearn(self, **kwargs):
        """This tree as a fitted scikit-learn ``Pipeline`` (encoder, then a ``DecisionTreeClassifier`` carrying
        exactly this tree) that predicts as this model on a DataFrame of raw values (``sklearn_export``)."""
        from .sklearn_export import to_sklearn

        return to_sklearn(self, **kwargs)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        return json_safe({
            "schema": MODEL_SCHEMA,
            "version": MODEL_SCHEMA_VERSION,
            "classes": list(self.classes_),
            "feature_names": list(self.feature_names_in_),
            "category_names": self.category_names,
            "tree": self.tree_.to_dict(),
            "info": self.info,
            # optional (older files lack them): what raw rows mean, so predict() takes a DataFrame
            "data_schema": None if self.data_schema is None else self.data_schema.to_dict(),
            "encoding": self.encoding,
        })

    @classmethod
    def from_dict(cls, payload, **limits) -> "GlobalTree":
        err = ModelPayloadError
        if not isinstance(payload, dict):
            raise err("model", f"expected a dict, got {type(payload).__name__}")
        if payload.get("schema") != MODEL_SCHEMA:
            raise err("schema", f"expected {MODEL_SCHEMA!r}, got {payload.get('schema')!r}")
        if payload.get("version") != MODEL_SCHEMA_VERSION or isinstance(payload.get("version"), bool):
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
        if data_schema is not None and encoding not in ("cart", "id3"):
            raise err("encoding", f"expected 'cart' or 'id3', got {encoding!r}")
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


def check_model_size(path) -> None:
    """ModelPayloadError naming the file unless it holds at most MAX_MODEL_BYTES, checked before it is read."""
    size = Path(path).stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ModelPayloadError("model", f"{Path(path).name} is {size:,} bytes, more than the {MAX_MODEL_BYTES:,} "
                                         "(64 MiB) a global tree's file may hold")
