"""Reading a user's CSV (types inferred where not given) and reading site files against a schema."""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from . import csv_bounds
from .errors import COLUMNS, SITE_DATA, DataError, DataWarning, where
from .schema import Feature, Schema
from .separators import detect_separator, first_record, separator_hint
from .table import Table

MISSING = ("", "?", "NA", "N/A", "NaN", "nan", "null", "None")
# sklearn's trees and XGBoost compute in float32: a larger magnitude becomes infinity there.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# A column this numeric (share of parseable cells) with a few bad cells is a typo, not a category.
_MOSTLY_NUMERIC = 0.9


def read_raw(path, *, sep=None, header=True, names=None, skiprows=None, skipinitialspace=False, opener=None,
             max_columns: int | None = None, max_line_bytes: int | None = None, columns_why: str = ""):
    """Read every cell as a string; ``sep=None`` detects the separator (:func:`detect_separator`). Raises
    DataError for a missing or empty file, and (a file on disk) for a header of more than ``max_columns`` columns
    or a line longer than ``max_line_bytes``, checked before anything is parsed (``csv_bounds``)."""
    path = Path(path)
    if opener is None and not path.is_file():
        raise DataError(f"{path}: file not found", problem="file not found", file=path, kind=SITE_DATA)
    if opener is None and path.stat().st_size == 0:
        raise DataError(f"{path}: file is empty", problem="file is empty", file=path)
    if opener is None and (max_columns is not None or max_line_bytes is not None):
        sep = csv_bounds.check_bounds(path, sep=sep, max_columns=max_columns, columns_why=columns_why,
                                      max_line_bytes=max_line_bytes or csv_bounds.MAX_LINE_BYTES)
    if sep is None:
        sep = detect_separator(path, opener)
    try:
        source = opener() if opener else path
        # The header is read as a row of its own: pandas would silently rename a second "x" to "x.1".
        frame = pd.read_csv(
            source, sep=sep, header=None, names=names, dtype=str, keep_default_na=False,
            skiprows=skiprows, skipinitialspace=skipinitialspace, skip_blank_lines=True,
        )
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: file is empty", problem="file is empty", file=path) from None
    except pd.errors.ParserError as exc:
        hint = separator_hint(first_record(path, opener, sep))
        raise DataError(f"{path}: cannot parse as CSV ({str(exc).strip()}){hint}", problem=f"cannot parse as CSV{hint}",
                        file=path) from None
    except UnicodeDecodeError as exc:
        # pandas decodes in chunks and reports the offset inside its chunk: find the bad byte in the file itself
        found = _first_bad_utf8(opener() if opener else path.open("rb"))
        offset, line, reason = found if found else (None, None, exc.reason)
        at = f" at byte {offset}" if offset is not None else ""
        raise DataError(f"{where(path, line=line)}: not UTF-8 text ({reason}{at}); save the file as UTF-8",
                        problem="not UTF-8 text", file=path, line=line) from None
    if header and names is None and len(frame):
        frame.columns = [c if isinstance(c, str) else "" for c in frame.iloc[0]]
        frame = frame.iloc[1:].reset_index(drop=True)
    if frame.shape[0] == 0:
        raise DataError(f"{path}: no data rows", problem="no data rows", file=path)
    frame.columns = check_column_names([str(c).strip() for c in frame.columns], path)
    return frame


def read_prediction_rows(path, n_features: int, sep=None) -> pd.DataFrame:
    """New rows for a model of ``n_features`` features (:func:`read_raw`), within ``csv_bounds``'s bounds for them:
    at most max(COLUMNS_PER_FEATURE x n_features, MIN_MAX_COLUMNS) columns, lines of at most MAX_LINE_BYTES."""
    per, least = csv_bounds.COLUMNS_PER_FEATURE, csv_bounds.MIN_MAX_COLUMNS
    why = f" (a prediction reads at most {per} per model feature, and at least {least:,})"
    return read_raw(path, sep=sep, max_columns=max(per * n_features, least), max_line_bytes=csv_bounds.MAX_LINE_BYTES,
                    columns_why=why)


