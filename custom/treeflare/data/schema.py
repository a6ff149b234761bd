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
        """Column names of :meth:`Table.onehot`: numeric and ordinal columns as they are (an ordinal one holds
        its codes), ``name=value`` per category of a categorical column."""
        out = []
        for f in self.features:
            if f.kind in ("numeric", "ordinal"):
                out.append(f.name)
            else:
                out.extend(f"{f.name}={c}" for c in f.categories)
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
        if not isinstance(d, dict):
            raise _schema_error("schema: expected a JSON object")
        if d.get("version") != SCHEMA_VERSION:
            raise _schema_error(f"schema: unsupported version {d.get('version')!r} (expected {SCHEMA_VERSION})")
        try:
            for f in d["features"]:
                if not isinstance(f.get("categories", []), list):
                    raise _schema_error(f"schema: feature {f.get('name')!r}: categories must be a list")
            feats = tuple(
                Feature(str(f["name"]), str(f["kind"]), tuple(str(c) for c in f.get("categories", ())))
                for f in d["features"]
            )
            return cls(feats, str(d["label"]), tuple(str(c) for c in d["classes"]), d.get("id_column"))
        except (KeyError, TypeError) as exc:
            raise _schema_error(f"schema: malformed field ({exc})") from None


def read_schema_file(path) -> Schema:
    """A schema JSON (``Schema.to_dict``; other keys are ignored) or a federation's ``partition.json`` (which
    holds one); errors name the file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: schema file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("schema"), dict):
        doc = doc["schema"]
    try:
        return Schema.from_dict(doc)
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None
