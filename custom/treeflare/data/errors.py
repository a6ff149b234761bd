"""The one error type of the data layer, and what of an error may leave a site.

Every message names where the problem is (file, column, row, or site and field), so a user can fix
their data without reading code. The full message (``str(exc)``) may quote the offending cell and the
file's local path: it is for the user and the site's own log. What a site sends to the server is
:meth:`DataError.redacted` (or :func:`public_error` for any exception): the file's base name, the
column, the line and the kind of problem, never a cell value or a path.
"""

from __future__ import annotations

import re
from pathlib import PurePath

# Said when an error carries no problem text of its own that is known to hold no data.
UNSPECIFIED = "invalid data (details in the site's local log)"
# DataError.kind: what sort of problem, for those who act on it
SITE_DATA = "site_data"  # the site's data is missing or unreadable (no file, no folder, no binding): its operator's
#                          configuration, not bad rows; a job may stop rather than go on without that site
COLUMNS = "columns"  # a file's columns disagree with the schema (a missing or unexpected column, no label column)


class DataError(ValueError):
    """Bad input data or data arguments.

    Args:
        message: the full text for the user and the local log (may quote values and paths).
        problem: the kind of problem in words that quote no cell value and no path, e.g.
            ``"not a number (the column is numeric)"``; used by :meth:`redacted`.
        file, column, line, site: where (``line`` is the 1-based line of the file, header = 1).
        kind: what sort of problem, when someone acts on it: :data:`SITE_DATA`, :data:`COLUMNS` (None: bad data).
    """

    def __init__(self, message: str, *, problem: str | None = None, file=None, column=None, line=None,
                 site=None, kind: str | None = None):
        super().__init__(message)
        self.problem = problem
        self.kind = kind
        self.file = None if file is None else str(file)
        self.column = None if column is None else str(column)
        self.line = None if line is None else int(line)
        self.site = None if site is None else str(site)

    @property
    def location(self) -> dict:
        """``{"file": base name, "column", "line", "site"}``; absent parts are None."""
        return {"file": None if self.file is None else PurePath(self.file).name, "column": self.column,
                "line": self.line, "site": self.site}

    def redacted(self) -> str:
        """What may be shown outside the site: where (file base name, column, line, site) and the kind of
        problem; never the cell value or a local path."""
        loc = self.location
        text = where(loc["file"], loc["column"], loc["line"], loc["site"])
        problem = self.problem or UNSPECIFIED
        return f"{text}: {problem}" if text else problem


class DataWarning(UserWarning):
    """Data the loader changed rather than refused (e.g. an all-missing column left out); the command-line
    scripts print it as ``warning: <message>``."""


def is_site_data_error(exc: BaseException) -> bool:
    """True for an error saying the site's data is missing or unreadable (:data:`SITE_DATA`)."""
    return isinstance(exc, DataError) and exc.kind == SITE_DATA


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


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][^\s\\/'\"]+){2,}[\\/]?")
MAX_PUBLIC_CHARS = 2000


def public_error(exc: BaseException, passthrough: tuple = ()) -> str:
    """The text of a site's error reply to the server.

    * :class:`DataError`: its :meth:`~DataError.redacted` form;
    * a type in ``passthrough`` (protocol errors about what the *server* sent, which hold no site data): its
      message, with anything that looks like a path cut to its last part;
    * anything else (a library's ValueError may quote a cell): the type name only.

    The full error belongs in the site's local log.
    """
    name = type(exc).__name__
    if isinstance(exc, DataError):
        text = f"{name}: {exc.redacted()}"
    elif passthrough and isinstance(exc, passthrough):
        text = f"{name}: {_PATH.sub(lambda m: '.../' + PurePath(m.group(0).rstrip('/')).name, str(exc))}"
    else:
        text = f"{name} at the site (details in the site's local log)"
    return text[:MAX_PUBLIC_CHARS]