_SCAN_CHUNK = 1 << 20


def _first_bad_utf8(fh) -> tuple[int, int, str] | None:
    """(byte offset in the file, 1-based line, reason) of the first byte that is not UTF-8, reading ``fh`` (a
    binary file, closed here) in chunks; a character split across two chunks is joined first. None if none."""
    with fh:
        base, lines, carry = 0, 1, b""
        while True:
            chunk = fh.read(_SCAN_CHUNK)
            if isinstance(chunk, str):  # a text stream was decoded already
                return None
            data, last = carry + chunk, not chunk
            try:
                data.decode("utf-8")
                carry = b""
            except UnicodeDecodeError as exc:
                if exc.reason == "unexpected end of data" and not last and len(data) - exc.start < 4:
                    carry = data[exc.start:]  # a character the next chunk completes
                    data = data[:exc.start]
                else:
                    return base + exc.start, lines + data.count(b"\n", 0, exc.start), exc.reason
            if last:
                return None
            base += len(data)
            lines += data.count(b"\n")


def check_column_names(names: list[str], file) -> list[str]:
    """Column names as given, if each is non-empty and appears once (names are compared after stripping spaces,
    as they are used)."""
    for i, name in enumerate(names):
        if not name:
            raise DataError(f"{file}: column {i + 1} of the header has no name", problem="a column has no name",
                            file=file, line=1)
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise DataError(f"{where(file, name, 1)}: duplicate column name (columns {seen[name] + 1} and {i + 1}); "
                            "every column needs its own name", problem="duplicate column name", file=file,
                            column=name, line=1)
        seen[name] = i
    return names


