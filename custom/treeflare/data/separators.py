"""The CSV separator of a user's or a site's file: detected from the first records, or given with ``--sep``
(one data layer for every job, prepare_data.py, the sites' own files and predict.py), and the hint an error gives
when a header was read as one column holding another separator."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .errors import DataError

# The separators detect_separator chooses from (--sep may name any other one character).
SEPARATORS = (",", ";", "\t", "|")
_SEP_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}
_SNIFF_CHARS = 64 * 1024
_SNIFF_RECORDS = 50


def check_separator(text: str | None) -> str | None:
    """A --sep value as the reader takes it: None (or "auto") detects; ``\\t``/"tab" is a tab; otherwise one
    character that is not a quote, a line break or a space."""
    if text is None or text == "auto":
        return None
    sep = {"\\t": "\t", "tab": "\t"}.get(text, text)
    if len(sep) != 1 or sep in "\"\r\n " or sep.isalnum():
        raise DataError(f"--sep {text!r}: give one separator character (',', ';', '\\t' or 'tab', '|'), or "
                        "'auto' to detect it")
    return sep


def detect_separator(path, opener=None) -> str:
    """The field separator of a CSV, from its first records (up to 50, read by the CSV reader, so a quoted value
    may hold any separator): among ``,;\\t|``, the one that splits the header into the most columns and reads
    every one of those records with as many fields; if none reads them all, "," if it splits the header, else
    the one splitting it most. A one-column header is read as ","."""
    if opener is not None:
        with opener() as fh:
            sample = fh.read(_SNIFF_CHARS)
    else:
        with Path(path).open("rb") as fh:
            sample = fh.read(_SNIFF_CHARS)
    if isinstance(sample, bytes):  # a bad byte is reported by the full read, with its line
        sample = sample.decode("utf-8", errors="replace")
    sample = sample.lstrip("\ufeff")
    truncated = len(sample) >= _SNIFF_CHARS
    widths, consistent = {}, {}
    for sep in SEPARATORS:
        try:
            records = [r for r in csv.reader(io.StringIO(sample, newline=""), delimiter=sep) if r]
        except csv.Error:
            continue
        if truncated and len(records) > 1:
            records = records[:-1]  # cut by the sample's end
        records = records[:_SNIFF_RECORDS]
        if records and len(records[0]) > 1:
            widths[sep] = len(records[0])
            consistent[sep] = all(len(r) == widths[sep] for r in records)
    if not widths:
        return ","
    fitting = [s for s in widths if consistent[s]]
    if fitting:
        return max(fitting, key=lambda s: (widths[s], -SEPARATORS.index(s)))
    return "," if "," in widths else max(widths, key=lambda s: (widths[s], -SEPARATORS.index(s)))


def separator_hint(columns) -> str:
    """For an error about a missing column: a header read as one column that holds another separator is most
    likely a file with that separator read with the wrong one. "" otherwise."""
    columns = list(columns)
    if len(columns) != 1:
        return ""
    for sep in SEPARATORS[1:]:
        if sep in str(columns[0]):
            shown = "\\t" if sep == "\t" else sep
            return (f"; the header is one column holding '{shown}': is the file {_SEP_NAMES[sep]}-separated? "
                    f"use --sep '{shown}'")
    return ""


def first_record(path, opener, sep) -> list[str]:
    """The first record of a CSV as ``sep`` splits it ([] if it cannot be read)."""
    try:
        with (opener() if opener else Path(path).open(newline="", encoding="utf-8-sig", errors="replace")) as fh:
            return next(csv.reader(io.StringIO(fh.read(_SNIFF_CHARS), newline=""), delimiter=sep), [])
    except (OSError, csv.Error):
        return []
