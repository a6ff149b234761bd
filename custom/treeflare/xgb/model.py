"""A trained XGBoost model together with the schema it was trained on: predictions on raw rows.

The job stores the shared schema inside the native ``model.json``, as the XGBoost user attribute ``treeflare``
(a JSON string: schema, mode, and for a vertical model the parties' ranks). Why inside the model and not in a
file beside it: the model file is what people copy, and a schema that travels in it cannot be lost or paired with
the wrong model; XGBoost keeps user attributes through load and save (JSON and UBJSON), and plain XGBoost still
loads the file unchanged (``Booster.attr("treeflare")`` shows the schema). A model without the attribute (an older
job, or one trained elsewhere) takes the schema from a file instead (:meth:`XGBModel.load`'s ``schema``).

What raw rows mean is decided as in training (``treeflare.xgb.encoding``): categorical values become the
schema's category codes, and a missing value or a category the schema does not list is NaN, which XGBoost sends
down each split's default branch, exactly as for missing values in training.

Vertical models: in XGBoost's (non-secure) vertical federated mode every party ends training with the whole
model, thresholds on every party's columns included. Such a model predicts on rows that hold every party's
columns (e.g. the server's joined test set); rows with only one party's columns are refused, naming the missing
columns and the party that holds them. Federated prediction with each party keeping its columns is the vertical
tree job's (``jobs/vertical_tree``), not this one's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..base import ClassCodesClassifier
from ..data import DataError, Schema
from .encoding import Arrays, feature_types, table_arrays
from .model_file import OBJECTIVES, ModelError, load_checked_booster  # noqa: F401 (ModelError: importers)

MODEL_ATTR = "treeflare"
MODEL_FORMAT = "treeflare.xgb.model"
MODEL_VERSION = 1
MODES = ("horizontal", "vertical")
_MAX_ATTR_CHARS = 50_000_000  # a schema with very many categories still fits; a runaway attribute does not


def model_info(schema: Schema, mode: str = "horizontal", ranks: dict | None = None) -> dict:
    """What :func:`attach_schema` stores: the schema, the mode, and (vertical) {site: rank}."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    info = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "mode": mode, "schema": schema.to_dict()}
    if mode == "vertical" and ranks:
        info["ranks"] = {str(s): int(r) for s, r in ranks.items()}
    return info


def attach_schema(booster, schema: Schema, mode: str = "horizontal", ranks: dict | None = None) -> None:
    """Store the schema in the booster (saved with it by ``save_model``)."""
    booster.set_attr(**{MODEL_ATTR: json.dumps(model_info(schema, mode, ranks), sort_keys=True)})


def save_with_schema(src, dst, schema: Schema, mode: str = "horizontal", ranks: dict | None = None) -> Path:
    """Copy the model file ``src`` to ``dst`` (JSON) with the schema attached; written whole or not at all."""
    import xgboost as xgb

    from ..files import write_text_atomic

    booster = xgb.Booster(model_file=str(src))
    attach_schema(booster, schema, mode, ranks)
    return write_text_atomic(dst, bytes(booster.save_raw("json")).decode())


def save_document_with_schema(doc: dict, dst, schema: Schema, mode: str = "horizontal") -> Path:
    """Write an XGBoost JSON document (the treeflare engine's, laid out for every XGBoost from 2.0) to ``dst`` with
    the schema attached as :func:`attach_schema` does, without a round trip through the installed XGBoost (which
    would rewrite it in its own version's layout)."""
    from ..files import write_text_atomic

    learner = doc["learner"]
    learner["attributes"] = {**learner.get("attributes", {}),
                             MODEL_ATTR: json.dumps(model_info(schema, mode), sort_keys=True)}
    return write_text_atomic(dst, json.dumps(doc, allow_nan=False))


def read_info(booster, where: str = "model") -> dict | None:
    """The stored info, checked; None when the model has no ``treeflare`` attribute."""
    text = booster.attr(MODEL_ATTR)
    if text is None:
        return None
    if len(text) > _MAX_ATTR_CHARS:
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r} is larger than {_MAX_ATTR_CHARS} characters")
    try:
        info = json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, or an integer of thousands of digits
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r} is not JSON") from None
    if not isinstance(info, dict) or info.get("format") != MODEL_FORMAT:
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r} is not a {MODEL_FORMAT} document")
    if info.get("version") != MODEL_VERSION:
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r} has version {info.get('version')!r}, "
                         f"this code reads {MODEL_VERSION}")
    if info.get("mode") not in MODES:
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r}: mode must be one of {MODES}")
    try:
        info["schema"] = Schema.from_dict(info.get("schema"))
    except DataError as exc:
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r}: {exc}") from None
    ranks = info.get("ranks")
    if ranks is not None and not (isinstance(ranks, dict) and all(
            isinstance(s, str) and isinstance(r, int) and not isinstance(r, bool) for s, r in ranks.items())):
        raise ModelError(f"{where}: attribute {MODEL_ATTR!r}: 'ranks' must map site names to integers")
    return info