def read_header(path, sep=None) -> list[str]:
    """The column names of a CSV file's first line, read by the CSV reader (a quoted name may hold a comma);
    ``sep=None`` detects the separator."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found", problem="file not found", file=path)
    if sep is None:
        sep = detect_separator(path)
    with path.open(newline="", encoding="utf-8-sig") as fh:
        try:
            first = next(csv.reader(fh, delimiter=sep), None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: cannot read the header ({exc})", problem="cannot read the header",
                            file=path) from None
    if not first:
        raise DataError(f"{path}: file is empty", problem="file is empty", file=path)
    return check_column_names([c.strip() for c in first], path)


def _is_missing(col: pd.Series) -> np.ndarray:
    return col.str.strip().isin(MISSING).to_numpy()


def _to_float(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col.str.strip().where(~_is_missing(col), None), errors="coerce").to_numpy(np.float64)


def parse_numeric(col: pd.Series, *, file, column, site=None, allow_missing=False) -> np.ndarray:
    values = _to_float(col)
    bad = np.isnan(values) & ~_is_missing(col)
    if not allow_missing:
        bad |= _is_missing(col)
    bad |= np.isinf(values)
    if bad.sum() > 1:
        lines, first = bad_lines(bad), col.iloc[int(np.argmax(bad))]
        raise DataError(
            f"{where(file, column, site=site)}: {cells_text(bad)} not numbers ({lines}; the first is {first!r}); "
            f"column {column!r} is numeric",
            problem=f"{cells_text(bad)} not numbers ({lines}; the column is numeric)", file=file, column=column,
            site=site)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{where(file, column, i + 2, site)}: {col.iloc[i]!r} is not a number "
            f"(column {column!r} is numeric)",
            problem="not a number (the column is numeric)", file=file, column=column, line=i + 2, site=site,
        )
    with np.errstate(invalid="ignore"):
        huge = np.abs(values) > FLOAT32_MAX
    if huge.any():
        i = int(np.argmax(huge))
        if huge.sum() > 1:
            raise DataError(
                f"{where(file, column, site=site)}: {cells_text(huge)} beyond the float32 range the learners use "
                f"(magnitude at most {FLOAT32_MAX:.4g}; {bad_lines(huge)}; the first is {col.iloc[i]!r}); rescale "
                f"column {column!r}",
                problem=f"{cells_text(huge)} beyond the float32 range ({bad_lines(huge)})", file=file, column=column,
                site=site)
        raise DataError(
            f"{where(file, column, i + 2, site)}: {col.iloc[i]!r} is beyond the float32 range the learners "
            f"use (magnitude at most {FLOAT32_MAX:.4g}); rescale column {column!r}",
            problem="number beyond the float32 range", file=file, column=column, line=i + 2, site=site,
        )
    return values


# how many bad lines an error names (the count says how many more there are)
SHOWN_LINES = 5


def cells_text(mask) -> str:
    """ "3 cells are" for a mask of 3 bad cells."""
    n = int(np.count_nonzero(mask))
    return f"{n:,} cells are" if n != 1 else "1 cell is"


def bad_lines(mask, shown: int = SHOWN_LINES) -> str:
    """The file lines of the first ``shown`` bad cells of a column (header = line 1), e.g. "lines 4, 9, 17" or
    "lines 4, 9, 17, 20, 31 and 12 more"; no cell value, so it may leave a site."""
    rows = np.flatnonzero(mask)
    text = ", ".join(str(int(r) + 2) for r in rows[:shown])
    more = f" and {len(rows) - shown:,} more" if len(rows) > shown else ""
    return f"line{'s' * (len(rows) != 1)} {text}{more}"


def normalise_labels(raw: pd.Series, *, file, column, site=None) -> np.ndarray:
    """Labels as class-name strings. A label that reads as a number is named by its value, cell by cell, so
    '1', '1.0' and ' 1 ' are one class ("1") and '2.50' is "2.5", whatever the other labels are."""
    miss = _is_missing(raw)
    if miss.any():
        i = int(np.argmax(miss))
        raise DataError(f"{where(file, column, i + 2, site)}: missing label", problem="missing label", file=file,
                        column=column, line=i + 2, site=site)
    stripped = raw.str.strip()
    values = pd.to_numeric(stripped, errors="coerce").to_numpy(np.float64)
    infinite = np.isinf(values)
    if infinite.any():
        i = int(np.argmax(infinite))
        raise DataError(f"{where(file, column, i + 2, site)}: label {raw.iloc[i]!r} is not a finite number",
                        problem="label is not a finite number", file=file, column=column, line=i + 2, site=site)
    out = stripped.to_numpy(dtype=object).copy()
    numeric = ~np.isnan(values)
    integral = numeric & (values == np.round(values)) & (np.abs(values) < 2.0 ** 62)
    out[integral] = values[integral].astype(np.int64).astype(str)
    other = numeric & ~integral
    out[other] = [repr(float(v)) for v in values[other]]
    return out


def infer_schema(frame: pd.DataFrame, *, label: str, categorical=None, id_column=None, file="data",
                 ordinal: dict | None = None) -> Schema:
    """Decide feature kinds: numeric if every present cell parses as a number, else categorical; ``ordinal``
    maps a column to its ordered levels (lowest first), which its values are then checked against."""
    columns = list(frame.columns)
    if label not in columns:
        raise DataError(f"{file}: label column {label!r} not found; columns are {columns}{separator_hint(columns)}")
    if id_column is not None and id_column not in columns:
        raise DataError(f"{file}: id column {id_column!r} not found; columns are {columns}{separator_hint(columns)}")
    if id_column is not None and id_column == label:
        raise DataError(f"{file}: --label and --id both name column {label!r}; an id names a row and is never a "
                        "class: give the label column and the id column each its own")
    feature_columns = [x for x in columns if x not in (label, id_column)]
    forced = list(categorical or [])
    for c in forced:
        if c not in feature_columns:
            raise DataError(f"{file}: --categorical column {c!r} is not a feature column; features are "
                            f"{feature_columns}")
    ordinal = dict(ordinal or {})
    for c, levels in ordinal.items():
        if c not in feature_columns:
            raise DataError(f"{file}: --ordinal column {c!r} is not a feature column; features are {feature_columns}")
        if c in forced:
            raise DataError(f"{file}: column {c!r} is given both as --categorical and as --ordinal")
        check_levels(c, levels)
    features = []
    for c in columns:
        if c in (label, id_column):
            continue
        if c in ordinal:
            features.append(Feature(c, "ordinal", tuple(ordinal[c])))
            continue
        col = frame[c]
        present = ~_is_missing(col)
        if not present.any():  # load_csv drops these first (drop_empty_columns)
            raise DataError(f"{where(file, c)}: the column holds no values", problem="column holds no values",
                            file=file, column=c)
        if c not in forced and infer_kind(col, column=c, file=file) == "numeric":
            features.append(Feature(c, "numeric"))
            continue
        cats = sorted(set(col[present].str.strip()))
        features.append(Feature(c, "categorical", tuple(cats)))
    if not features:
        raise DataError(f"{file}: no feature columns besides the label")
    labels = normalise_labels(frame[label], file=file, column=label)
    classes = tuple(sorted(set(labels), key=class_sort_key))
    if len(classes) < 2:
        raise DataError(f"{file}: label column {label!r} has a single class {classes[0]!r}; need at least 2")
    return Schema(tuple(features), label, classes, id_column)


def infer_kind(col: pd.Series, *, column, file="data", site=None) -> str:
    """"numeric" if every present cell parses as a number, "categorical" otherwise, "empty" if no cell holds a
    value. A column that is mostly numeric (a typo, not a category) is refused, naming the first bad line."""
    present = ~_is_missing(col)
    if not present.any():
        return "empty"
    values = _to_float(col)
    ok = ~np.isnan(values) & present
    share = ok.sum() / present.sum()
    if share == 1.0:
        return "numeric"
    if share >= _MOSTLY_NUMERIC:
        bad = present & ~ok
        i = int(np.argmax(bad))
        if bad.sum() > 1:
            raise DataError(
                f"{where(file, column, site=site)}: {cells_text(bad)} not numbers ({bad_lines(bad)}; the first is "
                f"{col.iloc[i]!r}), but {share:.0%} of the column is numeric; fix the values or pass --categorical "
                f"{column}",
                problem=f"{cells_text(bad)} not numbers ({bad_lines(bad)}), but {share:.0%} of the column is numeric "
                        "(fix the values, or declare the column categorical)", file=file, column=column, site=site)
        raise DataError(
            f"{where(file, column, i + 2, site)}: {col.iloc[i]!r} is not a number, but {share:.0%} of the column "
            f"is numeric; fix the value or pass --categorical {column}",
            problem=f"not a number, but {share:.0%} of the column is numeric (fix the value, or declare the column "
                    "categorical)", file=file, column=column, line=i + 2, site=site)
    return "categorical"


def check_levels(column: str, levels) -> tuple[str, ...]:
    """An ordinal column's levels: non-empty, distinct strings, none of which reads as a missing value."""
    levels = tuple(levels)
    if not levels or any(not isinstance(v, str) or not v.strip() for v in levels):
        raise DataError(f"--ordinal {column}: give its levels, lowest first, e.g. {column}=low<mid<high")
    if len(set(levels)) != len(levels):
        raise DataError(f"--ordinal {column}: a level is listed twice in {' < '.join(levels)}")
    missing = [v for v in levels if v in MISSING]
    if missing:
        raise DataError(f"--ordinal {column}: level {missing[0]!r} reads as a missing value")
    return levels


