"""A table of rows described by a :class:`Schema`, and its numeric encodings.

``frame`` holds the feature columns only: numeric columns as float64, categorical columns as
strings (NaN = missing). ``y`` holds class names (or is None at a vertical passive party).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .errors import DataError
from .schema import Schema


@dataclass
class Table:
    frame: pd.DataFrame
    y: np.ndarray | None
    schema: Schema
    ids: np.ndarray | None = None
    name: str = ""

    def __post_init__(self):
        if list(self.frame.columns) != self.schema.feature_names:
            raise DataError(
                f"{self.name or 'table'}: columns {list(self.frame.columns)} do not match the schema "
                f"{self.schema.feature_names}"
            )
        if self.y is not None and len(self.y) != len(self.frame):
            raise DataError(f"{self.name or 'table'}: {len(self.y)} labels for {len(self.frame)} rows")

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def n_features(self) -> int:
        return self.frame.shape[1]

    def subset(self, rows, name: str | None = None) -> "Table":
        rows = np.asarray(rows)
        return Table(
            self.frame.iloc[rows].reset_index(drop=True),
            None if self.y is None else self.y[rows],
            self.schema,
            None if self.ids is None else self.ids[rows],
            self.name if name is None else name,
        )

    def columns(self, columns: list[str], keep_label: bool, name: str | None = None) -> "Table":
        """The same rows restricted to some feature columns (a vertical party's view)."""
        return Table(
            self.frame[columns].copy(),
            self.y if keep_label else None,
            self.schema.select(columns, keep_label),
            self.ids,
            self.name if name is None else name,
        )

    def with_row_ids(self, column: str = "row_id") -> "Table":
        """The same table with generated ids 0..n-1 when it has none (vertical parties join on ids)."""
        if self.schema.id_column and self.ids is not None:
            return self
        if column in self.schema.feature_names or column == self.schema.label:
            raise DataError(f"{self.name or 'table'}: cannot add id column {column!r}: the name is taken")
        from dataclasses import replace

        return Table(self.frame, self.y, replace(self.schema, id_column=column, _index={}),
                     np.array([str(i) for i in range(len(self.frame))], dtype=object), self.name)

    # -- encodings -----------------------------------------------------------------------
    def y_codes(self) -> np.ndarray:
        """Class indices into ``schema.classes`` (int64)."""
        if self.y is None:
            raise DataError(f"{self.name or 'table'}: this party holds no labels")
        index = {c: i for i, c in enumerate(self.schema.classes)}
        try:
            return np.fromiter((index[v] for v in self.y), dtype=np.int64, count=len(self.y))
        except KeyError as exc:
            raise DataError(f"{self.name or 'table'}: label {exc.args[0]!r} is not a known class "
                            f"{list(self.schema.classes)}", problem="a label is not a known class",
                            column=self.schema.label) from None

    def codes(self) -> tuple[np.ndarray, list[str], list[str]]:
        """(X, names, kinds): numeric columns as floats, categorical and ordinal columns as codes.

        Codes index the schema's category list (for an ordinal column, its levels lowest first: codes 0..k-1
        in the declared order); a missing or unseen category is NaN.
        """
        X = np.empty((len(self.frame), self.n_features), dtype=np.float64)
        for j, f in enumerate(self.schema.features):
            col = self.frame[f.name]
            if f.kind == "numeric":
                X[:, j] = col.to_numpy(dtype=np.float64)
            else:
                X[:, j] = _category_codes(col, f.categories)
        return X, self.schema.feature_names, self.schema.kinds

    def onehot(self) -> tuple[np.ndarray, list[str]]:
        """(X, names): numeric columns as they are, an ordinal column as ONE numeric column of its codes (its
        order is a number's), one 0/1 column per category of a categorical column (schema order)."""
        blocks = []
        for f in self.schema.features:
            col = self.frame[f.name]
            if f.kind == "numeric":
                blocks.append(col.to_numpy(dtype=np.float64)[:, None])
            elif f.kind == "ordinal":
                blocks.append(_category_codes(col, f.categories)[:, None])
            else:
                codes = _category_codes(col, f.categories)
                block = np.zeros((len(col), len(f.categories)), dtype=np.float64)
                known = ~np.isnan(codes)
                block[np.nonzero(known)[0], codes[known].astype(np.int64)] = 1.0
                blocks.append(block)
        X = np.hstack(blocks) if blocks else np.empty((len(self.frame), 0))
        return X, self.schema.onehot_names()

    def class_counts(self) -> dict[str, int]:
        if self.y is None:
            return {}
        values, counts = np.unique(self.y, return_counts=True)
        found = dict(zip(values.tolist(), counts.tolist()))
        return {c: int(found.get(c, 0)) for c in self.schema.classes}

    # -- CSV -----------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """Rows as written to a site's CSV: id column first, features, label last."""
        out = self.frame.copy()
        if self.ids is not None and self.schema.id_column:
            out.insert(0, self.schema.id_column, self.ids)
        if self.y is not None:
            out[self.schema.label] = self.y
        return out


def _category_codes(col: pd.Series, categories) -> np.ndarray:
    # Index lookup, not pd.Categorical: pandas deprecates (and will reject) values outside the categories.
    index = pd.Index(list(categories), dtype=object)
    codes = index.get_indexer(col.to_numpy(dtype=object)).astype(np.float64)
    codes[codes < 0] = np.nan
    return codes