def _bare(name: str) -> tuple[int | None, str]:
    """(rank, column) of a column-split model's ``"<rank>.<name>"`` feature name; (None, name) otherwise."""
    head, dot, rest = name.partition(".")
    return (int(head), rest) if dot and head.isdigit() and len(head) < 10 else (None, name)


class XGBModel(ClassCodesClassifier):
    """A booster and its schema as a fitted scikit-learn classifier, with the estimator methods of ``GlobalTree``:
    ``predict``, ``predict_proba``, ``score`` take a pandas DataFrame of raw values named as in the schema (or rows
    already encoded as the job encodes them: a float matrix of the schema's features, categories as codes, NaN =
    missing). The constructor parameters are the fitted model, so ``clone`` gives an equal model; ``fit`` raises
    (the federation trained it). :meth:`to_xgboost` gives XGBoost's own scikit-learn classifier."""

    def __init__(self, booster, data_schema: Schema, mode: str = "horizontal", ranks: dict | None = None,
                 where: str = "model"):
        """``data_schema``: a ``Schema`` (or its dict, read into one). ``mode`` becomes "vertical" when the booster's
        feature names are a column-split model's (``"<rank>.<name>"``)."""
        self.booster = booster
        self.data_schema = data_schema
        self.mode = mode
        self.ranks = ranks
        self.where = where
        self._set_fitted()

    def _set_fitted(self) -> None:
        """The fitted attributes, from the parameters, checked against each other; a parameter already in its checked
        form is kept as the same object (``clone`` checks that the constructor keeps what it is given)."""
        import xgboost as xgb

        if not isinstance(self.booster, xgb.Booster):
            raise TypeError(f"booster must be an xgboost.Booster, got {type(self.booster).__name__}")
        if not isinstance(self.data_schema, Schema):
            self.data_schema = Schema.from_dict(self.data_schema)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.ranks is not None and not isinstance(self.ranks, dict):
            self.ranks = dict(self.ranks)
        self.classes_ = np.asarray(self.data_schema.classes, dtype=object)
        self.n_classes_ = len(self.classes_)
        self.n_outputs_ = 1
        self.feature_names_in_ = np.asarray(self.data_schema.feature_names, dtype=object)
        self.n_features_in_ = len(self.feature_names_in_)
        self._party: dict = {}  # vertical: column -> rank of the party that holds it
        self._check()

    def _check(self) -> None:
        config = json.loads(self.booster.save_config())["learner"]
        objective = config["objective"]["name"]
        if objective not in OBJECTIVES:
            raise ModelError(f"{self.where}: objective {objective!r}; predictions are made for the job's "
                             f"classifiers ({', '.join(OBJECTIVES)})")
        n_class = int(config["learner_model_param"].get("num_class", "0") or 0)
        n_features = int(config["learner_model_param"].get("num_feature", "0") or 0)
        if n_features != len(self.feature_names_in_):  # split indices were checked against this count
            raise ModelError(f"{self.where}: the model reads {n_features} features, its schema lists "
                             f"{len(self.feature_names_in_)} {list(self.feature_names_in_)}")
        expect = len(self.classes_)
        if (objective == "binary:logistic" and expect != 2) or (objective == "multi:softprob" and n_class != expect):
            raise ModelError(f"{self.where}: the model predicts {2 if objective.startswith('binary') else n_class} "
                             f"classes, its schema lists {expect} {list(self.classes_)}")
        names = self.booster.feature_names
        if names is not None:
            split = [_bare(n) for n in names]
            vertical = all(r is not None for r, _ in split)
            bare = [n for _, n in split] if vertical else list(names)
            if bare != list(self.feature_names_in_):
                raise ModelError(f"{self.where}: the model's features {list(names)} are not the schema's "
                                 f"{list(self.feature_names_in_)}")
            if vertical:
                if self.mode != "vertical":  # not reassigned when so: clone needs the very object it passed
                    self.mode = "vertical"
                self._party = {n: r for r, n in split}
        types = self.booster.feature_types
        if types is not None and list(types) != feature_types(self.data_schema):
            raise ModelError(f"{self.where}: the model's feature types {list(types)} are not the schema's "
                             f"{feature_types(self.data_schema)} (categorical columns are 'c')")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path, schema: Schema | dict | None = None) -> "XGBModel":
        """A native XGBoost model file (JSON or UBJSON), checked field by field before XGBoost reads it
        (``model_file.py``: a malformed tree array would crash XGBoost). ``schema`` is used when the file carries
        none."""
        path = Path(path)
        if not path.is_file():
            raise ModelError(f"{path}: file not found")
        booster = load_checked_booster(path)
        info = read_info(booster, str(path))
        if info is None:
            if schema is None:
                raise ModelError(f"{path}: the model carries no schema (attribute {MODEL_ATTR!r}; written by an older "
                                 "job or outside treeflare): give the schema it was trained with (a schema JSON, or "
                                 "the federation's partition.json)")
            return cls(booster, schema, where=str(path))
        return cls(booster, info["schema"], info["mode"], info.get("ranks"), where=str(path))

    # ------------------------------------------------------------------ rows
    def _holder(self, column: str) -> str:
        rank = self._party.get(column)
        if rank is None:
            return ""
        site = next((s for s, r in (self.ranks or {}).items() if r == rank), None)
        return f"{site} (rank {rank})" if site else f"the party of rank {rank}"

    def encode_rows(self, frame, file: str = "input") -> Arrays:
        """A DataFrame of raw values as the job's XGBoost input; errors name ``file``, the column and the line.
        Extra columns are ignored; the label and id columns, if present, are not read."""
        from ..data.csv_io import features_table

        missing = [c for c in self.data_schema.feature_names if c not in frame.columns]
        if missing and self.mode == "vertical":
            held = "; ".join(f"{c!r} held by {self._holder(c)}" if self._holder(c) else repr(c) for c in missing)
            raise DataError(f"{file}: missing column(s) {held}. This vertical model holds every party's splits and "
                            "needs every party's columns of a row in one file; for predictions where each party "
                            "keeps its columns use jobs/vertical_tree", problem=f"missing column(s) {missing}",
                            file=file)
        return table_arrays(features_table(frame, self.data_schema, file=file))

    def _arrays(self, X) -> Arrays:
        import pandas as pd

        if isinstance(X, Arrays):
            return X
        if isinstance(X, pd.DataFrame):
            return self.encode_rows(X)
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != len(self.feature_names_in_):
            raise ValueError(f"expected encoded rows with {len(self.feature_names_in_)} columns "
                             f"{list(self.feature_names_in_)}, got shape {X.shape}")
        return Arrays(X, None, list(self.feature_names_in_), feature_types(self.data_schema))

    # ------------------------------------------------------------------ estimator API
    def predict_proba(self, X) -> np.ndarray:
        """(n, K) class probabilities, columns in ``classes_`` order (binary models too)."""
        from .metrics import predict_proba

        p = predict_proba(self.booster, self._arrays(X))
        if p.ndim == 1:
            return np.column_stack([1.0 - p, p])
        return p.reshape(len(p), len(self.classes_))

    def predict_codes(self, X) -> np.ndarray:
        """Class indices; binary: class 1 when its probability is >= 0.5 (as the job's report scores it)."""
        p = self.predict_proba(X)
        if p.shape[1] == 2:
            return (p[:, 1] >= 0.5).astype(np.int64)
        return p.argmax(axis=1)

    def to_xgboost(self):
        """This model as XGBoost's scikit-learn classifier, ``xgboost.XGBClassifier``, loaded with ``load_model``
        from the checked booster (the schema attribute goes along). It reads the encoded matrix
        (``encode_rows(frame).X``: categories as the schema's codes, NaN = missing). XGBoost's wrapper numbers the
        classes: its ``classes_`` is 0..K-1 and ``predict`` gives those indices, so the labels are
        ``self.classes_[clf.predict(X)]``; ``predict_proba`` columns are in ``classes_`` order. Binary: XGBoost
        predicts class 1 above 0.5, :meth:`predict` at 0.5 and above."""
        return _classifier(self.booster)

    def __repr__(self) -> str:
        return (f"XGBModel(mode={self.mode}, rounds={self.booster.num_boosted_rounds()}, "
                f"classes={list(self.classes_)})")


def _classifier(booster):
    import xgboost as xgb

    clf = xgb.XGBClassifier()
    clf.load_model(bytearray(booster.save_raw("json")))
    return clf


def load_sklearn_model(path):
    """A native XGBoost model file (JSON or UBJSON) as ``xgboost.XGBClassifier``, checked first as
    :meth:`XGBModel.load` checks it (no schema needed: the classifier reads encoded rows). Its ``predict`` gives
    class indices; ``XGBModel.load(path).to_xgboost()`` keeps the class names at hand (``XGBModel.classes_``)."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: file not found")
    return _classifier(load_checked_booster(path))
