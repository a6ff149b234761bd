"""The one error type of the data layer.

Every message names where the problem is (file, column, row, or site and field), so a user can fix
their data without reading code.
"""


class DataError(ValueError):
    """Bad input data or data arguments."""


def where(file=None, column=None, line=None, site=None) -> str:
    """Render a location such as "site-2: train.csv, column 'age', line 17"."""
    parts = []
    if file is not None:
        parts.append(f"{file}")
    if column is not None:
        parts.append(f"column {column!r}")
    if line is not None:
        parts.append(f"line {line}")
    text = ", ".join(parts)
    if site is not None:
        text = f"{site}: {text}" if text else f"{site}"
    return text
