"""Schema discovery: the sites describe their own data, the server unions the descriptions and checks they agree.

Each site turns its bound training file into a *profile* (:func:`site_profile`), which is all it reveals:

* every column's name and inferred kind (``numeric``, ``categorical``, ``ordinal`` when the job declared it,
  ``empty`` when no cell holds a value);
* for a categorical column, the values seen in at least ``k`` rows at this site (``k`` = ``min_category_rows``:
  the site's own floor, default :data:`DEFAULT_MIN_CATEGORY_ROWS`, or the job's if higher); rarer values are not
  reported. Numeric columns report no values at all, and a job may declare a column this site reads as numbers
  categorical or ordinal only if the site allows it (``categorical_allowed``);
* for a declared ordinal column, one flag and no count: whether a value held by at least ``k`` rows is not one
  of the declared levels (a rarer value never changes the reply);
* the class labels (all of them: a row whose class the schema lacks could not be read), and the row count;
* which column it holds as the label and as the id (the job's names, or the names in the site's binding).

In a vertical federation the server also records which party holds each column (:func:`column_parties`, from
which site's reply listed it), so a reviewer of ``schema.json`` sees who holds what.

The server checks each profile against fixed bounds (:func:`check_profile`: a hostile site cannot make it
allocate or loop without limit) and merges them (:func:`merge_profiles`): category lists are the union of the
reported values, sorted, so row order, category order and rare values at any site do not change the schema.
Disagreements (a column missing at a site, numeric at one site and categorical at another, label or id named
differently, values outside a declared ordinal column's levels, and in a vertical federation a column held by
two parties) raise one :class:`SchemaConflict` listing every problem with its sites and columns.

A rare value that no site reports is not in the schema: at training it reads as an unknown category (treated as
missing) in a categorical column; in an ordinal column a value outside the levels held by fewer than ``k`` rows
is not flagged here (that would tell the server it exists) and training stops at it, naming the column and line.
"""

from __future__ import annotations

import numbers

import pandas as pd

from .csv_io import _is_missing, check_levels, class_sort_key, infer_kind, normalise_labels
from .errors import DataError, where
from .schema import Feature, Schema

PROFILE_VERSION = 2  # 2: an ordinal column reports the flag "undeclared", no longer a count of rows
DEFAULT_MIN_CATEGORY_ROWS = 5
PROFILE_KINDS = ("numeric", "categorical", "ordinal", "empty")
# Bounds on what a site may report; a profile beyond them is refused (and so is the site's data, at the site).
MAX_COLUMNS = 5_000
MAX_NAME_CHARS = 200  # a column, label, id or site name, a category value or a class label
MAX_CATEGORIES = 5_000  # reported values of one column
MAX_TOTAL_VALUES = 100_000  # reported values of all columns together
MAX_CLASSES = 1_000
MAX_ROWS = 10**12
MAX_MIN_CATEGORY_ROWS = 10**9
_PROFILE_KEYS = {"version", "min_category_rows", "n_rows", "label", "id_column", "classes", "columns"}
_COLUMN_KEYS = {"name", "kind", "values", "undeclared"}
_SHOWN_CONFLICTS = 25


class SchemaConflict(DataError):
    """The sites' data disagree; ``conflicts`` lists each problem (naming sites and columns, never a value)."""

    def __init__(self, conflicts: list[str]):
        shown = conflicts[:_SHOWN_CONFLICTS]
        more = len(conflicts) - len(shown)
        text = "the sites' data disagree, so no common schema exists:\n  - " + "\n  - ".join(shown)
        if more:
            text += f"\n  - ... and {more} more"
        super().__init__(text, problem=text)
        self.conflicts = list(conflicts)


