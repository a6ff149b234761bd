"""Predictions on new rows for a trained model of either kind: the ICDTA4FL global tree (``global_tree.json``) or
the federated XGBoost model (``model.json``). Used by ``treeflare predict``; importable for the same in code::

    from treeflare.prediction import load_model, predict_csv
    predict_csv("out/xgb_adult", "new.csv", "predictions.csv", id_column="id")

A model is found from a file or a folder (a job's workspace holds ``global_tree.json`` or ``model.json``) and
reads raw CSV values named as in the schema it was trained with. Output: the id column (``--id``, or the
schema's id column when the CSV has it), ``predicted`` (the class), ``p_<class>`` per class in the schema's class
order, and with ``explain`` (ICDTA4FL only) ``explanation``, the row's decision path in words. A text cell that
a spreadsheet would run as a formula (it starts with = + - @, a tab or a carriage return) is written with a
leading ``'`` unless ``raw_text=True`` (``files.spreadsheet_safe``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import DataError, Schema, read_schema_file
from .icdta4fl.export import explain_rows
from .icdta4fl.model import MODEL_SCHEMA, GlobalTree, ModelPayloadError, check_model_size
from .trees.validate import PayloadError
from .trees.learners import ENCODINGS
from .xgb.model import ModelError, XGBModel

KINDS = {"global_tree.json": "icdta4fl", "model.json": "xgboost"}
KIND_NAMES = {"icdta4fl": "ICDTA4FL global tree", "xgboost": "XGBoost"}
PREDICTED = "predicted"
EXPLANATION = "explanation"
ONE_LEAF = "(no conditions: the tree is a single leaf)"


@dataclass
class LoadedModel:
    kind: str  # "icdta4fl" | "xgboost"
    path: Path
    model: GlobalTree | XGBModel

    @property
    def schema(self) -> Schema:
        return self.model.data_schema

    @property
    def classes(self) -> list[str]:
        return [str(c) for c in self.model.classes_]

    def describe(self) -> str:
        extra = f", {self.model.mode}" if self.kind == "xgboost" else f", {self.model.encoding}"
        return f"{KIND_NAMES[self.kind]} ({self.path}{extra})"


def find_model(path) -> tuple[str, Path]:
    """(kind, file) for a model file or a folder holding one (a job's workspace). A vertical model (its parts, or
    a vertical job's workspace) is refused with the command that predicts with it."""
    path = Path(path)
    if path.is_dir():
        found = [(kind, path / name) for name, kind in KINDS.items() if (path / name).is_file()]
        if not found:
            if _holds_vertical_model(path):
                raise DataError(_vertical_refusal(path, path))
            raise DataError(f"{path}: no model in this folder: expected global_tree.json (ICDTA4FL job) or "
                            "model.json (XGBoost job)")
        if len(found) > 1:
            raise DataError(f"{path}: holds both global_tree.json and model.json; name the model file with --model")
        return found[0]
    if not path.is_file():
        raise DataError(f"{path}: model not found (give a model file or a job's workspace folder)")
    if _is_vertical_part(path):
        workspace = path.parent.parent if path.parent.name == "models" else None
        raise DataError(_vertical_refusal(path, workspace))
    return _sniff(path), path


# a vertical model part's format names start so (``vertical.messages.ACTIVE_FORMAT``, ``PASSIVE_FORMAT``)
_VERTICAL_FORMAT = b'"treeflare.vertical.'
VERTICAL_JOB = "vertical_tree"  # a vertical job's report.json says so ("job")


def _is_vertical_part(file: Path) -> bool:
    """A party's part of a vertical model (its JSON names a vertical format near its start)."""
    try:
        with file.open("rb") as fh:
            return _VERTICAL_FORMAT in fh.read(4096)
    except OSError:
        return False


def _holds_vertical_model(folder: Path) -> bool:
    """A vertical job's workspace (its report.json, or the parts it copied to models/<site>_<role>_model.json) or a
    site's folder with its part (``vertical.model_parts``' vertical_active_model.json, vertical_passive_model.json;
    not imported: that package imports this module)."""
    parts = [*folder.glob("vertical_*_model.json"), *(folder / "models").glob("*_active_model.json"),
             *(folder / "models").glob("*_passive_model.json")]
    if any(p.is_file() for p in parts):
        return True
    try:
        report = json.loads((folder / "report.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and report.get("job") == VERTICAL_JOB


def _vertical_refusal(path: Path, workspace: Path | None) -> str:
    ws = workspace if workspace is not None else "TRAINING_WORKSPACE"
    return (f"{path}: holds a vertical model, which no single file predicts with: each party keeps its own part. "
            f"Predict with a federated run: treeflare vertical --predict {ws} --csv NEW.csv --workspace OUT "
            f"(--predict: the vertical training job's workspace; on real sites leave out --csv, each party reads "
            f"its own new rows and model part from its binding)")


def _sniff(path: Path) -> str:
    """A model file's kind from its content: ICDTA4FL's versioned JSON, or anything else XGBoost may load (its
    JSON names a "learner" first; UBJSON is binary). A BOM before the JSON is allowed (editors write one); JSON
    that names neither in its first 4 KiB goes by the file's name."""
    with path.open("rb") as fh:
        head = fh.read(4096)
    head = head[3:] if head.startswith(_BOM) else head
    if head.lstrip()[:1] != b"{":
        return "xgboost"
    if f'"{MODEL_SCHEMA}"'.encode() in head:
        return "icdta4fl"
    if b'"learner"' in head:
        return "xgboost"
    return KINDS.get(path.name, "xgboost")


_BOM = b"\xef\xbb\xbf"


def load_model(path, schema=None) -> LoadedModel:
    """The model at ``path`` (file or folder), ready for raw rows. ``schema`` (a path or a Schema) is needed only
    for a model that carries none: an XGBoost model.json or a global_tree.json written before models carried
    their schema; beside an XGBoost model, a job workspace's ``federation/partition.json`` is used."""
    kind, file = find_model(path)
    if isinstance(schema, (str, Path)):
        schema = read_schema_file(schema)
    if kind == "icdta4fl":
        return LoadedModel(kind, file, _load_tree(file, schema))
    if schema is None and (file.parent / "federation" / "partition.json").is_file():
        schema = read_schema_file(file.parent / "federation" / "partition.json")
    try:
        return LoadedModel(kind, file, XGBModel.load(file, schema))
    except ModelError as exc:
        raise DataError(str(exc)) from None


def _load_tree(file: Path, schema: Schema | None):
    """The global tree in ``file``, every field checked (``GlobalTree.from_dict``); any fault of the file is a
    DataError naming it and the field."""
    def unusable(why):
        return DataError(f"{file}: not a usable ICDTA4FL model ({why})")

    try:
        check_model_size(file)
        payload = json.loads(file.read_bytes().decode("utf-8-sig"))
    except OSError as exc:
        raise unusable(exc.strerror or exc) from None
    except PayloadError as exc:
        raise unusable(exc) from None
    except UnicodeDecodeError as exc:
        raise unusable(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except RecursionError:
        raise unusable("JSON nested too deeply") from None
    except ValueError as exc:  # not JSON, or an integer of thousands of digits (Python's int-string limit)
        raise unusable(f"not valid JSON: {exc}") from None
    try:
        model = GlobalTree.from_dict(payload)
    except PayloadError as exc:  # the tree's or the document's: names the field that is wrong
        raise unusable(exc) from None
    except OverflowError:  # an integer of hundreds of digits where a number is read as a float
        raise unusable("a number is too large to be a float") from None
    if model.data_schema is None:
        if schema is None:
            raise DataError(f"{file}: this model carries no data schema (written before models carried one): "
                            "give the schema it was trained with (--schema, e.g. the federation's partition.json)")
        errors = []
        for encoding in ENCODINGS:  # which one the model's feature names say
            try:
                model.set_data_schema(schema, encoding)
                break
            except (ModelPayloadError, ValueError) as exc:
                errors.append(str(exc))
        else:
            raise DataError(f"{file}: the schema does not fit this model ({errors[0]})")
    return model


def check_explain(loaded: LoadedModel, explain: bool) -> None:
    if explain and loaded.kind != "icdta4fl":
        raise DataError("--explain shows an ICDTA4FL tree's decision path; an XGBoost model adds up many trees, so "
                        "a row has no single path to show (leave out --explain)")


def predict_frame(loaded: LoadedModel, raw, *, file="input", id_column: str | None = None,
                  explain: bool = False):
    """A DataFrame of predictions for raw rows (as read by ``treeflare.data.csv_io.read_raw``)."""
    import pandas as pd

    check_explain(loaded, explain)
    if id_column is not None and id_column not in raw.columns:
        raise DataError(f"{file}: id column {id_column!r} not found; columns are {list(raw.columns)}",
                        problem=f"id column {id_column!r} not found", file=file, column=id_column)
    if id_column is None and loaded.schema.id_column in raw.columns:
        id_column = loaded.schema.id_column
    X = loaded.model.encode_rows(raw, file=file)
    proba = np.asarray(loaded.model.predict_proba(X), dtype=np.float64)
    predicted = loaded.model.predict(X)
    out = pd.DataFrame(index=range(len(raw)))
    if id_column is not None:
        out[id_column] = raw[id_column].str.strip().to_numpy()
    names = [PREDICTED, *(f"p_{c}" for c in loaded.classes), *([EXPLANATION] if explain else [])]
    clash = [n for n in names if n == id_column]
    if clash or len(set(names)) != len(names):
        raise DataError(f"output column names clash ({names}, id {id_column!r}); rename the id column")
    out[PREDICTED] = np.asarray(predicted, dtype=object)
    for j, c in enumerate(loaded.classes):
        out[f"p_{c}"] = proba[:, j]
    if explain:
        out[EXPLANATION] = [" and ".join(words) or ONE_LEAF for words in explain_rows(loaded.model, X)]
    return out


def predict_csv(model, csv, out, *, id_column: str | None = None, explain: bool = False, schema=None,
                raw_text: bool = False) -> dict:
    """Read ``csv``, predict with ``model`` (a path or a LoadedModel), write ``out`` atomically (all or nothing).
    Text cells that a spreadsheet would run as formulas get a leading ``'`` unless ``raw_text``. Returns a summary
    (rows, model kind, classes, counts per predicted class)."""
    from .data.csv_io import read_prediction_rows
    from .files import csv_text, write_text_atomic

    csv, out = Path(csv), Path(out)
    if out.exists() and out.is_dir():
        raise DataError(f"--out {out}: is a folder; give a file name")
    if csv.exists() and out.exists() and out.resolve() == csv.resolve():
        raise DataError(f"--out {out}: is the input CSV; choose another file")
    loaded = model if isinstance(model, LoadedModel) else load_model(model, schema)
    check_explain(loaded, explain)  # before reading a large CSV
    raw = read_prediction_rows(csv, len(loaded.schema.feature_names))
    frame = predict_frame(loaded, raw, file=str(csv), id_column=id_column, explain=explain)
    write_text_atomic(out, csv_text(frame, raw_text=raw_text))
    counts = frame[PREDICTED].value_counts()
    return {"rows": int(len(frame)), "model": loaded.describe(), "kind": loaded.kind, "out": str(out),
            "classes": loaded.classes, "predicted": {c: int(counts.get(c, 0)) for c in loaded.classes},
            "columns": list(frame.columns)}
