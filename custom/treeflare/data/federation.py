"""A federation on disk: per-site train/test CSV files, the server's global test set and partition.json.

Layout written by :func:`write_federation` (and by ``treeflare prepare``)::

    DIR/partition.json          seed, parameters, schema, sizes and class counts per site
    DIR/server/test.csv         stratified global test set, held out before partitioning
    DIR/site-N/train.csv        the site's local 80% ...
    DIR/site-N/test.csv         ... and 20% (vertical: the site's columns of the global test rows)

Vertical with ``overlap`` F < 1 (parties whose customers differ): F is each party's share of its own training
rows that every party holds. Each party, the label party too, gets the shared rows plus rows no other party has
(as many as makes the share F), in its own seeded order; every party gets its columns of all the global test
rows, in its own order. The ids are random 16-hex-digit tokens (not row numbers), so a party cannot guess the
others' private ids from its own; where the data has an id column it keeps its name and its values are replaced too
(an embedded data set's are sequential numbers, which would tell a party the others' ids), except with ``keep_ids``
(the job scripts' ``--csv --id``: your ids are yours, and the new rows you predict on carry them). F = 1 is the classic split: the same rows, in the same order, the data's own ids, or 0..n-1 when it has none.

The folder is written to a temporary sibling and renamed into place, so a failure never leaves a
half-written federation. An existing folder is replaced only when asked and only when this module wrote it
(a marker file, ``.treeflare-federation.json``, lists what it wrote) and it holds nothing else.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .csv_io import read_header, read_site_csv
from .embedded import REPO_DATA, data_root
from .errors import DataError
from .partition import (check_overlap, overlap_rows, partition_rows, party_order, random_ids, stratified_split,
                        vertical_columns)
from .schema import Schema
from .table import Table

# Written into every federation folder: only a folder holding it (and nothing it does not list) is replaced.
MARKER = ".treeflare-federation.json"
GLOBAL_TEST_SIZE = 0.2
LOCAL_TEST_SIZE = 0.2


@dataclass
class SiteData:
    train: Table
    test: Table


@dataclass
class Federation:
    schema: Schema
    sites: dict[str, SiteData]
    server_test: Table
    summary: dict = field(default_factory=dict)

    @property
    def site_names(self) -> list[str]:
        return list(self.sites)


def site_name(i: int) -> str:
    return f"site-{i + 1}"


def natural_key(name: str):
    """Sort key that puts ``site-2`` before ``site-10`` (digits compared as numbers)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def prepare_federation(table: Table, n_sites: int, kind: str = "iid", alpha: float | None = None, seed: int = 0,
                       *, vertical: bool = False, n_passive: int = 1, test_size: float = GLOBAL_TEST_SIZE,
                       local_test_size: float = LOCAL_TEST_SIZE, stratify: bool = True,
                       overlap: float = 1.0, keep_ids: bool = False) -> Federation:
    """Hold out a global test set, then partition the rest among sites (rows, or columns if vertical).

    ``stratify=False`` holds out a plain random share instead of a per-class one (for a real-valued
    label, whose "classes" are mostly single rows). ``overlap`` (vertical only, in (0, 1]): each party's share
    of its own training rows that all parties hold (see the module docstring); 1.0 = every party the same rows.
    ``keep_ids``: below full overlap, keep the data's own id values (your CSV's ``--id``: they are yours, and new
    rows to predict carry them) instead of drawing random ones (an embedded data set's sequential ids)."""
    overlap = check_overlap(overlap)
    if overlap < 1 and not vertical:
        raise DataError("--overlap applies only to a vertical split (parties holding columns)")
    if vertical:
        table = _with_ids(table, seed, random=overlap < 1, keep_own=keep_ids)
    y = table.y_codes()
    if len(table.schema.classes) < 2 or len(np.unique(y)) < 2:
        raise DataError(f"{table.name or 'data'}: the label has a single class; need at least 2")
    rest_rows, test_rows = stratified_split(y if stratify else np.zeros(len(y), np.int64), test_size, seed)
    rest, server_test = table.subset(rest_rows), table.subset(test_rows, name="server")
    params = {"kind": "vertical" if vertical else kind, "alpha": alpha, "seed": seed, "test_size": test_size,
              "local_test_size": local_test_size}
    sites: dict[str, SiteData] = {}
    if vertical:
        sites, n_shared = _vertical_sites(rest, server_test, n_passive, overlap, seed)
        params.update(n_passive=n_passive, overlap=overlap, n_shared=n_shared)
        params.pop("alpha")
    else:
        for i, rows in enumerate(partition_rows(rest, n_sites, kind, alpha, seed)):
            shard = rest.subset(rows)
            tr, te = stratified_split(shard.y_codes(), local_test_size, seed + 1 + i)
            name = site_name(i)
            if len(tr) == 0 or len(te) == 0:  # the partitioners give every site 2 rows or more; never ship less
                raise DataError(f"{name}: {len(tr)} training and {len(te)} test rows; use fewer --sites")
            sites[name] = SiteData(shard.subset(tr, name=name), shard.subset(te, name=name))
    summary = {
        "dataset": table.name,
        "partition": params,
        "n_sites": len(sites),
        "schema": table.schema.to_dict(),
        "server": {"n_test": len(server_test), "class_counts": server_test.class_counts()},
        "sites": {
            name: {
                "n_train": len(s.train), "n_test": len(s.test),
                "columns": s.train.schema.feature_names,
                "class_counts": s.train.class_counts(), "test_class_counts": s.test.class_counts(),
                **({"n_private": len(s.train) - params["n_shared"]} if vertical else {}),
            }
            for name, s in sites.items()
        },
    }
    return Federation(table.schema, sites, server_test, summary)