def class_sort_key(c: str):
    """Classes in a schema: numbers by value first, then names alphabetically."""
    try:
        return (0, float(c), c)
    except ValueError:
        return (1, 0.0, c)


def frame_to_table(frame: pd.DataFrame, schema: Schema, *, file="data", site=None, name="",
                   require_label=True, strict_columns=True) -> Table:
    """Check a raw string frame against the schema and build a Table."""
    expected = schema.feature_names
    present = set(frame.columns)
    missing = [c for c in expected if c not in present]
    if missing:
        hint = separator_hint(frame.columns)
        raise DataError(f"{where(file, site=site)}: missing column(s) {missing} expected by the schema{hint}",
                        problem=f"missing column(s) {missing} expected by the schema{hint}", file=file, site=site,
                        kind=COLUMNS)
    allowed = set(expected) | {schema.label} | ({schema.id_column} if schema.id_column else set())
    extra = [c for c in frame.columns if c not in allowed]
    if extra and strict_columns:
        raise DataError(f"{where(file, site=site)}: unexpected column(s) {extra}; this site's columns disagree "
                        f"with the schema {expected}", problem=f"unexpected column(s) {extra}", file=file, site=site,
                        kind=COLUMNS)
    out = pd.DataFrame(index=range(len(frame)))
    for f in schema.features:
        col = frame[f.name].reset_index(drop=True)
        if f.kind == "numeric":
            # A missing cell of a numeric column is NaN, as inference allows (trees route NaN).
            out[f.name] = parse_numeric(col, file=file, column=f.name, site=site, allow_missing=True)
        else:
            s = col.str.strip()
            missing = _is_missing(col)
            if f.kind == "ordinal":  # an unknown level has no place in the order: refuse it
                unknown = ~missing & ~s.isin(f.categories).to_numpy()
                if unknown.sum() > 1:
                    raise DataError(
                        f"{where(file, f.name, site=site)}: {cells_text(unknown)} not among the levels "
                        f"{' < '.join(f.categories)} of ordinal column {f.name!r} ({bad_lines(unknown)}; the first "
                        f"is {col.iloc[int(np.argmax(unknown))]!r})",
                        problem=f"{cells_text(unknown)} not levels of the ordinal column ({bad_lines(unknown)})",
                        file=file, column=f.name, site=site)
                if unknown.any():
                    i = int(np.argmax(unknown))
                    raise DataError(
                        f"{where(file, f.name, i + 2, site)}: {col.iloc[i]!r} is not one of the levels "
                        f"{' < '.join(f.categories)} of ordinal column {f.name!r}",
                        problem="value is not a level of the ordinal column", file=file, column=f.name,
                        line=i + 2, site=site)
            out[f.name] = s.where(~missing, np.nan)
    y = None
    if schema.label in frame.columns:
        y = normalise_labels(frame[schema.label].reset_index(drop=True), file=file, column=schema.label, site=site)
        if schema.classes:
            known = set(schema.classes)
            unknown = np.array([v not in known for v in y])
            if unknown.any():
                i = int(np.argmax(unknown))
                raise DataError(f"{where(file, schema.label, i + 2, site)}: unknown class {y[i]!r}; "
                                f"known classes are {list(schema.classes)}", problem="unknown class",
                                file=file, column=schema.label, line=i + 2, site=site)
    elif require_label:
        hint = separator_hint(frame.columns)
        raise DataError(f"{where(file, site=site)}: label column {schema.label!r} not found{hint}",
                        problem=f"label column {schema.label!r} not found{hint}", file=file, site=site, kind=COLUMNS)
    ids = None
    if schema.id_column:
        if schema.id_column not in frame.columns:
            raise DataError(f"{where(file, site=site)}: id column {schema.id_column!r} not found",
                            problem=f"id column {schema.id_column!r} not found", file=file, site=site, kind=COLUMNS)
        missing_id = _is_missing(frame[schema.id_column])
        if missing_id.any():
            i = int(np.argmax(missing_id))
            raise DataError(f"{where(file, schema.id_column, i + 2, site)}: missing id "
                            f"({frame[schema.id_column].iloc[i]!r}); every row needs its own id",
                            problem="missing id", file=file, column=schema.id_column, line=i + 2, site=site)
        ids = frame[schema.id_column].str.strip().to_numpy(dtype=object)
        dup = pd.Series(ids).duplicated().to_numpy()
        if dup.any():
            i = int(np.argmax(dup))
            raise DataError(f"{where(file, schema.id_column, i + 2, site)}: duplicate id {ids[i]!r}",
                            problem="duplicate id", file=file, column=schema.id_column, line=i + 2, site=site)
    return Table(out, y, schema, ids, name)


