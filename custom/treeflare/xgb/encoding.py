"""Turn the data layer's tables into XGBoost inputs, identically at every site.

Categorical columns become the integer codes of the SHARED schema's category list (``Table.codes``) and are
declared as XGBoost categorical features (``feature_types="c"``): a site never derives codes from its own
values, so code 3 of ``workclass`` means the same category everywhere. Vertical parties sort their rows by the
id column, so row i is the same entity at every party.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import DataError, Schema, Table, read_partition, read_site, read_site_csv
from ..data.federation import read_site_header

@dataclass
class Arrays:
    """One party's matrix: X (float32, NaN = missing / unknown category), y (class codes or None)."""
    X: np.ndarray
    y: np.ndarray | None
    feature_names: list[str]
    feature_types: list[str]  # "q" numeric, "c" categorical
    ids: np.ndarray | None = None

    @property
    def has_categorical(self) -> bool:
        return "c" in self.feature_types


def feature_types(schema: Schema) -> list[str]:
    return ["c" if k == "categorical" else "q" for k in schema.kinds]


def table_arrays(table: Table, *, sort_by_id: bool = False) -> Arrays:
    """Encode a table with its (shared) schema; optionally order rows by id (vertical alignment)."""
    X, names, _ = table.codes()
    y = table.y_codes() if table.y is not None else None
    ids = table.ids
    if sort_by_id:
        if ids is None:
            raise DataError(f"{table.name or 'table'}: vertical alignment needs an id column")
        order = id_order(ids)
        X, ids = X[order], ids[order]
        y = None if y is None else y[order]
    return Arrays(np.ascontiguousarray(X, dtype=np.float32), y, list(names), feature_types(table.schema), ids)


def id_order(ids: np.ndarray) -> np.ndarray:
    """A row order every party computes the same way from the ids alone."""
    return np.argsort(np.asarray(ids).astype(str), kind="stable")


def site_schema(root, site: str, schema: Schema) -> Schema:
    """The site's view of the shared schema: the feature columns in its train.csv header, label if present."""
    header = set(read_site_header(Path(root) / site / "train.csv"))
    cols = [c for c in schema.feature_names if c in header]
    return schema.select(cols, keep_label=schema.label in header)


def load_site(root, site: str, schema: Schema | dict | None = None, *, vertical: bool = False
              ) -> tuple[Arrays, Arrays]:
    """(train, valid) arrays of one site folder written by ``write_federation``.

    ``schema`` is the shared schema (as passed through the job configuration); without it, the one in
    ``partition.json`` is used.
    """
    if isinstance(schema, dict):
        schema = Schema.from_dict(schema)
    site_data = read_site(root, site, None if schema is None else site_schema(root, site, schema))
    return (table_arrays(site_data.train, sort_by_id=vertical),
            table_arrays(site_data.test, sort_by_id=vertical))


def federation_schema(root) -> Schema:
    return Schema.from_dict(read_partition(root)["schema"])


def federation_sites(root) -> list[str]:
    return list(read_partition(root)["sites"])


def is_vertical(root) -> bool:
    return read_partition(root)["partition"]["kind"] == "vertical"


def hstack_parties(parts: list[Arrays]) -> Arrays:
    """Join vertical parties' arrays side by side, in party order, on the ids they ALL hold, sorted by id (the
    rows a private set intersection keeps, in the order every party derives: ``data.join_parties``' rule);
    label from whoever has it."""
    if any(p.ids is None for p in parts):
        raise DataError("a vertical party's rows have no ids; cannot align them")
    keys = [np.array([str(v).strip() for v in p.ids], dtype=str) for p in parts]
    common = functools.reduce(np.intersect1d, keys)  # sorted, unique
    if len(common) == 0:
        raise DataError("vertical parties hold no row id in common; cannot align them")
    aligned = []
    for p, k in zip(parts, keys):
        if len(np.unique(k)) != len(k):
            raise DataError("a vertical party's row ids repeat; cannot align them")
        order = np.argsort(k, kind="stable")
        rows = order[np.isin(k[order], common)]
        aligned.append(Arrays(p.X[rows], None if p.y is None else p.y[rows], p.feature_names, p.feature_types,
                              p.ids[rows]))
    ys = [p.y for p in aligned if p.y is not None]
    return Arrays(np.ascontiguousarray(np.hstack([p.X for p in aligned])), ys[0] if ys else None,
                  [n for p in aligned for n in p.feature_names], [t for p in aligned for t in p.feature_types],
                  aligned[0].ids)


def vstack_sites(parts: list[Arrays]) -> Arrays:
    return Arrays(np.vstack([p.X for p in parts]), np.concatenate([p.y for p in parts]),
                  parts[0].feature_names, parts[0].feature_types)


def union_train(root) -> Arrays:
    """The centralized training set: horizontal = all sites' rows; vertical = all parties' columns joined on the
    ids every party holds, sorted by id (partial overlap: the intersection rows, as after PSI)."""
    schema = federation_schema(root)
    vertical = is_vertical(root)
    parts = [load_site(root, s, schema, vertical=vertical)[0] for s in federation_sites(root)]
    return hstack_parties(parts) if vertical else vstack_sites(parts)


def global_test(root) -> Arrays:
    """The server's held-out test set, with all features (vertical: joined from the parties' test columns)."""
    root = Path(root)
    schema = federation_schema(root)
    if not is_vertical(root):
        return table_arrays(read_site_csv(root / "server" / "test.csv", schema, site="server"))
    labels = read_site_csv(root / "server" / "test.csv", schema.select([], keep_label=True), site="server")
    parts = [load_site(root, s, schema, vertical=True)[1] for s in federation_sites(root)]
    joined = hstack_parties(parts)  # the test rows all parties hold, sorted by id
    position = {str(v).strip(): i for i, v in enumerate(labels.ids)}
    rows = [position.get(str(v).strip(), -1) for v in joined.ids]
    if -1 in rows:
        raise DataError(f"{root}: {rows.count(-1)} of the test rows all parties hold are not in server/test.csv")
    joined.y = labels.y_codes()[np.asarray(rows, dtype=np.int64)]
    return joined


def dmatrix(a: Arrays, *, data_split_mode=None, with_label: bool = True):
    """An ``xgboost.DMatrix`` with the shared feature types (categorical codes declared as categorical)."""
    import xgboost as xgb

    kw = {}
    if data_split_mode is not None:
        kw["data_split_mode"] = data_split_mode
    return xgb.DMatrix(a.X, label=a.y if (with_label and a.y is not None) else None,
                       feature_names=a.feature_names, feature_types=a.feature_types,
                       enable_categorical=a.has_categorical, nthread=1, **kw)
