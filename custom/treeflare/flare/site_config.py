"""Site-local data binding: where a site's CSV files are and what its label/id columns are called.

The job says *what* to learn (schema, parameters); each site says *where its data is*, in a file the site's
operator owns and the job cannot override::

    <site startup kit>/local/treeflare_site.json
    {
      "data_dir": "/data/treeflare",     # folder holding this site's files (absolute, or relative to this file)
      "train": "train.csv",              # optional, default train.csv
      "test": "test.csv",                # optional, default test.csv
      "label_column": "outcome",         # optional: this site's name for the job's label column
      "id_column": "patient_id",         # optional: this site's name for the job's id column (vertical jobs)
      "min_category_rows": 10,           # optional, default 5: schema discovery reports a category value only if
                                         #   at least this many rows hold it (a job may ask for more, never less)
      "categorical_allowed": ["zip"],    # optional: columns this site reads as numbers that a job may declare
                                         #   categorical or ordinal (their values held by k rows are then reported;
                                         #   a job declaring any other numeric column is refused)
      "refine_peers": ["site-1", "site-2", "site-3"],  # optional: the federation's sites as this site's operator
                                         #   knows them; an ICDTA4FL refinement key list naming any other is refused
                                         #   (NVFlare gives a site no list of the job's sites the server cannot
                                         #   rewrite: SECURITY.md)
      "predict": "predict.csv",          # optional, default predict.csv: new rows for a vertical prediction run
      "vertical_model": "vertical_passive_model.json"   # optional: this site's part of a vertical model (absolute,
    }                                    #   or relative to data_dir; default vertical_<active|passive>_model.json)

Where the executor looks, first match wins:
1. ``$TREEFLARE_SITE_CONFIG`` (a path to such a file);
2. ``<site workspace>/local/treeflare_site.json``;
3. ``$TREEFLARE_DATA_ROOT``: files in ``$TREEFLARE_DATA_ROOT/<site>/``;
4. the job's ``data_root`` argument: files in ``<data_root>/<site>/`` (simulator and POC runs on one machine).

A site may hold several named bindings besides this default one (say one for a horizontal and one for a
vertical job): ``local/treeflare_site.<name>.json``, written by ``treeflare site bind --name <name>``. A job
that names a binding (its ``--binding`` option) reads only that file, and a site without it refuses the job:
it never falls back to the default binding or a data root, whose files would be another job's data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..data import DataError, Schema
from ..data.csv_io import frame_to_table, read_raw
from ..data.errors import COLUMNS, SITE_DATA
from ..data.discovery import MAX_MIN_CATEGORY_ROWS

SITE_CONFIG_FILE = "treeflare_site.json"
SITE_CONFIG_ENV = "TREEFLARE_SITE_CONFIG"
DATA_ROOT_ENV = "TREEFLARE_DATA_ROOT"
_KEYS = {"data_dir", "train", "test", "predict", "vertical_model", "label_column", "id_column", "min_category_rows",
         "categorical_allowed", "refine_peers", "comment"}
_FILE_KEYS = ("train", "test", "predict")
_STRING_KEYS = _KEYS - {"comment", "min_category_rows", "categorical_allowed", "refine_peers"}
MAX_PEERS = 1000
MAX_ALLOWED_COLUMNS = 5_000
MAX_CONFIG_BYTES = 64 * 1024
DEFAULT_BINDING = ""  # the unnamed binding, local/treeflare_site.json
# a binding name becomes part of a file name: a plain identifier, never a path (app/site_setup.py checks the same)
_BINDING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def check_binding_name(name: str) -> str:
    """``name`` if it may name a binding (a letter, then up to 63 letters, digits, ``_`` or ``-``); "" is the
    default binding. Raises DataError otherwise (the name arrives in a job, so it is never trusted as a path)."""
    if name == DEFAULT_BINDING:
        return name
    if not isinstance(name, str) or not _BINDING_NAME.fullmatch(name):
        raise DataError("binding name must be a letter followed by up to 63 letters, digits, '_' or '-'",
                        problem="bad binding name")
    return name


def add_binding_arg(group) -> None:
    """The job scripts' ``--binding NAME`` (an argparse parser or group): which site binding the sites read."""
    import argparse

    def name(value: str) -> str:
        try:
            return check_binding_name(value)
        except DataError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    group.add_argument("--binding", type=name, default=DEFAULT_BINDING, metavar="NAME",
                       help="the sites read their named binding NAME, local/treeflare_site.NAME.json (written by "
                            "treeflare site bind --name NAME), instead of the default one; a site without it "
                            "refuses the job")


