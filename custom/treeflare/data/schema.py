"""The shared description of a dataset: feature names and kinds, category lists, classes.

Every site must encode its data identically, so the schema (not a site's local values) decides the
category codes, the one-hot columns and the class indices. It travels as plain JSON (in
``partition.json`` and in job configuration).

Feature kinds:

* ``numeric``: a float column;
* ``categorical``: unordered categories (``categories`` lists them; codes index that list);
* ``ordinal``: ordered categories (``categories`` lists them lowest first; code ``i`` is the i-th level, so
  codes compare as the levels do). :meth:`Table.onehot` keeps an ordinal column as one numeric column of
  its codes, so numeric learners split it by threshold on the order.

JSON: ``{"name": "safety", "kind": "ordinal", "categories": ["low", "med", "high"]}``.

One-hot column names (CART's encoding, :meth:`Schema.onehot_names`) are ``column=value``; in the column part a
``=`` is written ``\\=`` and a backslash ``\\\\``, so every name splits back (:func:`split_onehot_name`) into
exactly one column and value: categorical ``a`` with value ``b=c`` is ``a=b=c``, categorical ``a=b`` with value
``c`` is ``a\\=b=c``. Names without ``=`` or a backslash are unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DataError

SCHEMA_VERSION = 1
KINDS = ("numeric", "categorical", "ordinal")
LEVELED = ("categorical", "ordinal")  # kinds whose values are a list of categories


def _schema_error(message: str) -> DataError:
    # About the schema itself (names and kinds everyone shares), so the whole message may leave a site.
    return DataError(message, problem=message)


def onehot_name(column: str, value: str | None = None) -> str:
    """The encoded name of a column of its own (``value`` None: a numeric or ordinal column) or of one category's
    0/1 column; see the module doc."""
    escaped = column.replace("\\", "\\\\").replace("=", "\\=")
    return escaped if value is None else f"{escaped}={value}"


def split_onehot_name(name: str) -> tuple[str, str | None]:
    """(column, value) of a name :func:`onehot_name` made; value None for a column of its own."""
    if "\\" not in name:
        column, eq, value = name.partition("=")
        return (column, value) if eq else (name, None)
    out, i = [], 0
    while i < len(name):
        if name[i] == "\\" and i + 1 < len(name):
            out.append(name[i + 1])
            i += 2
            continue
        if name[i] == "=":
            return "".join(out), name[i + 1:]
        out.append(name[i])
        i += 1
    return "".join(out), None


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str  # "numeric" | "categorical" | "ordinal"
    categories: tuple[str, ...] = ()  # categorical: the categories; ordinal: the levels, lowest first

    def __post_init__(self):
        if self.kind not in KINDS:
            raise _schema_error(f"feature {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind in LEVELED and len(set(self.categories)) != len(self.categories):
            raise _schema_error(f"feature {self.name!r}: duplicate categories")
        if self.kind == "ordinal" and not self.categories:
            raise _schema_error(f"feature {self.name!r}: an ordinal feature needs its ordered levels")
        if self.kind == "numeric" and self.categories:
            raise _schema_error(f"feature {self.name!r}: a numeric feature has no categories")


@dataclass(frozen=True)
class Schema:
    features: tuple[Feature, ...]
    label: str
    classes: tuple[str, ...]
    id_column: str | None = None
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise _schema_error(f"duplicate feature columns: {dup}")
        if self.label in names:
            raise _schema_error(f"label column {self.label!r} is also listed as a feature")
        if self.id_column is not None and self.id_column == self.label:
            raise _schema_error(f"column {self.label!r} is given as both the label and the id column: an id names a "
                                "row, it is not a class (give the label column and the id column each its own)")
        if self.id_column is not None and self.id_column in names:
            raise _schema_error(f"id column {self.id_column!r} is also listed as a feature")
        if len(self.classes) != len(set(self.classes)):
            raise _schema_error("duplicate class names in schema")
        self._index.update({n: i for i, n in enumerate(names)})

    # -- lookups -------------------------------------------------------------------------
    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.features]

    @property
    def categorical(self) -> list[str]:
        return [f.name for f in self.features if f.kind == "categorical"]

    @property
    def ordinal(self) -> list[str]:
        return [f.name for f in self.features if f.kind == "ordinal"]

    @property
    def numeric(self) -> list[str]:
        return [f.name for f in self.features if f.kind == "numeric"]

    def feature(self, name: str) -> Feature:
        try:
            return self.features[self._index[name]]
        except KeyError:
            raise DataError(f"unknown feature column {name!r}") from None

    def onehot_names(self) -> list[str]:
        """Column names of :meth:`Table.onehot`: a numeric or ordinal column (an ordinal one holds its codes) by
        its name, ``name=value`` per category of a categorical column (:func:`onehot_name`: a ``=`` in the name
        part is escaped, so no two columns can share a name and each splits back to its own column)."""
        out = []
        for f in self.features:
            if f.kind in ("numeric", "ordinal"):
                out.append(onehot_name(f.name))
            else:
                out.extend(onehot_name(f.name, c) for c in f.categories)
        return out

    def select(self, columns: list[str], keep_label: bool) -> "Schema":
        """The schema of a vertical party: some feature columns, with or without the label."""
        feats = tuple(self.feature(c) for c in columns)
        return Schema(feats, self.label, self.classes if keep_label else (), self.id_column)

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": SCHEMA_VERSION,
            "features": [
                {"name": f.name, "kind": f.kind, **({"categories": list(f.categories)} if f.kind in LEVELED else {})}
                for f in self.features
            ],
            "label": self.label,
            "classes": list(self.classes),
            "id_column": self.id_column,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Schema":
        """The schema of :meth:`to_dict`, every field checked (a schema file or a job's configuration is input)."""
        if not isinstance(d, dict):
            raise _schema_error("schema: expected a JSON object")
        version = d.get("version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise _schema_error(f"schema: unsupported version {_short(version)} (expected {SCHEMA_VERSION})")
        features = d.get("features")
        if not isinstance(features, (list, tuple)):
            raise _schema_error(f"schema: 'features' must be a list, got {type(features).__name__}")
        feats = []
        for i, f in enumerate(features):
            if not isinstance(f, dict):
                raise _schema_error(f"schema: features[{i}] must be an object, got {type(f).__name__}")
            name = _text(f.get("name"), f"features[{i}].name")
            categories = f.get("categories", [])
            if not isinstance(categories, (list, tuple)):
                raise _schema_error(f"schema: feature {name!r}: categories must be a list")
            levels = tuple(_text(c, f"feature {name!r}: categories[{k}]") for k, c in enumerate(categories))
            feats.append(Feature(name, _text(f.get("kind"), f"features[{i}].kind"), levels))
        classes = d.get("classes")
        if not isinstance(classes, (list, tuple)):
            raise _schema_error(f"schema: 'classes' must be a list, got {type(classes).__name__}")
        id_column = d.get("id_column")
        return cls(tuple(feats), _text(d.get("label"), "label"),
                   tuple(_text(c, f"classes[{k}]") for k, c in enumerate(classes)),
                   None if id_column is None else _text(id_column, "id_column"))


def _text(value, field: str) -> str:
    if not isinstance(value, str):
        raise _schema_error(f"schema: {field} must be a string, got {type(value).__name__}")
    return value


def _short(value) -> str:
    """A received value for a message: a short repr, or its type (a huge integer has no affordable repr)."""
    if isinstance(value, str) or value is None:
        return repr(value)[:60]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10 ** 12:
        return str(value)
    return type(value).__name__


def read_schema_file(path) -> Schema:
    """A schema JSON (``Schema.to_dict``; other keys are ignored) or a federation's ``partition.json`` (which
    holds one); errors name the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise DataError(f"{path}: schema file not found") from None
    except RecursionError:
        raise DataError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of thousands of digits
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("schema"), dict):
        doc = doc["schema"]
    try:
        return Schema.from_dict(doc)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
