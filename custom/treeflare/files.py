"""Files the jobs write: JSON and text written atomically (readers never see half a file), plain-JSON conversion,
and CSV cells a spreadsheet shows but never runs."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np


def json_safe(obj):
    """Plain JSON types only: numpy scalars and arrays converted, NaN/inf as None."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return json_safe(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json_atomic(path, obj, indent: int = 2) -> Path:
    """Write JSON next to its destination, then rename: readers never see half a file."""
    return write_text_atomic(path, json.dumps(json_safe(obj), indent=indent, allow_nan=False) + "\n")


def write_text_atomic(path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode())


# The process's umask, read once at import (setting it is process-wide, so never while threads may create files):
# an atomically written file gets the mode a plain open() would give it, not mkstemp's private 0600.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write next to the destination, then rename: readers never see half a file. The file keeps the mode it had,
    or a new one gets the mode open() would give it (report.json beside the other outputs, not 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_UMASK
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# A text cell a spreadsheet runs as a formula when it starts with one of these (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def spreadsheet_safe(cell):
    """``cell`` as a spreadsheet shows it and never runs it: text starting with = + - @, a tab or a carriage
    return gets a leading ``'`` (OWASP's advice); other cells, and a plain finite number such as ``-1.5``, as is."""
    if not isinstance(cell, str) or not cell.startswith(FORMULA_START):
        return cell
    if _PLAIN_NUMBER.fullmatch(cell) and math.isfinite(float(cell)):
        return cell
    return "'" + cell


def csv_text(frame, *, raw_text: bool = False) -> str:
    """``frame`` as CSV text without its index. Its text cells and column names (class labels, ids: the sites'
    data) go through :func:`spreadsheet_safe` unless ``raw_text``; numeric columns are written as they are."""
    import pandas as pd

    if not raw_text:
        frame = frame.copy()
        for i in range(frame.shape[1]):
            if not pd.api.types.is_numeric_dtype(frame.iloc[:, i]):
                frame.isetitem(i, frame.iloc[:, i].map(spreadsheet_safe))
        frame.columns = [spreadsheet_safe(str(c)) for c in frame.columns]
    return frame.to_csv(index=False)