def features_table(frame: pd.DataFrame, schema: Schema, *, file="data", site=None, name="") -> Table:
    """The feature columns of new rows, for a prediction: parsed and checked as in training (a missing feature
    column is an error naming it; a missing value or an unknown category is read as training reads it),
    extra columns ignored. The label and id columns are not read at all: new rows may leave the label blank
    and need no id. Cells are parsed as text, as read from a CSV (a DataFrame's numbers and missing values are
    turned into that text first)."""
    plain = Schema(schema.features, schema.label, (), None)
    frame = frame.drop(columns=[c for c in (schema.label, schema.id_column) if c and c in frame.columns])
    frame = frame.astype(object).where(frame.notna(), "").astype(str)
    return frame_to_table(frame, plain, file=file, site=site, name=name, require_label=False, strict_columns=False)


def party_rows_table(frame: pd.DataFrame, schema: Schema, *, file="data", site=None, name="") -> Table:
    """A vertical party's new rows, for a prediction: its feature columns parsed as in training and the id column
    (required: the parties join on it; a missing or duplicate id is an error naming the line); the label column
    and other columns are ignored."""
    if not schema.id_column:
        raise DataError(f"{where(file, site=site)}: the model has no id column to join the parties' rows on",
                        problem="the model has no id column", file=file, site=site)
    plain = Schema(schema.features, schema.label, (), schema.id_column)
    frame = frame.drop(columns=[schema.label] if schema.label in frame.columns else [])
    return frame_to_table(frame, plain, file=file, site=site, name=name, require_label=False, strict_columns=False)