def check_min_category_rows(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= MAX_MIN_CATEGORY_ROWS:
        raise DataError(f"--min-category-rows must be an integer >= 1 (at most {MAX_MIN_CATEGORY_ROWS:,}), got {k!r}")
    return int(k)


def site_min_category_rows(requested, site_floor: int | None = None) -> int:
    """The ``k`` a site uses: the job's request, but never below the site's own floor (its binding's
    ``min_category_rows``, else :data:`DEFAULT_MIN_CATEGORY_ROWS`); the site decides, not the job."""
    floor = DEFAULT_MIN_CATEGORY_ROWS if site_floor is None else check_min_category_rows(site_floor)
    return max(check_min_category_rows(requested), floor)


# -- at a site ------------------------------------------------------------------------------------
def site_profile(raw: pd.DataFrame, *, label: str | None = None, id_column: str | None = None,
                 categorical=(), ordinal: dict | None = None, min_category_rows: int = DEFAULT_MIN_CATEGORY_ROWS,
                 categorical_allowed=(), file="data", site=None) -> dict:
    """What a site reports about ``raw`` (every cell a string, columns under the job's names).

    ``label``/``id_column``: the columns to treat as label and id when present (absent: reported as None, the
    server decides whether that is a conflict). ``categorical``: columns declared categorical (not inferred).
    ``ordinal``: declared ordinal columns and their levels, lowest first. A value is reported (or flagged as
    outside an ordinal column's levels) only when at least ``min_category_rows`` rows of ``raw`` hold it.
    ``categorical_allowed``: the columns this site lets a job declare categorical or ordinal although it reads
    them as numbers (the site's binding). Raises DataError for data no schema could describe (a mostly numeric
    column with a typo, a missing label, too many distinct values) and for a declaration the site does not allow.
    """
    k = check_min_category_rows(min_category_rows)
    at = where(file, site=site or None)  # the start of every error message
    ordinal = {c: check_levels(c, levels) for c, levels in (ordinal or {}).items()}
    forced = set(categorical or ())
    allowed = set(categorical_allowed or ())
    columns = [str(c) for c in raw.columns]
    _check_reported_names(columns, file, site)
    has_label = label is not None and label in columns
    has_id = id_column is not None and id_column in columns
    profile_columns, total = [], 0
    for name in columns:
        if (has_label and name == label) or (has_id and name == id_column):
            continue
        col = raw[name]
        if (name in ordinal or name in forced) and name not in allowed and _reads_as_numbers(col, name, file, site):
            declared = "ordinal" if name in ordinal else "categorical"
            why = (f"the job declares it {declared}, but this site reads it as numbers and its binding does not "
                   f"allow their values to be reported (list the column in \"categorical_allowed\")")
            raise DataError(f"{at}: column {name!r}: {why}", problem=why, file=file, column=name, site=site)
        if name in ordinal:
            levels = set(ordinal[name])
            # a flag over the values k rows hold: a count, or a rarer value, would answer "how many rows hold
            # the levels" / "does this rare value exist" for whatever levels the job declares
            entry = {"name": name, "kind": "ordinal",
                     "undeclared": any(v not in levels for v in _frequent_values(col, k))}
        else:
            kind = "categorical" if name in forced else infer_kind(col, column=name, file=file, site=site)
            if kind == "categorical" and not (~_is_missing(col)).any():
                kind = "empty"
            entry = {"name": name, "kind": kind}
            if kind == "categorical":
                entry["values"] = _frequent_values(col, k)
        values = entry.get("values", [])
        if len(values) > MAX_CATEGORIES:
            raise DataError(f"{at}: column {name!r}: {len(values)} distinct values are each seen in "
                            f"{k} rows or more, more than the {MAX_CATEGORIES} a schema may list; is it an id "
                            "column (--id), or a numeric column with text in it?",
                            problem=f"more than {MAX_CATEGORIES} distinct categories", file=file, column=name,
                            site=site)
        for v in values:
            if len(v) > MAX_NAME_CHARS:
                raise DataError(f"{at}: column {name!r}: a value is longer than {MAX_NAME_CHARS} "
                                "characters", problem=f"a category value is longer than {MAX_NAME_CHARS} characters",
                                file=file, column=name, site=site)
        total += len(values)
        profile_columns.append(entry)
    if total > MAX_TOTAL_VALUES:
        raise DataError(f"{at}: {total} category values in all, more than {MAX_TOTAL_VALUES}",
                        problem=f"more than {MAX_TOTAL_VALUES} category values in all", file=file, site=site)
    classes = []
    if has_label:
        labels = normalise_labels(raw[label], file=file, column=label, site=site)
        classes = sorted(set(labels.tolist()), key=class_sort_key)
        if len(classes) > MAX_CLASSES or any(len(c) > MAX_NAME_CHARS for c in classes):
            raise DataError(f"{at}: label column {label!r}: more than {MAX_CLASSES} classes, or a "
                            f"class name longer than {MAX_NAME_CHARS} characters",
                            problem="too many classes, or a class name too long", file=file, column=label,
                            site=site)
    return {"version": PROFILE_VERSION, "min_category_rows": k, "n_rows": int(len(raw)),
            "label": label if has_label else None, "id_column": id_column if has_id else None,
            "classes": classes, "columns": profile_columns}


def _reads_as_numbers(col: pd.Series, name, file, site) -> bool:
    """Whether this site would infer ``col`` numeric (or refuse it as a mostly numeric column with a typo)."""
    try:
        return infer_kind(col, column=name, file=file, site=site) == "numeric"
    except DataError:
        return True


def _frequent_values(col: pd.Series, k: int) -> list[str]:
    present = col[~_is_missing(col)].str.strip()
    counts = present.value_counts()
    return sorted(str(v) for v, n in counts.items() if n >= k)


def _check_reported_names(columns: list[str], file, site) -> None:
    at = where(file, site=site or None)
    if len(columns) > MAX_COLUMNS:
        raise DataError(f"{at}: {len(columns)} columns, more than the {MAX_COLUMNS} a schema may hold",
                        problem=f"more than {MAX_COLUMNS} columns", file=file, site=site)
    for i, name in enumerate(columns):
        if len(name) > MAX_NAME_CHARS:
            raise DataError(f"{at}: the name of column {i + 1} is longer than {MAX_NAME_CHARS} "
                            "characters", problem=f"column {i + 1}: name longer than {MAX_NAME_CHARS} characters",
                            file=file, site=site)


# -- at the server --------------------------------------------------------------------------------
def check_profile(profile, site: str, *, declared_ordinal: dict | None = None, min_category_rows: int = 1) -> dict:
    """``profile`` as a site sent it, checked against the bounds of this module and the job's own declarations
    (its ordinal levels; ``min_category_rows``, which a site may raise but not lower); returns a clean copy.
    Raises DataError naming the site and the field, never quoting what it sent."""
    def bad(field: str, why: str) -> DataError:
        return DataError(f"{site}: invalid schema-discovery reply: {field}: {why}", site=site,
                         problem=f"invalid schema-discovery reply: {field}: {why}")

    def name(value, field: str, *, optional: bool = False):
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_CHARS or value != value.strip():
            raise bad(field, f"expected a non-empty trimmed string of at most {MAX_NAME_CHARS} characters")
        return value

    def strings(value, field: str, limit: int) -> list[str]:
        if not isinstance(value, list):
            raise bad(field, "expected a list")
        if len(value) > limit:
            raise bad(field, f"more than {limit} entries")
        out = [name(v, f"{field}[{i}]") for i, v in enumerate(value)]
        if len(set(out)) != len(out):
            raise bad(field, "an entry is listed twice")
        return out

    def count(value, field: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= value <= hi:
            raise bad(field, f"expected an integer in [{lo}, {hi}]")
        return int(value)

    declared_ordinal = declared_ordinal or {}
    if not isinstance(profile, dict):
        raise bad("reply", "expected an object")
    unknown = set(profile) - _PROFILE_KEYS
    missing = _PROFILE_KEYS - set(profile)
    if unknown or missing:
        raise bad("reply", f"{len(unknown)} unknown key(s)" if unknown else f"missing {sorted(missing)}")
    version = profile["version"]  # an exact int: a numpy array here would make == ambiguous, not false
    if isinstance(version, bool) or not isinstance(version, int) or version != PROFILE_VERSION:
        raise bad("version", f"expected {PROFILE_VERSION}")
    out = {"version": PROFILE_VERSION,
           "min_category_rows": count(profile["min_category_rows"], "min_category_rows", min_category_rows,
                                      MAX_MIN_CATEGORY_ROWS),
           "n_rows": count(profile["n_rows"], "n_rows", 1, MAX_ROWS),
           "label": name(profile["label"], "label", optional=True),
           "id_column": name(profile["id_column"], "id_column", optional=True)}
    out["classes"] = strings(profile["classes"], "classes", MAX_CLASSES)
    if out["label"] is None and out["classes"]:
        raise bad("classes", "classes without a label column")
    if out["label"] is not None and not out["classes"]:
        raise bad("classes", "a label column without classes")
    columns = profile["columns"]
    if not isinstance(columns, list) or len(columns) > MAX_COLUMNS:
        raise bad("columns", f"expected a list of at most {MAX_COLUMNS} columns")
    clean, names, total = [], set(), 0
    for i, col in enumerate(columns):
        field = f"columns[{i}]"
        if not isinstance(col, dict) or not {"name", "kind"} <= set(col) or set(col) - _COLUMN_KEYS:
            raise bad(field, "expected an object with name, kind and (for categories) values")
        cname = name(col["name"], f"{field}.name")
        if cname in names or cname in (out["label"], out["id_column"]):
            raise bad(field, "a column name is listed twice (or is also the label or id column)")
        names.add(cname)
        kind = col["kind"]
        if not isinstance(kind, str) or kind not in PROFILE_KINDS:
            raise bad(f"{field}.kind", f"expected one of {PROFILE_KINDS}")
        entry = {"name": cname, "kind": kind}
        if kind == "categorical":
            entry["values"] = strings(col.get("values"), f"{field}.values", MAX_CATEGORIES)
            total += len(entry["values"])
            if total > MAX_TOTAL_VALUES:
                raise bad("columns", f"more than {MAX_TOTAL_VALUES} category values in all")
        elif "values" in col:
            raise bad(f"{field}.values", f"a {kind} column reports no values")
        if kind == "ordinal":
            if cname not in declared_ordinal:
                raise bad(f"{field}.kind", "ordinal, but the job declared no levels for this column")
            flag = col.get("undeclared")
            if not isinstance(flag, bool):
                raise bad(f"{field}.undeclared", "expected true or false")
            entry["undeclared"] = flag
        elif "undeclared" in col:
            raise bad(f"{field}.undeclared", "only an ordinal column reports it")
        clean.append(entry)
    out["columns"] = clean
    return out


def merge_profiles(profiles: dict[str, dict], *, ordinal: dict | None = None, vertical: bool = False,
                   site_order: list[str] | None = None) -> Schema:
    """One schema from the sites' (checked) profiles, or :class:`SchemaConflict` listing every disagreement.

    ``ordinal``: the job's declared ordinal columns (their levels become the schema's). ``site_order``: the
    sites in order (default: as given); the schema's columns follow the first site's column order
    (``vertical``: the active party, the first site, then each passive party's columns in site order).
    """
    sites = list(site_order or profiles)
    if set(sites) != set(profiles) or not sites:
        raise ValueError("site_order must list exactly the profiled sites")
    ordinal = {c: tuple(levels) for c, levels in (ordinal or {}).items()}
    conflicts: list[str] = []
    active = sites[0]
    labelled = sites[:1] if vertical else sites

    # label and id column: named the same everywhere they must be
    label = _agreed_name(profiles, labelled, "label", "label column", conflicts,
                         hint="pass --label NAME, and map each site's own name with label_column in its binding")
    if vertical:
        for s in sites[1:]:
            if profiles[s]["label"] is not None:
                conflicts.append(f"{s} is a passive party but holds the label column {profiles[s]['label']!r}; "
                                 f"only the active party ({active}) may")
    ids = {s: profiles[s]["id_column"] for s in sites}
    id_column = None
    if vertical or any(v is not None for v in ids.values()):
        id_column = _agreed_name(profiles, sites, "id_column", "id column", conflicts,
                                 hint="pass --id NAME, and map each site's own name with id_column in its binding")

    # feature columns
    holders: dict[str, list[str]] = {}
    for s in sites:
        for col in profiles[s]["columns"]:
            holders.setdefault(col["name"], []).append(s)
    by_site = {s: {c["name"]: c for c in profiles[s]["columns"]} for s in sites}
    for special in (label, id_column):
        if special is not None and special in holders:
            conflicts.append(f"column {special!r} is the {'label' if special == label else 'id'} column at some "
                             f"sites but a feature at {_names(holders[special])}")
    if vertical:
        for name, at in holders.items():
            if len(at) > 1:
                conflicts.append(f"column {name!r} is held by {_names(at)}; in a vertical federation each feature "
                                 "column belongs to one party")
        n_rows = {s: profiles[s]["n_rows"] for s in sites}
        if len(set(n_rows.values())) > 1:
            conflicts.append("the parties hold different numbers of rows (" +
                             ", ".join(f"{s}: {n}" for s, n in n_rows.items()) +
                             "); vertical parties must hold the same ids")
        order = [c["name"] for s in sites for c in profiles[s]["columns"]]
        order = list(dict.fromkeys(order))
    else:
        for name, at in holders.items():
            lacking = [s for s in sites if s not in at]
            if lacking:
                conflicts.append(f"column {name!r} is missing at {_names(lacking)} (present at {_names(at)})")
        order = [c["name"] for c in profiles[active]["columns"]]
        order += [n for n in holders if n not in order]
    for name in ordinal:
        if name not in holders:
            conflicts.append(f"--ordinal column {name!r} is not a feature column at any site")

    features = []
    for name in order:
        if name in (label, id_column):
            continue
        entries = {s: by_site[s][name] for s in holders[name]}
        kinds = {s: e["kind"] for s, e in entries.items() if e["kind"] != "empty"}
        distinct = sorted(set(kinds.values()))
        if not distinct:
            conflicts.append(f"column {name!r} holds no values at any site; remove it from the sites' files")
            continue
        if len(distinct) > 1:
            by_kind = {k: [s for s, v in kinds.items() if v == k] for k in distinct}
            conflicts.append(f"column {name!r} is " + " but ".join(f"{k} at {_names(at)}" for k, at in by_kind.items())
                             + f"; fix the values, or declare it with --categorical {name}")
            continue
        kind = distinct[0]
        if kind == "ordinal":
            levels = ordinal.get(name)
            if levels is None:
                conflicts.append(f"column {name!r} is reported ordinal, but the job declared no levels for it")
                continue
            for s, e in entries.items():
                if e.get("undeclared"):
                    conflicts.append(f"ordinal column {name!r}: {s} holds a value in "
                                     f"{profiles[s]['min_category_rows']} rows or more that is not one of the "
                                     f"declared levels {' < '.join(levels)}")
            features.append(Feature(name, "ordinal", levels))
        elif kind == "categorical":
            values = sorted({v for e in entries.values() for v in e.get("values", ())})
            if not values:
                k = max(e.get("min_category_rows", 0) for e in profiles.values())
                conflicts.append(f"categorical column {name!r}: no value is seen in {k} rows or more at any site, so "
                                 "none may be reported; remove the column (a job's --min-category-rows lowers k "
                                 "only down to each site's own floor)")
                continue
            features.append(Feature(name, "categorical", tuple(values)))
        else:
            features.append(Feature(name, "numeric"))
    if not order or (not features and not conflicts):
        conflicts.append("no feature columns besides the label and id")

    classes = sorted({c for s in labelled for c in profiles[s]["classes"]}, key=class_sort_key)
    if label is not None and len(classes) < 2:
        conflicts.append(f"label column {label!r} holds a single class at every site; need at least 2")
    if conflicts:
        raise SchemaConflict(conflicts)
    return Schema(tuple(features), label, tuple(classes), id_column)


def _agreed_name(profiles, sites, key, what, conflicts, hint) -> str | None:
    named = {s: profiles[s][key] for s in sites}
    lacking = [s for s, v in named.items() if v is None]
    distinct = sorted({v for v in named.values() if v is not None})
    if lacking:
        conflicts.append(f"no {what} at {_names(lacking)}: {hint}")
    if len(distinct) > 1:
        conflicts.append(f"the {what} is named differently: " +
                         ", ".join(f"{v!r} at {_names([s for s, x in named.items() if x == v])}" for v in distinct)
                         + f"; {hint}")
    return distinct[0] if len(distinct) == 1 and not lacking else None


def _names(sites: list[str]) -> str:
    return ", ".join(sites)


def column_parties(profiles: dict[str, dict], schema: Schema) -> dict[str, str]:
    """Vertical: which party holds each feature column of ``schema``, in schema order. ``profiles`` are the
    checked profiles keyed by the site that sent each (the server's name for the reply's sender, never a field of
    the reply), so a site can only claim the columns its own profile lists; :func:`merge_profiles` has already
    refused a column listed by two parties."""
    holder = {c["name"]: s for s, p in profiles.items() for c in p["columns"]}
    return {f.name: holder[f.name] for f in schema.features}


def discovery_summary(profiles: dict[str, dict], schema: Schema) -> dict:
    """What schema.json records about the discovery (no values): per site its rows and columns, and k."""
    return {"min_category_rows": max(p["min_category_rows"] for p in profiles.values()),
            "sites": {s: {"n_rows": p["n_rows"], "n_columns": len(p["columns"]),
                          "min_category_rows": p["min_category_rows"]} for s, p in profiles.items()},
            "n_features": len(schema.features)}


__all__ = ["DEFAULT_MIN_CATEGORY_ROWS", "SchemaConflict", "check_min_category_rows", "check_profile",
           "column_parties", "discovery_summary", "merge_profiles", "site_min_category_rows", "site_profile"]
