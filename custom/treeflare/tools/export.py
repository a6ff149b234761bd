#!/usr/bin/env python
"""Export a trained model for use where trees are already used: scikit-learn, or ONNX (onnxruntime).

    treeflare export --model workspace/icdta4fl --format sklearn
    treeflare export --model workspace/icdta4fl --format onnx --out tree.onnx
    treeflare export --model out/xgb_higgs --format onnx

--model is a job's workspace (or the model file in it), as treeflare predict takes it. --format sklearn (the
ICDTA4FL global tree only) writes sklearn_export.to_sklearn(model)'s fitted Pipeline with joblib, scikit-learn's own
persistence (a pickle: load only files you made or trust; it needs treeflare installed unless --portable);
--format onnx writes a .onnx file that onnxruntime serves without treeflare: the global tree through skl2onnx,
an XGBoost model through onnxmltools (numeric features only: a model with categorical columns is refused).
Default --out: global_tree.joblib / global_tree.onnx / model.onnx beside the model.

Before the file is written, the export is checked against the model on check rows: --check-csv rows, or rows
made from the schema and the model: for the global tree one row per leaf, built from the leaf's decision path,
then 400 random rows from the model's own thresholds (every threshold, the float values next to it, missing
values, every category and an unknown one). sklearn: labels and probabilities equal bit for bit; onnx: labels
equal, probabilities within 2**-23 (onnxruntime's tree ensembles output float32). A failed check writes
nothing and exits 1; bad input: ``error: ...``, exit 2.
"""

from __future__ import annotations

import io
import sys
import warnings
from pathlib import Path

import numpy as np

from treeflare.cli import Parser, main_guard
from treeflare.data import DataError
from treeflare.files import write_bytes_atomic
from treeflare.icdta4fl.sklearn_export import to_sklearn
from treeflare.prediction import load_model
from treeflare.trees.learners import ONE_HOT, encoding_of

FORMATS = ("sklearn", "onnx")
ONNX_PROBA_TOL = 2.0 ** -23  # float32 rounding of a probability in [0, 1] (and 1 - p for binary), with margin
DEFAULT_OUT = {("icdta4fl", "sklearn"): "global_tree.joblib", ("icdta4fl", "onnx"): "global_tree.onnx",
               ("xgboost", "onnx"): "model.onnx"}


class CheckFailed(Exception):
    """The exported model does not predict as the model does on the check rows."""


def build_parser() -> Parser:
    p = Parser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--model", required=True, type=Path, metavar="DIR_OR_FILE",
                   help="a job's workspace folder, or the global_tree.json / model.json in it")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="sklearn: a joblib file of a scikit-learn Pipeline; onnx: an ONNX model checked with "
                        "onnxruntime")
    p.add_argument("--out", type=Path, default=None, help="file to write (default: beside the model)")
    p.add_argument("--schema", type=Path, default=None, help="the training schema, for a model that carries none")
    p.add_argument("--check-csv", type=Path, default=None, metavar="CSV",
                   help="rows to check the export on (default: rows made from the schema and the model)")
    p.add_argument("--portable", action="store_true",
                   help="sklearn: scikit-learn's classes only (loads without treeflare; exact for float32 inputs)")
    return p


def threshold_values(loaded) -> dict[str, list[float]]:
    """Numeric column -> the thresholds the model tests it against."""
    out: dict[str, set] = {}
    if loaded.kind == "icdta4fl":
        from treeflare.icdta4fl.sklearn_export import column_thresholds

        names = list(loaded.model.feature_names_in_)
        for j, ts in column_thresholds(loaded.model.tree_).items():
            out.setdefault(names[j], set()).update(ts)
    else:
        frame = loaded.model.booster.trees_to_dataframe()
        names = list(loaded.schema.feature_names)
        for feature, split in zip(frame["Feature"], frame["Split"]):
            if feature != "Leaf" and np.isfinite(split):
                name = names[int(feature[1:])] if feature[1:].isdigit() and feature[0] == "f" else feature
                out.setdefault(name, set()).add(float(split))
    return {k: sorted(v) for k, v in out.items()}