def _with_ids(table: Table, seed: int, *, random: bool, keep_own: bool = False) -> Table:
    """``table`` with an id column: its own, else ``row_id``; the values are row numbers (or the data's own) when
    ``random`` is false, else seeded random tokens (also in place of the data's own values unless ``keep_own``)."""
    own = bool(table.schema.id_column and table.ids is not None)
    numbered = table if own else table.with_row_ids()
    if not random or (own and keep_own):
        return numbered
    return Table(numbered.frame, numbered.y, numbered.schema, random_ids(len(numbered), seed), numbered.name)


def _vertical_sites(rest: Table, server_test: Table, n_passive: int, overlap: float,
                    seed: int) -> tuple[dict[str, SiteData], int]:
    """Each party's columns: of all training rows (``overlap`` 1), else of the shared rows and its own private
    ones in its own order; of all the global test rows (in its own order when ``overlap`` < 1). Also returns
    how many training rows all parties hold."""
    schema = rest.schema
    if not schema.id_column:
        raise DataError("vertical split needs an id column shared by all parties (--id COL)")
    for t in (rest, server_test):
        dup = np.unique(t.ids, return_counts=True)[1] > 1
        if dup.any():
            raise DataError(f"id column {schema.id_column!r} has duplicate ids; vertical parties join on it")
    groups = vertical_columns(schema.feature_names, n_passive)
    if overlap == 1.0:
        train_rows, n_shared = [np.arange(len(rest))] * len(groups), len(rest)
        test_rows = [np.arange(len(server_test))] * len(groups)
    else:
        train_rows, n_shared = overlap_rows(len(rest), len(groups), overlap, seed)
        test_rows = [party_order(len(server_test), i, seed) for i in range(len(groups))]
    sites = {}
    for i, cols in enumerate(groups):
        name, active = site_name(i), i == 0
        sites[name] = SiteData(rest.subset(train_rows[i]).columns(cols, keep_label=active, name=name),
                               server_test.subset(test_rows[i]).columns(cols, keep_label=active, name=name))
    return sites, n_shared


