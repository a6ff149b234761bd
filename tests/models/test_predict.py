"""scripts/predict.py and treeflare.prediction: predictions on raw CSV rows with an ICDTA4FL global tree or an
XGBoost model trained here (as the jobs train them, on the shared schema's encoding), compared with the models'
own predictions on the encoded rows; unknown categories, missing values and columns, bad CSVs, --explain."""

from __future__ import annotations

import importlib

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest


from treeflare.data import load_csv, load_dataset
from treeflare.data.csv_io import features_table, read_raw
from treeflare.prediction import load_model, predict_csv

xgb = pytest.importorskip("xgboost")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "predict.py"
predict_script = importlib.import_module("treeflare.tools.predict")


def write_rows(path, n=600, seed=0, label=True):
    """An id, two numbers, a categorical colour, an ordinal size, a three-class label."""
    rng = np.random.default_rng(seed)
    x0, x1 = rng.normal(size=n), rng.normal(size=n)
    colour = rng.choice(["red", "green", "blue"], n)
    size = rng.choice(["S", "M", "L"], n)
    y = np.where(x0 + (colour == "red") > 0.5, "high", np.where(x1 > 0, "mid", "low"))
    frame = pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x0": x0.round(4), "x1": x1.round(4),
                          "colour": colour, "size": size})
    if label:
        frame["label"] = y
    frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict")
    train = load_csv(write_rows(tmp / "train.csv"), label="label", id_column="id", ordinal={"size": ["S", "M", "L"]})
    new = write_rows(tmp / "new.csv", n=200, seed=1)
    return tmp, train, new


