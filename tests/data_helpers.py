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