def write_federation(fed: Federation, out_dir, *, overwrite: bool = False) -> Path:
    """Write ``fed`` to ``out_dir``, all or nothing.

    An existing folder is replaced only when it is one this function wrote (it holds :data:`MARKER`, which
    lists the files written), it holds nothing else, and ``overwrite`` is set; an empty folder is used. Any
    other folder, the embedded datasets' folder above all, is refused and left as it is.
    """
    out = _check_target(Path(out_dir), overwrite=overwrite)
    tmp = _fresh_sibling(out)
    try:
        (tmp / "server").mkdir()
        server = fed.server_test
        if fed.summary["partition"]["kind"] == "vertical":  # the server scores with labels only
            server = server.columns([], keep_label=True, name="server")
        written = ["partition.json", "server/test.csv"]
        server.to_frame().to_csv(tmp / "server" / "test.csv", index=False)
        for name, site in fed.sites.items():
            (tmp / name).mkdir()
            site.train.to_frame().to_csv(tmp / name / "train.csv", index=False)
            site.test.to_frame().to_csv(tmp / name / "test.csv", index=False)
            written += [f"{name}/train.csv", f"{name}/test.csv"]
        (tmp / "partition.json").write_text(json.dumps(fed.summary, indent=2))
        (tmp / MARKER).write_text(json.dumps({"written_by": "treeflare write_federation", "files": written},
                                             indent=1))
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_marked_folder(out_dir, files: dict[str, str], *, written_by: str) -> Path:
    """Write ``files`` (relative path -> text) as the folder ``out_dir``, all or nothing, with :data:`MARKER`.
    An existing folder is replaced only under :func:`write_federation`'s rules (ours, nothing else inside)."""
    out = _check_target(Path(out_dir), overwrite=True)
    tmp = _fresh_sibling(out)
    try:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        (tmp / MARKER).write_text(json.dumps({"written_by": written_by, "files": sorted(files)}, indent=1))
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_target(out: Path, *, overwrite: bool) -> Path:
    """``out`` may be written: absent, empty, or a folder treeflare wrote holding nothing else (then replaced
    only with ``overwrite``). Anything else, the embedded datasets' folder above all, is refused and left as
    it is. Creates the parent folder."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder; choose another folder")
    _refuse_embedded_data(out)
    if out.exists() and any(out.iterdir()):
        foreign = foreign_entries(out)
        if foreign is None:
            raise DataError(f"{out}: already exists and was not written by treeflare (no {MARKER} inside); it is "
                            "left as it is: choose another folder, or move this one away yourself")
        if foreign:
            raise DataError(f"{out}: holds files treeflare did not write ({', '.join(foreign[:3])}"
                            f"{', ...' if len(foreign) > 3 else ''}); they are left as they are: move them away "
                            "or choose another folder")
        if not overwrite:
            raise DataError(f"{out}: already exists and is not empty; choose another --out or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _swap_in(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` in place of ``out`` by renames (the old one is removed only after)."""
    if out.exists():
        old = _fresh_sibling(out, "old")
        old.rmdir()
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out)


def foreign_entries(folder: Path) -> list[str] | None:
    """What in ``folder`` :func:`write_federation` did not write: None when the folder has no :data:`MARKER`
    (not ours at all), else the unexpected paths (empty when the folder holds only what the marker lists)."""
    folder = Path(folder)
    try:
        listed = json.loads((folder / MARKER).read_text())["files"]
        expected = {MARKER} | {str(f) for f in listed}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    dirs = {str(Path(f).parent) for f in expected} - {"."}
    foreign = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink() and rel in dirs:
            continue
        if rel not in expected or path.is_symlink() or not path.is_file():
            foreign.append(rel)
    return foreign


def _refuse_embedded_data(out: Path) -> None:
    """Never write over, around or into the embedded datasets, nor anywhere inside the package that ships them
    (e.g. ``--workspace`` pointed into an installed treeflare)."""
    target = out.resolve()
    package = REPO_DATA.resolve().parents[1]  # .../treeflare, which holds data/datasets
    if target == package or package in target.parents:
        raise DataError(f"{out}: this would write into the treeflare package's own folder ({package}), which holds "
                        "its code and embedded datasets: choose another --workspace/--out")
    for embedded in {data_root().resolve(), REPO_DATA.resolve()}:
        if target == embedded or target in embedded.parents or embedded in target.parents:
            raise DataError(f"{out}: this would write over or into the embedded datasets' folder ({embedded}), "
                            "which is never replaced: choose another --workspace/--out")


def _fresh_sibling(out: Path, kind: str = "tmp") -> Path:
    """An empty hidden folder beside ``out``, made with the umask's permissions (mkdtemp's are 0700)."""
    for _ in range(100):
        tmp = out.with_name(f".{out.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue
    raise DataError(f"{out.parent}: cannot create a temporary folder beside {out.name}")


def read_partition(root) -> dict:
    path = Path(root) / "partition.json"
    if not path.is_file():
        raise DataError(f"{path}: not found (write it with treeflare prepare)", file=path,
                        problem="file not found")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})", file=path, problem="not valid JSON") from None
    return summary


def read_site(root, site: str, schema: Schema | None = None) -> SiteData:
    """Read one site's train/test files, checked against the federation's schema."""
    root = Path(root)
    summary = read_partition(root) if schema is None else None
    if schema is None:
        schema = Schema.from_dict(summary["schema"])
        info = summary["sites"].get(site)
        if info is None:
            raise DataError(f"{root}: no site {site!r} in partition.json (sites: {list(summary['sites'])})",
                            site=site, file="partition.json", problem="this site is not in partition.json")
        keep_label = schema.label in (read_site_header(root / site / "train.csv"))
        schema = schema.select(info["columns"], keep_label)
    return SiteData(read_site_csv(root / site / "train.csv", schema, site=site),
                    read_site_csv(root / site / "test.csv", schema, site=site))


def read_site_header(path) -> list[str]:
    """The column names of a site file (by the CSV reader: a quoted name may hold a comma)."""
    return read_header(path)
