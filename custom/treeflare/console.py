"""What a command prints: small tables, and the list of outputs it wrote."""

from __future__ import annotations

from pathlib import Path


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