def tree_model(table, algorithm, path):
    """A global tree from the ICDTA4FL pipeline on two sites' rows, carrying the schema, saved as the job does."""
    from treeflare.icdta4fl.encoding import category_names, encode, feature_space
    from treeflare.flare.icdta4fl.inprocess import run_in_process

    X, y = encode(table, algorithm), table.y_codes()
    names, kinds, n_cat = feature_space(table.schema, algorithm)
    cut = min(250, len(y) // 2 * 3 // 4)  # every site keeps validation rows, however small the table
    sites = [{"X_train": X[i::2][:cut], "y_train": y[i::2][:cut], "X_test": X[i::2][cut:],
              "y_test": y[i::2][cut:]} for i in range(2)]
    out = run_in_process(sites, algorithm=algorithm, classes=list(table.schema.classes), schema=table.schema,
                         feature_kinds=kinds,
                         feature_names=names, n_categories=n_cat,
                         category_names=category_names(table.schema, algorithm), local_params={"max_depth": 4})
    model = out["model"]
    model.set_data_schema(table.schema, algorithm)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    model.save_json(path)
    return model


def xgb_model(table, path, feature_prefixes=None):
    """An XGBoost model on the job's encoding (schema codes, categorical columns declared 'c'), schema attached."""
    from treeflare.xgb.encoding import dmatrix, table_arrays
    from treeflare.xgb.model import attach_schema
    from treeflare.xgb.params import make_params

    a = table_arrays(table)
    if feature_prefixes:  # the feature names of a column-split (vertical) model: "<rank>.<name>"
        a.feature_names = [f"{r}.{n}" for r, n in zip(feature_prefixes, a.feature_names)]
    booster = xgb.train(make_params(len(table.schema.classes), max_depth=3), dmatrix(a), 5)
    attach_schema(booster, table.schema, "vertical" if feature_prefixes else "horizontal",
                  {"site-1": 0, "site-2": 1} if feature_prefixes else None)
    booster.save_model(str(path))
    return booster


def encoded_xgb(table):
    from treeflare.xgb.encoding import dmatrix, table_arrays

    return dmatrix(table_arrays(table), with_label=False)


def read_out(path):
    return pd.read_csv(path, dtype={"id": str, "predicted": str})


@pytest.mark.parametrize("algorithm", ["cart", "id3"])
def test_icdta4fl_predictions_equal_the_model_on_encoded_rows(data, algorithm):
    from treeflare.icdta4fl.encoding import encode
    from treeflare.icdta4fl.export import explain_row

    tmp, train, new = data
    model = tree_model(train, algorithm, tmp / algorithm / "global_tree.json")
    summary = predict_csv(tmp / algorithm, new, tmp / f"{algorithm}.csv", explain=True)
    out = read_out(tmp / f"{algorithm}.csv")
    rows = features_table(read_raw(new), train.schema)
    X = encode(rows, algorithm)
    assert summary["kind"] == "icdta4fl" and summary["rows"] == 200
    assert list(out.columns) == ["id", "predicted", "p_high", "p_low", "p_mid", "explanation"]
    assert (out["id"] == [f"r{i}" for i in range(200)]).all()  # the schema's id column passed through
    assert (out["predicted"].to_numpy() == model.predict(X)).all()
    assert np.array_equal(out[["p_high", "p_low", "p_mid"]].to_numpy(), model.predict_proba(X))
    assert out["explanation"][3] == " and ".join(explain_row(model, X[3]))
    assert any(c in out["explanation"][0] for c in ("x0", "x1", "colour", "size"))


def test_xgb_predictions_equal_the_booster_on_encoded_rows(data):
    tmp, train, new = data
    booster = xgb_model(train, tmp / "xgb_model.json")
    predict_script.main(["--model", str(tmp / "xgb_model.json"), "--csv", str(new), "--out", str(tmp / "x.csv")])
    out = read_out(tmp / "x.csv")
    expected = booster.predict(encoded_xgb(features_table(read_raw(new), train.schema)))
    assert list(out.columns) == ["id", "predicted", "p_high", "p_low", "p_mid"]
    assert np.allclose(out[["p_high", "p_low", "p_mid"]].to_numpy(), expected, rtol=0, atol=1e-7)
    assert (out["predicted"] == np.asarray(train.schema.classes)[expected.argmax(1)]).all()
    assert (out["predicted"] == read_out(new)["label"]).mean() > 0.8  # and they are good predictions
    # rows without the id column (and without the label): predictions in row order, no id column
    read_raw(new).drop(columns=["id", "label"]).to_csv(tmp / "no_id.csv", index=False)
    predict_csv(tmp / "xgb_model.json", tmp / "no_id.csv", tmp / "no_id_out.csv")
    plain = read_out(tmp / "no_id_out.csv")
    assert list(plain.columns) == ["predicted", "p_high", "p_low", "p_mid"]
    assert plain.equals(out.drop(columns=["id"]))


def test_unknown_category_and_missing_value_behave_as_in_training(data):
    """An unseen colour and a blank number are NaN for XGBoost (default branch); for CART the unseen colour is
    no known category (every one-hot column 0) and for ID3 a missing code: what training would do with them."""
    from treeflare.icdta4fl.encoding import encode

    tmp, train, _ = data
    odd = tmp / "odd.csv"
    odd.write_text("label,colour,x1,size,x0,id,notes\n,purple,0.3,M,,a,anything\n,red,,L,1.5,b,\nhigh,,-2,S,0.1,c,x\n")
    raw = read_raw(odd)
    rows = features_table(raw, train.schema)
    assert np.isnan(rows.codes()[0][0, [0, 2]]).all()  # x0 blank, colour unseen
    booster = xgb_model(train, tmp / "odd_xgb.json")
    proba = load_model(tmp / "odd_xgb.json").model.predict_proba(raw)
    assert np.allclose(proba, booster.predict(encoded_xgb(rows)), atol=1e-7)
    for algorithm in ("cart", "id3"):
        model = tree_model(train, algorithm, tmp / f"odd_{algorithm}.json")
        predict_csv(tmp / f"odd_{algorithm}.json", odd, tmp / "odd_out.csv")
        out = read_out(tmp / "odd_out.csv")
        assert list(out["id"]) == ["a", "b", "c"]
        assert (out["predicted"].to_numpy() == model.predict(encode(rows, algorithm))).all()


def run_main(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        predict_script.main([str(a) for a in args])
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_bad_input_names_file_column_and_line_and_writes_nothing(data, capsys):
    tmp, train, new = data
    xgb_model(train, tmp / "m.json")
    out = tmp / "keep.csv"
    out.write_text("earlier results\n")
    raw = read_raw(new)
    cases = {
        "no_x1.csv": (raw.drop(columns=["x1"]), "missing column(s) ['x1']"),
        "text.csv": (raw.assign(x0=["oops" if i == 4 else v for i, v in enumerate(raw["x0"])]),
                     "column 'x0', line 6: 'oops' is not a number"),
        "level.csv": (raw.assign(size=["XL" if i == 0 else v for i, v in enumerate(raw["size"])]),
                      "column 'size', line 2: 'XL' is not one of the levels S < M < L"),
    }
    for name, (frame, message) in cases.items():
        frame.to_csv(tmp / name, index=False)
        err = run_main(capsys, "--model", tmp / "m.json", "--csv", tmp / name, "--out", out)
        assert message in err and name in err, err
    (tmp / "empty.csv").write_text("")
    assert "empty.csv: file is empty" in run_main(capsys, "--model", tmp / "m.json", "--csv", tmp / "empty.csv",
                                                  "--out", out)
    (tmp / "dup.csv").write_text("x0,x0\n1,2\n")
    assert "duplicate column name" in run_main(capsys, "--model", tmp / "m.json", "--csv", tmp / "dup.csv",
                                               "--out", out)
    assert "'nope' not found" in run_main(capsys, "--model", tmp / "m.json", "--csv", new, "--out", out,
                                          "--id", "nope")
    assert "--explain shows an ICDTA4FL tree" in run_main(capsys, "--model", tmp / "m.json", "--csv", new,
                                                          "--out", out, "--explain")
    assert "is the input CSV" in run_main(capsys, "--model", tmp / "m.json", "--csv", new, "--out", new)
    assert out.read_text() == "earlier results\n"  # nothing half-written, nothing lost
    assert not [p for p in tmp.iterdir() if p.name.startswith(".keep.csv")]  # no temporary file left


def test_model_files_and_folders(data, capsys, tmp_path):
    tmp, train, new = data
    booster = xgb_model(train, tmp_path / "model.json")
    both = tmp_path / "both"
    both.mkdir()
    (both / "model.json").write_bytes((tmp_path / "model.json").read_bytes())
    (both / "global_tree.json").write_text("{}")
    assert "holds both" in run_main(capsys, "--model", both, "--csv", new, "--out", tmp_path / "o.csv")
    assert "no model in this folder" in run_main(capsys, "--model", tmp, "--csv", new, "--out", tmp_path / "o.csv")
    (tmp_path / "junk.json").write_text('{"hello": 1}')
    assert "not an XGBoost model" in run_main(capsys, "--model", tmp_path / "junk.json", "--csv", new, "--out",
                                              tmp_path / "o.csv")
    # a model without the schema attribute: --schema, or the workspace's federation/partition.json
    bare = tmp_path / "ws"
    (bare / "federation").mkdir(parents=True)
    booster.set_attr(treeflare=None)
    booster.save_model(str(bare / "model.json"))
    assert "carries no schema" in run_main(capsys, "--model", bare, "--csv", new, "--out", tmp_path / "o.csv")
    import json

    (tmp_path / "schema.json").write_text(json.dumps(train.schema.to_dict()))
    predict_csv(bare, new, tmp_path / "a.csv", schema=tmp_path / "schema.json")
    (bare / "federation" / "partition.json").write_text(json.dumps({"schema": train.schema.to_dict()}))
    predict_csv(bare, new, tmp_path / "b.csv")
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    # a schema that does not fit the model is refused, naming the file
    other = load_csv(write_rows(tmp_path / "t2.csv"), label="label", id_column="id")  # size categorical here
    (tmp_path / "other.json").write_text(json.dumps(other.schema.to_dict()))
    (bare / "federation" / "partition.json").unlink()
    err = run_main(capsys, "--model", bare, "--csv", new, "--out", tmp_path / "o.csv", "--schema",
                   tmp_path / "other.json")
    assert "feature types" in err and "model.json" in err


def test_schema_survives_xgboost_load_and_save(data, tmp_path):
    from treeflare.xgb.model import XGBModel, save_with_schema

    _, train, new = data
    booster = xgb_model(train, tmp_path / "src.json")
    booster.set_attr(treeflare=None)
    booster.save_model(str(tmp_path / "plain.json"))
    save_with_schema(tmp_path / "plain.json", tmp_path / "with.json", train.schema)
    again = xgb.Booster(model_file=str(tmp_path / "with.json"))
    again.save_model(str(tmp_path / "again.ubj"))  # plain XGBoost load + save (UBJSON) keeps the attribute
    model = XGBModel.load(tmp_path / "again.ubj")
    assert model.data_schema == train.schema and model.mode == "horizontal"
    d = encoded_xgb(features_table(read_raw(new), train.schema))
    assert np.array_equal(again.predict(d), booster.predict(d))


def test_vertical_model_needs_every_party_column(data, capsys, tmp_path):
    tmp, train, new = data
    xgb_model(train, tmp_path / "v.json", feature_prefixes=[0, 0, 1, 1])
    model = load_model(tmp_path / "v.json").model
    assert model.mode == "vertical"
    proba = model.predict_proba(read_raw(new))  # every party's columns of each row: predictions as usual
    assert proba.shape == (200, 3) and np.allclose(proba.sum(1), 1)
    assert predict_script.main(["--model", str(tmp_path / "v.json"), "--csv", str(new), "--out",
                                str(tmp_path / "o.csv")]) == 0
    raw = read_raw(new).drop(columns=["colour", "size"])
    raw.to_csv(tmp_path / "one_party.csv", index=False)
    err = run_main(capsys, "--model", tmp_path / "v.json", "--csv", tmp_path / "one_party.csv", "--out",
                   tmp_path / "o.csv")
    assert "'colour' held by site-2 (rank 1)" in err and "jobs/vertical_tree" in err


def test_script_as_a_subprocess(data, tmp_path):
    tmp, train, new = data
    tree_model(train, "cart", tmp_path / "global_tree.json")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tmp_path), "--csv", str(new), "--out",
                           str(tmp_path / "p.csv"), "--id", "x0", "--explain"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "200 predictions written to" in proc.stdout and "ICDTA4FL global tree" in proc.stdout
    out = pd.read_csv(tmp_path / "p.csv")
    assert list(out.columns)[:2] == ["x0", "predicted"] and len(out) == 200


@pytest.mark.parametrize("algorithm", ["cart", "id3"])
def test_a_model_file_of_version_1_reads_and_predicts_as_it_did(algorithm, tmp_path):
    """Version 1 files named the learner as their encoding ("cart", "id3"); version 2 names the encoding. A version 1
    file still loads, predicts the same rows alike, and is written back as version 2 with the encoding's name."""
    import json

    from treeflare.icdta4fl.model import GlobalTree

    table = load_dataset("car")
    model = tree_model(table, algorithm, tmp_path / "model.json")
    new = model.to_dict()
    assert new["version"] == 2 and new["encoding"] == {"cart": "one_hot", "id3": "category_codes"}[algorithm]
    old = {**json.loads(json.dumps(new)), "version": 1, "encoding": algorithm}
    back = GlobalTree.from_dict(old)
    frame = table.frame.head(200)
    assert np.array_equal(back.predict_proba(frame), model.predict_proba(frame))
    assert back.to_dict() == new
