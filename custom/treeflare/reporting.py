"""Metrics and output files shared by every job: report.json, predictions CSVs, tables printed to the terminal."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score


def classification_metrics(y_true, y_pred, proba=None, n_classes: int | None = None) -> dict:
    """accuracy and macro-F1 (over the classes 0 .. n_classes - 1 when ``n_classes`` is given, else over those
    that occur); for probabilities also AUC (binary; None when the true labels hold one class only) and log
    loss (``logloss`` binary, ``mlogloss`` from an (n, k) array)."""
    y_true = np.asarray(y_true)
    out = {"accuracy": float(accuracy_score(y_true, y_pred)),
           "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0,
                                      labels=list(range(n_classes)) if n_classes else None))}
    if proba is not None:
        proba = np.asarray(proba, dtype=np.float64)
        k = n_classes or proba.shape[1]
        labels = list(range(k))
        if k == 2:
            pos = proba[:, 1] if proba.ndim == 2 else proba
            out["auc"] = float(roc_auc_score(y_true, pos)) if len(np.unique(y_true)) == 2 else None
            out["logloss"] = float(log_loss(y_true, np.clip(pos, 1e-15, 1 - 1e-15), labels=labels))
        elif proba.ndim == 2:
            p = np.clip(proba, 1e-15, 1.0)
            out["mlogloss"] = float(log_loss(y_true, p / p.sum(axis=1, keepdims=True), labels=labels))
    return out


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


def format_table(headers: list[str], rows: list[list]) -> str:
    """A small fixed-width table; floats with 4 decimals."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4f}"
        return "" if v is None else str(v)
    body = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line, sep] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body])


def outputs_text(files: dict) -> str:
    """The end of a job's output: what it wrote and where, one line per output that exists (``{label: path}``)."""
    present = [(label, Path(path)) for label, path in files.items() if path and Path(path).exists()]
    if not present:
        return ""
    width = max(len(label) for label, _ in present)
    return "\noutputs:\n" + "\n".join(f"  {label.ljust(width)}  {path}" for label, path in present)


def bench_settings(**extra) -> dict:
    """What a benchmark figure depends on, recorded beside it: load average, cores, time, commit, plus ``extra``
    (seeds, randomness, repeats)."""
    import datetime
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "loadavg": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(), "commit": commit, **extra}


def write_bench_block(path, name: str, markdown: str) -> Path:
    """Replace the text between ``<!-- bench:NAME:start -->`` and ``<!-- bench:NAME:end -->`` in the page ``path``.

    Benchmark scripts own these blocks, so a figure in the docs is always the one the script wrote. A page without
    both markers (in that order) is refused with a ValueError naming the page and the marker, and left unchanged:
    a block moved to another page must take its script's target with it (``tests/test_docs.py`` checks both).
    """
    path = Path(path)
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the page for bench block {name!r}: {exc.strerror}") from None
    i = text.find(start)
    j = text.find(end, i + len(start)) if i >= 0 else -1
    if i < 0 or j < 0:
        missing = start if i < 0 else end
        raise ValueError(f"{path}: no {missing!r} marker; not writing bench block {name!r}")
    write_text_atomic(path, text[: i + len(start)] + "\n" + markdown.strip("\n") + "\n" + text[j:])
    return path
