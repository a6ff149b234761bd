"""The shared description of a dataset: feature names and kinds, category lists, classes.

Every site must encode its data identically, so the schema (not a site's local values) decides the
category codes, the one-hot columns and the class indices. It travels as plain JSON (in
``partition.json`` and in job configuration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import DataError

SCHEMA_VERSION = 1
KINDS = ("numeric", "categorical")


def _schema_error(message: str) -> DataError:
    # About the schema itself (names and kinds everyone shares), so the whole message may leave a site.
    return DataError(message, problem=message)


@dataclass(frozen=True)
class Feature:
    name: str
    kind: str  # "numeric" | "categorical"
    categories: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise _schema_error(f"feature {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "categorical" and len(set(self.categories)) != len(self.categories):
            raise _schema_error(f"feature {self.name!r}: duplicate categories")


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
    def numeric(self) -> list[str]:
        return [f.name for f in self.features if f.kind == "numeric"]

    def feature(self, name: str) -> Feature:
        try:
            return self.features[self._index[name]]
        except KeyError:
            raise DataError(f"unknown feature column {name!r}") from None

    def onehot_names(self) -> list[str]:
        """Column names of :meth:`Table.onehot`: numeric columns as they are, ``name=value`` per category."""
        out = []
        for f in self.features:
            if f.kind == "numeric":
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
                {"name": f.name, "kind": f.kind, **({"categories": list(f.categories)} if f.kind == "categorical" else {})}
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
            feats = tuple(
                Feature(str(f["name"]), str(f["kind"]), tuple(str(c) for c in f.get("categories", ())))
                for f in d["features"]
            )
            return cls(feats, str(d["label"]), tuple(str(c) for c in d["classes"]), d.get("id_column"))
        except (KeyError, TypeError) as exc:
            raise _schema_error(f"schema: malformed field ({exc})") from None