def load_csv(path, label: str, categorical=None, id_column=None, schema: Schema | None = None,
             sep=None, name: str | None = None, ordinal: dict | None = None) -> Table:
    """Load your own CSV (with a header row; ``sep=None`` detects the separator). Kinds are inferred unless a
    schema is given; ``ordinal`` maps a column to its ordered levels, lowest first."""
    raw = read_raw(path, sep=sep)
    if schema is None:
        raw, dropped = drop_empty_columns(raw, keep=(label, id_column), file=str(path))
        categorical = [c for c in (categorical or []) if c not in dropped]
        ordinal = {c: levels for c, levels in (ordinal or {}).items() if c not in dropped}
        schema = infer_schema(raw, label=label, categorical=categorical, id_column=id_column, file=str(path),
                              ordinal=ordinal)
    return frame_to_table(raw, schema, file=str(path), name=name or Path(path).stem)


def drop_empty_columns(raw: pd.DataFrame, *, keep=(), file="data") -> tuple[pd.DataFrame, list[str]]:
    """Drop feature columns with no value at all (every algorithm would have nothing to learn from them, and
    a category list of none breaks the categorical learners), with a :class:`DataWarning`."""
    empty = [c for c in raw.columns if c not in keep and _is_missing(raw[c]).all()]
    if empty:
        warnings.warn(DataWarning(f"{file}: column(s) {empty} hold no values (every cell is missing); "
                                  "left out of the features"), stacklevel=2)
    return raw.drop(columns=empty), empty


def read_site_csv(path, schema: Schema, *, site=None, require_label=None) -> Table:
    """Read one of a site's files (train.csv/test.csv) written by prepare_data, checked against the schema."""
    raw = read_raw(path)
    needs_label = bool(schema.classes) if require_label is None else require_label
    return frame_to_table(raw, schema, file=os.fspath(path), site=site, name=site or "", require_label=needs_label)