def binding_file_name(name: str = DEFAULT_BINDING) -> str:
    """The file in a kit's ``local/`` folder that holds the binding ``name``."""
    name = check_binding_name(name)
    return f"treeflare_site.{name}.json" if name else SITE_CONFIG_FILE


@dataclass(frozen=True)
class SiteBinding:
    data_dir: Path
    train: str = "train.csv"
    test: str = "test.csv"
    predict: str = "predict.csv"
    vertical_model: str | None = None
    label_column: str | None = None
    id_column: str | None = None
    min_category_rows: int | None = None  # this site's floor for schema discovery's k (None: the default, 5)
    categorical_allowed: tuple[str, ...] = ()  # numeric columns a job may declare categorical or ordinal
    refine_peers: tuple[str, ...] | None = None  # the federation's sites as the operator knows them (None: not said)
    source: str = ""  # where the binding came from (for logs and errors)
    # where it came from as the server may read it (a file's base name, never a path), e.g. "its binding
    # local/treeflare_site.json"; and whether it takes the place of data the job prepared (the job's data_root)
    shown_as: str = "its binding"
    overrides_job_data: bool = False

    def path(self, which: str) -> Path:
        """The file of ``which``: "train", "test" or "predict" (new rows for a vertical prediction run)."""
        return self.data_dir / {"train": self.train, "test": self.test, "predict": self.predict}[which]

    def model_path(self, default_name: str) -> Path:
        """This site's part of a vertical model: ``vertical_model`` (relative to data_dir), else ``default_name``
        in data_dir."""
        return self.data_dir / Path(self.vertical_model or default_name).expanduser()

    def read_raw(self, which: str, site: str, label: str | None = None, id_column: str | None = None):
        """This site's ``which`` file ("train"/"test"/"predict") as strings, with the site's own label and id column
        names renamed to the job's (``label``/``id_column``; None keeps the site's name)."""
        path = self.path(which)
        raw = self._read_file(path, site)
        renames = {}
        if self.label_column and label and self.label_column != label:
            renames[self.label_column] = label
        if self.id_column and id_column and self.id_column != id_column:
            renames[self.id_column] = id_column
        for theirs, ours in renames.items():
            if theirs not in raw.columns:
                raise DataError(f"{site}: {path}: column {theirs!r} (set in {self.source}) not found; "
                                f"columns are {list(raw.columns)}", site=site, file=path,
                                problem=f"column {theirs!r} named in the site's configuration not found")
            # the job's name only renames the site's own label/id column; it may not pick another column of
            # the file (whose every value would then be reported as a class)
            if ours in raw.columns:
                what = "label" if ours == label else "id"
                why = f"the job's name {ours!r} for this site's {what} column is also another column of its file"
                raise DataError(f"{site}: {path}: {why}", site=site, file=path, problem=why)
        return raw.rename(columns=renames)

    def read(self, which: str, schema: Schema, site: str, *, own_columns: bool = False):
        """Read this site's ``which`` file ("train"/"test") against the job's schema, renaming the site's own
        column names to the job's. ``own_columns`` (a vertical party): only the schema's feature columns this file
        holds, and the label only if it holds it."""
        path = self.path(which)
        raw = self.read_raw(which, site, schema.label, schema.id_column)
        if own_columns:
            schema = schema.select([c for c in schema.feature_names if c in raw.columns],
                                   keep_label=schema.label in raw.columns)
        try:
            return frame_to_table(raw, schema, file=os.fspath(path), site=site, name=site,
                                  require_label=bool(schema.classes))
        except DataError as exc:
            if exc.kind != COLUMNS or not self.overrides_job_data:
                raise
            # the job prepared data of its own, which this site does not read: say so, or the user looks for the
            # fault in the data they gave the job
            lead = (f"{site} reads its own data ({self.shown_as}), not the data this job prepared; the columns of "
                    f"its {path.name} do not match the job's schema")
            advice = ("run the job without --dataset/--csv (the schema is then discovered from the sites) or bind "
                      "the site to other data")
            raise DataError(f"{lead} ({path}, from {self.source}): {exc}; {advice}",
                            problem=f"{lead}: {exc.problem}; {advice}", kind=COLUMNS) from None

    def _read_file(self, path: Path, site: str):
        """``read_raw(path)``; a file that is missing or cannot be opened is this site's configuration
        (:data:`~treeflare.data.errors.SITE_DATA`), said by its name, never its path."""
        if not path.is_file():
            folder = "" if self.data_dir.is_dir() else f" (the data folder that {self.shown_as} names does not exist)"
            # the server hears the file's name only: whether the folder exists stays in this site's own log
            raise DataError(f"{site}: {path}: its data file {path.name} is missing{folder} (from {self.source})",
                            problem=f"its data file {path.name} is missing", site=site, kind=SITE_DATA)
        try:
            return read_raw(path)
        except OSError as exc:
            raise DataError(f"{site}: {path}: its data file {path.name} cannot be read ({exc})",
                            problem=f"its data file {path.name} cannot be read", site=site,
                            kind=SITE_DATA) from None


