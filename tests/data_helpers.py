"""Small helpers for tests that corrupt a site's CSV file the way a real file goes wrong."""

from __future__ import annotations

from pathlib import Path


def set_cell(path: Path, line: int, column: int, value: str) -> Path:
    """Write ``value`` into cell ``column`` (0-based) of ``line`` (1-based, the header is line 1) of a CSV
    file with no quoted commas; returns the path."""
    path = Path(path)
    lines = path.read_text().splitlines()
    cells = lines[line - 1].split(",")
    cells[column] = value
    lines[line - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    return path


# UCI Bank Marketing (bank-full.csv) as published: ';'-separated, a quoted header, quoted text cells.
BANK_COLUMNS = ("age", "job", "marital", "education", "default", "balance", "housing", "loan", "contact", "day",
                "month", "duration", "campaign", "pdays", "previous", "poutcome", "y")
BANK_NUMERIC = {"age", "balance", "day", "duration", "campaign", "pdays", "previous"}


def bank_marketing_like(n: int, seed: int = 0) -> dict:
    """``n`` synthetic rows shaped like the UCI Bank Marketing file: its columns and categories, "unknown" where the
    file writes it, a few empty cells (missing values), a rare category (default=yes) and an imbalanced label
    (y=yes ~12%, driven by duration, poutcome and contact). ``{column: list of str}``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pick = lambda values, p=None: rng.choice(values, n, p=p)  # noqa: E731
    cols = {"age": rng.integers(19, 90, n), "job": pick(["admin.", "blue-collar", "management", "technician",
                                                          "services", "retired", "student", "unknown"]),
            "marital": pick(["married", "single", "divorced"], [0.6, 0.28, 0.12]),
            "education": pick(["primary", "secondary", "tertiary", "unknown"], [0.15, 0.5, 0.3, 0.05]),
            "default": pick(["no", "yes"], [0.98, 0.02]), "balance": rng.normal(1300, 3000, n).round().astype(int),
            "housing": pick(["yes", "no"]), "loan": pick(["no", "yes"], [0.84, 0.16]),
            "contact": pick(["cellular", "telephone", "unknown"], [0.65, 0.06, 0.29]), "day": rng.integers(1, 32, n),
            "month": pick(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]),
            "duration": rng.exponential(260, n).astype(int), "campaign": rng.geometric(0.4, n),
            "poutcome": pick(["unknown", "failure", "other", "success"], [0.8, 0.1, 0.05, 0.05])}
    contacted = cols["poutcome"] != "unknown"
    cols["pdays"] = np.where(contacted, rng.integers(1, 400, n), -1)
    cols["previous"] = np.where(contacted, rng.integers(1, 6, n), 0)
    score = cols["duration"] / 250 + 2.5 * (cols["poutcome"] == "success") + 0.5 * (cols["contact"] == "cellular")
    score = score + rng.normal(0, 0.5, n)
    cols["y"] = np.where(score > np.quantile(score, 0.88), "yes", "no")
    out = {c: [str(v) for v in cols[c]] for c in BANK_COLUMNS}
    for c, share in (("balance", 0.03), ("job", 0.03), ("education", 0.02)):  # missing cells
        for i in np.flatnonzero(rng.random(n) < share):
            out[c][i] = ""
    return out


def write_bank_csv(path: Path, cols: dict, rows=None, columns=None) -> Path:
    """Write ``cols`` (rows ``rows``, columns ``columns``: default all) the way bank-full.csv is written."""
    columns = list(columns or cols)
    rows = range(len(next(iter(cols.values())))) if rows is None else rows
    cell = lambda c, v: v if c in BANK_NUMERIC or not v else f'"{v}"'  # noqa: E731
    lines = [";".join(f'"{c}"' for c in columns)] + [";".join(cell(c, cols[c][i]) for c in columns) for i in rows]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
