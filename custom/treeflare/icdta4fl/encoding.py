"""How each learner sees a table: CART on one-hot columns, ID3 on category codes.

Both encodings come from the shared schema, so every site (and the server) builds the same columns.
"""

from __future__ import annotations

import numpy as np

from ..data import Schema, Table

ALGORITHMS = ("id3", "cart")


def feature_space(schema: Schema, algorithm: str) -> tuple[list[str], list[str], list]:
    """(names, kinds, n_categories) of the matrix :func:`encode` builds."""
    if algorithm == "cart":
        names = schema.onehot_names()
        return names, ["numeric"] * len(names), [None] * len(names)
    if algorithm == "id3":
        return (schema.feature_names, schema.kinds,
                [len(f.categories) if f.kind == "categorical" else None for f in schema.features])
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")


def encode(table: Table, algorithm: str) -> np.ndarray:
    if algorithm == "cart":
        return table.onehot()[0]
    if algorithm == "id3":
        return table.codes()[0]
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