def site_config_dir(fl_ctx) -> Path | None:
    """The site's ``local/`` folder in its startup kit (None outside FLARE)."""
    if fl_ctx is None:
        return None
    try:
        return Path(fl_ctx.get_engine().get_workspace().get_site_config_dir())
    except Exception:
        return None


def _site_config_path(fl_ctx, config_dir=None) -> Path | None:
    env = os.environ.get(SITE_CONFIG_ENV)
    if env:
        return Path(env)
    local = Path(config_dir) if config_dir else site_config_dir(fl_ctx)
    if local is None:
        return None
    path = local / SITE_CONFIG_FILE
    return path if path.is_file() else None


def parse_binding(data: object, source: str) -> SiteBinding:
    if not isinstance(data, dict):
        raise DataError(f"{source}: expected a JSON object")
    unknown = set(data) - _KEYS
    if unknown:
        raise DataError(f"{source}: unknown keys {sorted(unknown)} (allowed: {sorted(_KEYS - {'comment'})})")
    k = data.get("min_category_rows")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_MIN_CATEGORY_ROWS):
        raise DataError(f"{source}: 'min_category_rows' must be an integer >= 1 (at most {MAX_MIN_CATEGORY_ROWS:,})")
    allowed = data.get("categorical_allowed", [])
    if (not isinstance(allowed, list) or len(allowed) > MAX_ALLOWED_COLUMNS
            or any(not isinstance(c, str) or not c.strip() for c in allowed)):
        raise DataError(f"{source}: 'categorical_allowed' must be a list of column names")
    peers = data.get("refine_peers")
    if peers is not None and (not isinstance(peers, list) or not 0 < len(peers) <= MAX_PEERS
                              or any(not isinstance(c, str) or not c.strip() for c in peers)):
        raise DataError(f"{source}: 'refine_peers' must be a list of 1 to {MAX_PEERS} site names")
    for key in _STRING_KEYS:
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise DataError(f"{source}: {key!r} must be a non-empty string")
    if not data.get("data_dir"):
        raise DataError(f"{source}: 'data_dir' is required")
    if data.get("label_column") and data.get("label_column") == data.get("id_column"):
        raise DataError(f"{source}: 'label_column' and 'id_column' name the same column (ids would become classes)")
    for key in _FILE_KEYS:
        name = data.get(key)
        if name and (Path(name).name != name):
            raise DataError(f"{source}: {key!r} must be a file name inside data_dir, got {name!r}")
    base = Path(source).parent if Path(source).is_file() else Path.cwd()
    data_dir = Path(data["data_dir"]).expanduser()
    if not data_dir.is_absolute():
        data_dir = base / data_dir
    return SiteBinding(data_dir=data_dir, train=data.get("train") or "train.csv", test=data.get("test") or "test.csv",
                       predict=data.get("predict") or "predict.csv", vertical_model=data.get("vertical_model"),
                       label_column=data.get("label_column"), id_column=data.get("id_column"),
                       min_category_rows=k, categorical_allowed=tuple(c.strip() for c in allowed),
                       refine_peers=None if peers is None else tuple(c.strip() for c in peers), source=source)


