"""The one error type of the data layer.

Every message names where the problem is (file, column, row, or site and field), so a user can fix
their data without reading code.
"""


class DataError(ValueError):
    """Bad input data or data arguments."""


def where(file=None, column=None, line=None, site=None) -> str:
    """Render a location such as "site-2: train.csv, column 'age', line 17"."""
    parts = []
    if site is not None:
        parts.append(f"{site}:")
    if file is not None:
        parts.append(f"{file}")
    if column is not None:
        parts.append(f"column {column!r}")
    if line is not None:
        parts.append(f"line {line}")
    text = " ".join(parts[:1]) + (" " if parts[:1] and parts[1:] else "") + ", ".join(parts[1:])
    return text.strip()
