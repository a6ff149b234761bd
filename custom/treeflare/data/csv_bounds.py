"""Bounds on a CSV checked before pandas parses it (``csv_io.read_raw``'s ``max_columns``/``max_line_bytes``): a
hostile file (a 10^6-column header, a line of a gigabyte) is refused in milliseconds, naming the file and the
bound, instead of costing minutes and memory."""

from __future__ import annotations

import csv
from pathlib import Path

from .errors import DataError
from .separators import detect_separator

# A line of a CSV we read for predictions: 10,000 cells of 100 bytes fit; a longer line is no table's row, and
# pandas would hold and tokenize it whole.
MAX_LINE_BYTES = 1 << 20
# New rows to predict on may hold other columns (the label, notes), but not without end: pandas took minutes on a
# 10^6-column header. 4 per feature the model reads, and never fewer than 10,000.
COLUMNS_PER_FEATURE, MIN_MAX_COLUMNS = 4, 10_000
_SCAN_CHUNK = 1 << 20


def check_bounds(path, *, sep=None, max_columns: int | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                 columns_why: str = "") -> str:
    """The separator of the CSV ``path`` (``sep``, or detected), once no line is longer than ``max_line_bytes`` and
    the header has at most ``max_columns`` fields. The header is checked first (a hostile one is refused in
    milliseconds), then every line in chunks: all before pandas parses (and holds) anything."""
    path = Path(path)
    with path.open("rb") as fh:
        first = fh.readline(max_line_bytes + 1)
        if len(first.rstrip(b"\n")) > max_line_bytes:
            _line_too_long(path, 1, max_line_bytes)
        sep = sep or detect_separator(path)
        if max_columns is not None:
            n = _header_fields(fh, first, sep, max_line_bytes, path)
            if n > max_columns:
                raise DataError(f"{path}: the header has {n:,} columns, more than the {max_columns:,} allowed"
                                f"{columns_why}", problem=f"more than {max_columns:,} columns", file=path, line=1)
        fh.seek(0)
        _check_line_lengths(fh, path, max_line_bytes)
    return sep


def _header_fields(fh, first: bytes, sep: str, limit: int, path) -> int:
    """The number of fields of the header record; it may go on past ``first`` (a quoted name holding a line break),
    up to ``limit`` bytes in all."""
    read = []

    def lines():
        line = first
        while line:
            read.append(line)
            if sum(map(len, read)) > limit:
                _line_too_long(path, 1, limit, what="the header")
            yield line.decode("utf-8-sig" if line is first else "utf-8", errors="replace")
            line = fh.readline(limit + 1)
    try:
        return len(next(csv.reader(lines(), delimiter=sep), []))
    except csv.Error:  # a stray quote, a field over the csv module's limit: count the separators instead
        return b"".join(read).count(sep.encode()) + 1


def _check_line_lengths(fh, path, limit: int) -> None:
    """DataError naming the first line of the binary file ``fh`` longer than ``limit`` bytes (its line feed not
    counted), read in chunks: no line is ever held whole."""
    line, run = 1, 0  # the line the chunk starts in, and its bytes in the chunks before
    while chunk := fh.read(_SCAN_CHUNK):
        pieces = chunk.split(b"\n")
        lengths = [run + len(pieces[0]), *map(len, pieces[1:])]
        longest = max(lengths)
        if longest > limit:
            _line_too_long(path, line + next(i for i, n in enumerate(lengths) if n > limit), limit)
        line += len(pieces) - 1
        run = lengths[-1]


def _line_too_long(path, line: int, limit: int, what: str = ""):
    what = what or f"line {line:,}"
    raise DataError(f"{path}: {what} is longer than {limit:,} bytes, the most a line of this CSV may hold",
                    problem=f"{what} longer than {limit:,} bytes", file=path, line=line)