def _named_binding_path(site: str, name: str, fl_ctx, config_dir) -> Path:
    local = Path(config_dir) if config_dir else site_config_dir(fl_ctx)
    path = local / binding_file_name(name) if local is not None else None
    if path is None or not path.is_file():
        raise DataError(f"{site}: the job reads binding {name!r}, which this site does not hold "
                        f"(write it with: treeflare site bind <kit> --name {name} ...)", site=site,
                        problem=f"the site holds no binding named {name!r}", kind=SITE_DATA)
    return path


def load_binding(site: str, fl_ctx=None, job_data_root: str = "", config_dir=None,
                 name: str = DEFAULT_BINDING) -> SiteBinding:
    """This site's data binding (see the module doc for the order); ``config_dir``: the kit's ``local/`` folder
    when there is no ``fl_ctx`` at hand (see :func:`site_config_dir`); ``name``: a named binding the job asks
    for (only ``local/treeflare_site.<name>.json``; "" is the default binding)."""
    name = check_binding_name(name)
    path = _named_binding_path(site, name, fl_ctx, config_dir) if name else _site_config_path(fl_ctx, config_dir)
    overrides = bool(job_data_root)  # the job prepared data of its own, which a site's own binding replaces
    if path is not None:
        try:
            if path.stat().st_size > MAX_CONFIG_BYTES:
                raise DataError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes", site=site, file=path,
                                problem=f"site configuration larger than {MAX_CONFIG_BYTES} bytes", kind=SITE_DATA)
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError(f"{site}: site config {path} (from ${SITE_CONFIG_ENV}) not found", site=site,
                            problem="site configuration not found", kind=SITE_DATA) from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{site}: {path} is not valid JSON: {exc}", site=site, file=path,
                            problem="site configuration is not valid JSON", kind=SITE_DATA) from None
        from_env = not name and bool(os.environ.get(SITE_CONFIG_ENV))
        shown = f"its binding {path.name} (${SITE_CONFIG_ENV})" if from_env else f"its binding local/{path.name}"
        return dataclasses.replace(parse_binding(data, str(path)), shown_as=shown, overrides_job_data=overrides)
    root = os.environ.get(DATA_ROOT_ENV)
    if root:
        return SiteBinding(Path(root) / site, source=f"${DATA_ROOT_ENV}",
                           shown_as=f"its data root (${DATA_ROOT_ENV})", overrides_job_data=overrides)
    if job_data_root:
        return SiteBinding(Path(job_data_root) / site, source="the job's data_root", shown_as="the job's data_root")
    raise DataError(f"{site}: no data configured: write <site kit>/local/{SITE_CONFIG_FILE}, "
                    f"or set ${DATA_ROOT_ENV} on the site", site=site, problem="no data configured at the site",
                    kind=SITE_DATA)