def random_rows(loaded, n: int = 400, seed: int = 0):
    """Random rows near the thresholds: each numeric column takes a threshold, the floats just below and above
    it, its float32 neighbour, a value from its range, or NaN; each categorical/ordinal column a category,
    missing or unknown."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    thresholds = threshold_values(loaded)
    cols = {}
    for f in loaded.schema.features:
        if f.kind == "numeric":
            ts = np.asarray(thresholds.get(f.name, [0.0]), dtype=np.float64)
            t = rng.choice(ts, n)
            near = np.where(rng.random(n) < 0.5, np.nextafter(t, -np.inf), np.nextafter(t, np.inf))
            t32 = t.astype(np.float32).astype(np.float64)  # the float32 next to t: where float32 could cross it
            picks = rng.integers(0, 5, n)
            values = np.choose(picks, [t, near, t32, t + rng.normal(0, 1 + np.abs(t)), np.full(n, np.nan)])
            cols[f.name] = values
        else:
            options = list(f.categories) + [None] + (["(unseen category)"] if f.kind == "categorical" else [])
            cols[f.name] = pd.Series([options[i] for i in rng.integers(0, len(options), n)], dtype=object)
    return pd.DataFrame(cols)


def _encoded_columns(loaded) -> list[tuple[int, int | None]]:
    """Per column of the global tree's encoded matrix: (schema feature, category index of a CART one-hot
    column or None)."""
    from treeflare.icdta4fl.sklearn_export import encoder_columns

    out = []
    for i, c in enumerate(encoder_columns(loaded.schema, loaded.model.encoding)):
        one_hot = c["kind"] == "categorical" and encoding_of(loaded.model.encoding) == ONE_HOT
        out += [(i, u) for u in range(c["n_out"])] if one_hot else [(i, None)]
    return out


def _path_constraints(tree, columns, leaf: int, parents) -> dict:
    """Schema feature -> what the path from the root to ``leaf`` asks of it: ("interval", lo, hi) for
    lo < x <= hi, ("nan",), ("code", c or None) for an ID3 category (None: missing), ("onehot", {u: allowed
    0/1 values})."""
    from treeflare.trees.tree import NUMERIC

    need: dict = {}
    child = leaf
    while parents[child] >= 0:
        n = int(parents[child])
        pos = [int(c) for c in tree.children[n]].index(child)
        i, u = columns[int(tree.feature[n])]
        points = tree.split_points[n]
        if tree.kind[n] == NUMERIC:
            if tree.missing_only(n) and pos == len(tree.children[n]) - 1:
                need[i] = ("nan",)
            else:
                lo = float(points[pos - 1]) if pos > 0 else -np.inf
                hi = float(points[pos]) if pos < len(points) else np.inf
                if u is not None:  # a one-hot column: which of 0 and 1 fall in (lo, hi]
                    allowed = need.setdefault(i, ("onehot", {}))[1]
                    allowed[u] = allowed.get(u, {0, 1}) & {v for v in (0, 1) if lo < v <= hi}
                elif need.get(i, ("interval",))[0] == "interval":
                    _, a, b = need.get(i, ("interval", -np.inf, np.inf))
                    need[i] = ("interval", max(a, lo), min(b, hi))
        else:
            need.setdefault(i, ("code", int(points[pos]) if pos < len(points) else None))
        child = n
    return need


def _value(feature, need):
    """A value meeting ``need`` for ``feature``; raises LookupError where none does (an unreachable leaf)."""
    kind = need[0]
    if kind == "nan":
        return np.nan if feature.kind == "numeric" else None
    if kind == "code":
        return None if need[1] is None else feature.categories[need[1]]
    if kind == "onehot":
        must = [u for u, ok in need[1].items() if ok == {1}]
        if len(must) > 1 or any(not ok for ok in need[1].values()):
            raise LookupError
        if must:
            return feature.categories[must[0]]
        banned = {u for u, ok in need[1].items() if ok == {0}}
        return next((c for u, c in enumerate(feature.categories) if u not in banned), None)
    _, lo, hi = need
    if feature.kind == "ordinal":  # codes 0..L-1
        code = max(int(np.floor(lo)) + 1 if np.isfinite(lo) else 0, 0)
        if code > hi or code >= len(feature.categories):
            raise LookupError
        return feature.categories[code]
    if np.isfinite(hi):
        return hi  # x <= hi
    return max(lo + 1.0, np.nextafter(lo, np.inf)) if np.isfinite(lo) else 0.0


def leaf_rows(loaded, base):
    """One row per leaf of the global tree, from its decision path: for each node on the path, a value on the
    leaf's side of its threshold (the threshold itself, or just above the one below), its category, or a
    missing value for a missing-only child; the other columns as in ``base`` (rows cycled)."""
    tree = loaded.model.tree_
    columns, parents = _encoded_columns(loaded), tree.parents()
    features = loaded.schema.features
    rows = []
    leaves = [n for n in range(tree.n_nodes) if tree.children[n] is None]
    for k, leaf in enumerate(leaves):
        row = base.iloc[k % len(base)].to_dict()
        try:
            for i, need in _path_constraints(tree, columns, leaf, parents).items():
                row[features[i].name] = _value(features[i], need)
        except LookupError:  # no row reaches this leaf
            continue
        rows.append(row)
    return rows


def check_rows(loaded, n: int = 400, seed: int = 0):
    """Rows that go down every branch: for the global tree, one row per leaf built from its decision path
    (``leaf_rows``), then ``n`` random rows near the thresholds (``random_rows``), which also reach the nodes
    where a NaN or an unlisted category stops; for XGBoost, the random rows."""
    import pandas as pd

    random = random_rows(loaded, n, seed)
    if loaded.kind != "icdta4fl" or not len(random):
        return random
    paths = pd.DataFrame(leaf_rows(loaded, random), columns=random.columns)
    for f in loaded.schema.features:  # keep the random rows' dtypes (numbers float64, categories text or None)
        paths[f.name] = paths[f.name].astype(random[f.name].dtype)
    return pd.concat([paths, random], ignore_index=True)


def _rows(loaded, args):
    if args.check_csv is None:
        return check_rows(loaded)
    from treeflare.data.csv_io import features_table, read_prediction_rows

    raw = read_prediction_rows(args.check_csv, len(loaded.schema.feature_names))  # bounded as predict.py's input
    table = features_table(raw, loaded.schema, file=str(args.check_csv))
    return table.frame


def export_sklearn(loaded, rows, portable: bool) -> tuple[bytes, str]:
    import joblib

    pipeline = to_sklearn(loaded.model, portable=portable)
    buffer = io.BytesIO()
    joblib.dump(pipeline, buffer)
    data = buffer.getvalue()
    back = joblib.load(io.BytesIO(data))  # the file as it will be read
    expected_p, expected = loaded.model.predict_proba(rows), loaded.model.predict(rows)
    with warnings.catch_warnings():  # an unknown category is announced by OneHotEncoder: it is meant here
        warnings.simplefilter("ignore", UserWarning)
        got_p, got = back.predict_proba(rows), back.predict(rows)
    if not (np.array_equal(got_p, expected_p) and np.array_equal(got, expected)):
        bad = int(np.sum(np.any(got_p != expected_p, axis=1) | (got != expected)))
        raise CheckFailed(f"{bad} of {len(rows)} check rows predict differently in scikit-learn")
    nodes = back.steps[-1][1].tree_.node_count
    return data, (f"scikit-learn Pipeline (DecisionTreeClassifier of {nodes} nodes); checked on {len(rows)} rows: "
                  "labels and probabilities equal bit for bit")


def export_onnx(loaded, rows) -> tuple[bytes, str]:
    from treeflare.onnx_export import pipeline_to_onnx, run_onnx, tree_onnx_inputs, xgb_to_onnx

    if loaded.kind == "icdta4fl":
        onx = pipeline_to_onnx(to_sklearn(loaded.model), loaded.schema)
        feeds = tree_onnx_inputs(onx, rows)
        expected = loaded.model.predict(rows)
    else:
        onx = xgb_to_onnx(loaded.model)
        feeds = {"input": np.asarray(loaded.model.encode_rows(rows).X, dtype=np.float32)}
        expected = loaded.model.predict_codes(rows)
    data = onx.SerializeToString()
    label, proba = run_onnx(data, feeds)
    diff = float(np.max(np.abs(proba - loaded.model.predict_proba(rows)))) if len(rows) else 0.0
    label = label.ravel()
    if not (np.array_equal(label.astype(expected.dtype), expected) and diff <= ONNX_PROBA_TOL):
        raise CheckFailed(f"onnxruntime disagrees on the check rows: {int(np.sum(label != expected))} labels differ, "
                          f"probabilities differ by up to {diff:.3g} (allowed {ONNX_PROBA_TOL:.3g})")
    return data, (f"ONNX ({len(onx.graph.node)} graph nodes); checked with onnxruntime on {len(rows)} rows: labels "
                  f"equal, probabilities within {diff:.2g} (float32 output)")


@main_guard
def main(argv=None) -> int:
    from treeflare.icdta4fl.sklearn_export import ExportError
    from treeflare.onnx_export import OnnxExportError

    args = build_parser().parse_args(argv)
    loaded = load_model(args.model, args.schema)
    if (loaded.kind, args.format) not in DEFAULT_OUT:
        raise DataError(f"{loaded.path}: an XGBoost model adds up many trees and is no scikit-learn tree; export it "
                        "with --format onnx, or load model.json in xgboost.XGBClassifier (load_model) directly")
    out = args.out or loaded.path.parent / DEFAULT_OUT[(loaded.kind, args.format)]
    if out.exists() and out.is_dir():
        raise DataError(f"--out {out}: is a folder; give a file name")
    rows = _rows(loaded, args)
    try:
        data, summary = (export_sklearn(loaded, rows, args.portable) if args.format == "sklearn"
                         else export_onnx(loaded, rows))
    except (ExportError, OnnxExportError) as exc:
        raise DataError(f"{loaded.path}: cannot export to {args.format}: {exc}") from None
    except CheckFailed as exc:
        print(f"error: {loaded.path}: the export was not written: {exc}", file=sys.stderr)
        return 1
    write_bytes_atomic(out, data)
    print(f"wrote {out}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
