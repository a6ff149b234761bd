"""A trained vertical model's parts on disk, as a prediction run needs them.

Training leaves each party's part in that party's run folder (``vertical_active_model.json`` at the active site,
``vertical_passive_model.json`` at each passive site); where the sites ran on this machine (simulator, POC) the job
script copies them to ``<workspace>/models/<site>_{active,passive}_model.json``.  For a prediction run there, the
submitter's CSV of new rows is split by columns as training split its data: each site's folder gets the id column
and its own columns, and its own model part -- never another party's (:func:`prediction_site_files`).  On real
sites each site's binding names its own part and its own file of new rows; nothing here is used.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..data import DataError

ACTIVE_MODEL, PASSIVE_MODEL = "vertical_active_model.json", "vertical_passive_model.json"   # in a site's folder
PREDICT_FILE = "predict.csv"                                   # a site's new rows (its binding's default)
# A model part bigger than this is refused before it is read (parsing holds several times its size); a trained
# part is far smaller (a default run's, 3 trees of depth 3, is a few KB).
MAX_MODEL_BYTES = 512 << 20


def find_model_parts(model_dir) -> tuple[Path, dict]:
    """(folder, {site: part}) of the parts in a training workspace (its ``models/``) or a folder of parts;
    ``{}`` when there are none (on real sites each site keeps its own)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DataError(f"--predict {model_dir}: not a folder (give the training run's --workspace)")
    folder = model_dir / "models" if (model_dir / "models").is_dir() else model_dir
    parts = {}
    for path in sorted(folder.glob("*_model.json")):
        for role in ("active", "passive"):
            suffix = f"_{role}_model.json"
            if path.name.endswith(suffix):
                try:
                    check_part_size(path)
                    part = json.loads(path.read_text())
                except (OSError, ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a 5,000-digit integer
                    raise DataError(f"{path}: cannot read this model part ({exc})") from None
                site = path.name[:-len(suffix)]
                if not isinstance(part, dict) or part.get("party") != site:
                    raise DataError(f"{path}: not {site}'s {role} model part")
                parts[site] = part
    return folder, parts


def check_part_size(path) -> None:
    """ValueError naming the file unless it holds at most MAX_MODEL_BYTES, checked before it is read."""
    size = Path(path).stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ValueError(f"{Path(path).name} is {size:,} bytes, more than the {MAX_MODEL_BYTES:,} (512 MiB) a model "
                         "part may hold")


def model_sites(parts: dict) -> list[str] | None:
    """[active, passive, ...] from the active site's part (None without one)."""
    active = [s for s, p in parts.items() if str(p.get("format", "")).startswith("treeflare.vertical.active/")]
    if len(active) > 1:
        raise DataError(f"model parts of two active sites: {active}")
    if not active:
        return None
    passives = parts[active[0]].get("passives")
    if not isinstance(passives, list) or not passives:
        raise DataError(f"{active[0]}'s model part lists no passive sites")
    return [active[0], *map(str, passives)]


def prediction_site_files(raw, parts: dict, sites: list[str], source: str = "new rows", *, overlap: float = 1.0,
                          seed: int = 0) -> dict[str, str]:
    """``{"<site>/predict.csv": text, "<site>/<its model part file>": text}``: the new rows ``raw`` (a frame of
    strings, as :func:`~treeflare.data.csv_io.read_raw` reads a CSV) split by columns (the id column and the party's
    own columns; the label and other columns left out) and each site's own model part, for a folder the sites read
    as their data root (simulator, POC). ``overlap`` < 1: each party gets the rows all hold plus rows of its own,
    in its own order, as training's ``--overlap`` deals training rows (``data.partition.overlap_rows``), so the
    prediction run's PSI phase has rows to leave out."""
    missing = [s for s in sites if s not in parts]
    if missing:
        raise DataError(f"no model part for {', '.join(missing)}: --csv needs every party's part in the model folder "
                        "(a simulator or POC training run); on real sites each site loads its own (leave out --csv)")
    csv = source
    files = {}
    dealt = None
    if overlap < 1:
        from ..data.partition import overlap_rows

        dealt, _shared = overlap_rows(len(raw), len(sites), overlap, seed)
    for i, site in enumerate(sites):
        part = parts[site]
        schema = part.get("schema")
        if not isinstance(schema, dict) or not schema.get("id_column"):
            raise DataError(f"{site}'s model part holds no schema with an id column (written by an older version): "
                            "train again to predict with it")
        id_col, cols = schema["id_column"], [str(c) for c in part.get("features", [])]
        absent = [c for c in [id_col, *cols] if c not in raw.columns]
        if absent:
            raise DataError(f"{csv}: column(s) {absent} missing: {site}'s part of the model needs the id column "
                            f"{id_col!r} and its columns {cols}; the file has {list(raw.columns)}", file=csv,
                            problem=f"column(s) {absent} missing")
        rows = raw if dealt is None else raw.iloc[dealt[i]]
        files[f"{site}/{PREDICT_FILE}"] = rows[[id_col, *cols]].to_csv(index=False)
        files[f"{site}/{ACTIVE_MODEL if i == 0 else PASSIVE_MODEL}"] = json.dumps(part, indent=1)
    return files
