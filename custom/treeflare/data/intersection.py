"""The rows a private set intersection keeps, in one order every party derives on its own.

PSI (``treeflare.flare.psi``, on NVFlare's DH-PSI) tells each vertical party which of its ids every other party
also holds. This module is the pure part around it, used by every vertical job at every party:

* :func:`check_ids` -- a party's ids before any leaves it: no party without rows, no blank or duplicate id;
  errors name the site, the file, the column and a line, never an id;
* :func:`psi_items` / :func:`split_items` -- what PSI compares: one string per row, its kind (``train``,
  ``test``, ``predict``) in front, so a training row only ever matches a training row;
* :func:`write_intersection` / :func:`read_intersection` -- the file each party keeps in its own workspace;
* :func:`restrict` -- the party's rows restricted to the intersection and **sorted by id**: every party sorts the
  same set the same way, so row i is the same customer everywhere and no order crosses the wire.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .csv_io import MISSING
from .errors import DataError, where
from .table import Table

KINDS = ("train", "test", "predict")
SEP = ":"
INTERSECTION_FILE = "intersection.json"
FORMAT = "treeflare.psi.intersection"
# The smallest intersection a vertical job trains on (``--psi-min-rows``). With fewer shared customers, a tree
# with the default 10 rows per node has a handful of leaves, and each aggregate the active party decrypts covers
# so few rows that it says a lot about each of them.
DEFAULT_MIN_ROWS = 50


def check_ids(ids, *, site: str, kind: str = "train", file: str | None = None, column: str | None = None) -> None:
    """Refuse a party's ids that PSI cannot use: none at all, a blank one, or one that repeats.

    The message names the site, file, column and the (1-based, header = 1) line of the first bad row, and how
    many rows are bad; never the id itself, since the error may reach the server."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    ids = np.asarray([] if ids is None else ids, dtype=object)
    if len(ids) == 0:
        raise DataError(f"{where(file, column, site=site)}: no {kind} rows; a party with no rows cannot take part",
                        problem=f"no {kind} rows", file=file, column=column, site=site)
    # a missing cell (None, or NaN from a numeric read) is an empty id, not the text "nan"
    text = np.array([("" if v is None or (isinstance(v, float) and v != v) else str(v)).strip() for v in ids],
                    dtype=object)
    # and so is every marker the CSV reader reads as missing ("NA", "?", "null", ...): training would refuse it later
    blank = np.flatnonzero(np.isin(text.astype(str), MISSING))
    if blank.size:
        line = int(blank[0]) + 2
        raise DataError(f"{where(file, column, line, site)}: {blank.size} {kind} row(s) with an empty id; every "
                        f"row needs its own id", problem="empty id", file=file, column=column, line=line, site=site)
    seen: set = set()
    repeats = []
    for i, v in enumerate(text):
        if v in seen:
            repeats.append(i)
        seen.add(v)
    if repeats:  # the line of the first row whose id an earlier row has: a line, never the value
        line = repeats[0] + 2
        raise DataError(f"{where(file, column, line, site)}: {len(repeats)} {kind} row(s) repeat the id of an "
                        f"earlier row; ids must be unique at a party", problem="duplicate id", file=file,
                        column=column, line=line, site=site)


def psi_items(ids_by_kind: dict) -> list[str]:
    """The strings PSI compares: ``"<kind>:<id>"`` for every row of every kind given."""
    items = []
    for kind, ids in ids_by_kind.items():
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        items.extend(f"{kind}{SEP}{str(v).strip()}" for v in ids)
    return items


def split_items(items, *, site: str = "") -> dict[str, list[str]]:
    """PSI's result back into sorted ids per kind; a string of no known kind is refused (naming no value)."""
    out: dict[str, list[str]] = {}
    for item in items:
        kind, sep, value = str(item).partition(SEP)
        if not sep or kind not in KINDS or not value:
            raise DataError(f"{site or 'party'}: the intersection holds an item of no known kind",
                            problem="malformed intersection item", site=site or None)
        out.setdefault(kind, []).append(value)
    return {k: sorted(v) for k, v in out.items()}


def write_intersection(folder, items, *, site: str = "") -> Path:
    """Keep PSI's result in ``folder/intersection.json`` (atomically: a crash leaves the old file or none)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": 1, "ids": split_items(items, site=site)}
    path = folder / INTERSECTION_FILE
    tmp = folder / f".{INTERSECTION_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


def read_intersection(folder, *, site: str = "") -> dict[str, list[str]]:
    """The ids per kind that ``write_intersection`` kept, checked (sorted, unique strings)."""
    path = Path(folder) / INTERSECTION_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{site or 'party'}: no intersection in its workspace; the PSI phase did not run",
                        problem="no intersection (the PSI phase did not run)", site=site or None) from None
    except (OSError, ValueError):
        raise DataError(f"{site or 'party'}: its intersection file cannot be read", problem="unreadable intersection",
                        site=site or None) from None
    ids = doc.get("ids") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(ids, dict) or any(k not in KINDS or not isinstance(v, list) for k, v in ids.items()):
        raise DataError(f"{site or 'party'}: its intersection file is not one treeflare wrote",
                        problem="malformed intersection file", site=site or None)
    for v in ids.values():
        if any(not isinstance(x, str) for x in v) or v != sorted(set(v)):
            raise DataError(f"{site or 'party'}: its intersection file is not one treeflare wrote",
                            problem="malformed intersection file", site=site or None)
    return ids


def restrict(table: Table, kept, *, site: str = "", kind: str = "train") -> Table:
    """``table``'s rows whose id is in ``kept``, sorted by id (the order every party derives locally).

    Every kept id must be one of the table's (an intersection names only ids the party itself gave)."""
    if table.ids is None:
        raise DataError(f"{site or table.name or 'party'}: its {kind} rows have no id column; PSI needs one",
                        problem="no id column", site=site or None)
    ids = np.array([str(v).strip() for v in table.ids], dtype=object)
    index = {v: i for i, v in enumerate(ids)}
    kept = sorted(set(str(v) for v in kept))
    missing = sum(1 for v in kept if v not in index)
    if missing:
        raise DataError(f"{site or table.name or 'party'}: {missing} id(s) of its {kind} intersection are not among "
                        f"its own rows", problem="intersection names ids the party does not hold", site=site or None)
    rows = np.fromiter((index[v] for v in kept), dtype=np.int64, count=len(kept))
    return table.subset(rows)
