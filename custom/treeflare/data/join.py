"""Vertical parties' tables joined on the ids they all hold: what a centralized model of the federation trains on.

The plaintext oracle and the centralized baselines of the vertical jobs see exactly the rows a private set
intersection keeps: the ids every party holds, **sorted by id** (the same rule as
:func:`treeflare.data.intersection.restrict`, so row i is the same customer here and at every party).
"""

from __future__ import annotations

import pandas as pd

from .errors import DataError
from .intersection import restrict
from .schema import Schema
from .table import Table


def common_ids(tables) -> list[str]:
    """The ids (as stripped strings) every table holds, sorted."""
    common: set[str] | None = None
    for i, t in enumerate(tables):
        if t.ids is None:
            raise DataError(f"{t.name or f'party {i + 1}'}: its rows have no id column; vertical parties join on ids",
                            problem="no id column", site=t.name or None)
        ids = {str(v).strip() for v in t.ids}
        if len(ids) != len(t.ids):
            raise DataError(f"{t.name or f'party {i + 1}'}: its ids repeat; vertical parties join on unique ids",
                            problem="duplicate id", site=t.name or None)
        common = ids if common is None else common & ids
    return sorted(common or ())


def join_parties(tables, *, name: str = "joined") -> Table:
    """The parties' tables joined on the ids they all hold, sorted by id; feature columns in party order; the
    label (and classes) from the first party that has one. Raises DataError when no id is held by all."""
    tables = list(tables)
    if not tables:
        raise DataError("join_parties: no party tables to join")
    kept = common_ids(tables)
    if not kept:
        raise DataError(f"the {len(tables)} parties hold no id in common; nothing to join",
                        problem="no id in common")
    parts = [restrict(t, kept, site=t.name) for t in tables]
    labelled = [p for p in parts if p.y is not None]
    first = tables[0].schema
    schema = Schema(tuple(f for p in parts for f in p.schema.features), first.label,
                    labelled[0].schema.classes if labelled else (), first.id_column)
    frame = pd.concat([p.frame for p in parts], axis=1)
    return Table(frame, labelled[0].y if labelled else None, schema, parts[0].ids, name)
